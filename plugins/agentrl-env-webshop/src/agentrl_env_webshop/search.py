"""BM25 search over the catalog, as WebShop's Lucene index does it, built once and cached.

Upstream indexes, per product, ``title + description + first bullet point + option text``
(lower-cased) with Pyserini/Lucene defaults: BM25 with k1 = 0.9, b = 0.4, Lucene's English
analyzer (stop words, possessive removal, Porter stemming), and returns the top 50 hits.
Here the same text goes through an analyzer written to match (Unicode word tokens, numbers
like ``7.5`` kept whole, Lucene's 33 English stop words, ``'s`` removed, Porter stemming by
PyStemmer) into a ``bm25s`` index with ``method="lucene"``. Ties are broken by catalog order
(Lucene breaks them by document id). Differences from Lucene: no lossy length encoding and
UAX#29 tokenization approximated by a regular expression.

Indexes are cached on disk under a key made of the documents' sha256 and the analyzer
version, so a worker restart loads instead of rebuilding.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

K1 = 0.9
B = 0.4
TOP_N = 50
ANALYZER_VERSION = "1"

# Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET.
STOP_WORDS = frozenset(
    ["a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it", "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these", "they", "this", "to", "was", "will", "with"]
)
_TOKEN = re.compile(r"\d+(?:[.,]\d+)+|\w+(?:['’]\w+)*", re.UNICODE)

_stemmer_local = threading.local()


def _stemmer() -> Any:
    stemmer = getattr(_stemmer_local, "stemmer", None)
    if stemmer is None:
        import Stemmer

        stemmer = _stemmer_local.stemmer = Stemmer.Stemmer("porter")
    return stemmer


def analyze(text: str) -> list[str]:
    """Lucene-style English analysis: tokens, lower case, possessives and stop words out, stems."""
    tokens = []
    for match in _TOKEN.finditer(text.lower()):
        token = match.group(0)
        if token.endswith(("'s", "’s")):
            token = token[:-2]
        token = token.replace("’", "'")
        if token and token not in STOP_WORDS:
            tokens.append(token)
    return _stemmer().stemWords(tokens) if tokens else []


def product_document(product: dict[str, Any]) -> str:
    """The text upstream indexes for one product (``convert_product_file_format.py``)."""
    option_texts = [f"{name}: {', '.join(values)}" for name, values in product.get("options", {}).items()]
    bullets = product.get("BulletPoints") or [""]
    return " ".join([product["Title"], product["Description"], bullets[0] if bullets else "", ", and ".join(option_texts)]).lower()


class SearchIndex:
    """A BM25 index over documents identified by ``ids`` (ASINs)."""

    def __init__(self, retriever: Any, ids: Sequence[str], build_seconds: float = 0.0, loaded_from_cache: bool = False):
        self._retriever = retriever
        self.ids = list(ids)
        self.build_seconds = build_seconds
        self.loaded_from_cache = loaded_from_cache

    @classmethod
    def build(cls, ids: Sequence[str], documents: Iterable[str], cache_dir: str | os.PathLike | None = None) -> SearchIndex:
        """Build (or load from ``cache_dir``) the index of ``documents``."""
        import bm25s

        ids = list(ids)
        documents = list(documents)
        if len(documents) != len(ids):
            raise ValueError(f"{len(ids)} ids but {len(documents)} documents")
        started = time.perf_counter()
        target = Path(cache_dir) / f"bm25-{_cache_key(ids, documents)}" if cache_dir else None
        if target is not None and (target / "ids.json").exists():
            try:
                retriever = bm25s.BM25.load(str(target), mmap=True, show_progress=False)
                if json.loads((target / "ids.json").read_text()) == ids:
                    log.info("loaded the WebShop BM25 index from %s", target)
                    return cls(retriever, ids, time.perf_counter() - started, loaded_from_cache=True)
                log.warning("the BM25 cache %s lists other documents; rebuilding", target)
            except Exception as exc:  # a corrupt cache is rebuilt, and said so
                log.warning("ignoring the unreadable BM25 cache %s (%s); rebuilding", target, exc)
        corpus = [analyze(doc) for doc in documents]
        retriever = bm25s.BM25(k1=K1, b=B, method="lucene")
        retriever.index(corpus, show_progress=False)
        if target is not None:
            _save_atomically(retriever, ids, target)
        return cls(retriever, ids, time.perf_counter() - started)

    def search(self, query: str, k: int = TOP_N) -> list[str]:
        """The ids of the top ``k`` documents with a positive score, best first."""
        tokens = [t for t in analyze(query) if t in self._retriever.vocab_dict]
        if not tokens:
            return []
        scores = np.asarray(self._retriever.get_scores(tokens))
        hits = np.flatnonzero(scores > 0)
        if hits.size == 0:
            return []
        if hits.size > k:
            # Keep every document tied with the k-th best, then order by (score desc, id order).
            threshold = np.partition(scores[hits], hits.size - k)[hits.size - k]
            hits = hits[scores[hits] >= threshold]
        order = np.lexsort((hits, -scores[hits]))
        return [self.ids[i] for i in hits[order][:k]]


def _cache_key(ids: Sequence[str], documents: Sequence[str]) -> str:
    h = hashlib.sha256()
    h.update(f"analyzer={ANALYZER_VERSION};k1={K1};b={B}\n".encode())
    for doc_id, text in zip(ids, documents, strict=True):
        h.update(doc_id.encode())
        h.update(b"\t")
        h.update(text.encode())
        h.update(b"\n")
    return h.hexdigest()[:24]


def _save_atomically(retriever: Any, ids: Sequence[str], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".bm25-", dir=target.parent))
    try:
        retriever.save(str(tmp), show_progress=False)
        (tmp / "ids.json").write_text(json.dumps(list(ids)))
        try:
            tmp.rename(target)
        except OSError:  # another worker finished first: its copy is identical
            shutil.rmtree(tmp, ignore_errors=True)
    except Exception as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        log.warning("could not cache the BM25 index in %s (%s); it will be rebuilt next time", target, exc)
