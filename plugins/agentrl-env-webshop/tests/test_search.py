"""The BM25 search: analyzer, Lucene BM25 scores by hand, top 50, ties and the disk cache."""

from __future__ import annotations

import math

from agentrl_env_webshop.search import K1, TOP_N, B, SearchIndex, analyze, product_document


def test_analyzer_is_lucene_like():
    assert analyze("Men's Walking Shoes, size 7.5 and the X-Large") == ["men", "walk", "shoe", "size", "7.5", "x", "larg"]
    assert analyze("the of and") == []


def test_bm25_scores_match_the_lucene_formula():
    docs = ["red shoe", "blue shoe shoe", "red hat", "green scarf"]
    index = SearchIndex.build(["d0", "d1", "d2", "d3"], docs)
    n, avgdl = 4, (2 + 3 + 2 + 2) / 4

    def term(tf, df, dl):
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        return idf * tf / (tf + K1 * (1 - B + B * dl / avgdl))

    scores = index._retriever.get_scores(["red", "shoe"])
    expected = [term(1, 2, 2) + term(1, 2, 2), term(2, 2, 3), term(1, 2, 2), 0.0]
    assert [round(float(s), 5) for s in scores] == [round(e, 5) for e in expected]
    assert index.search("red shoes") == ["d0", "d1", "d2"]  # d3 has no query term: not a hit
    assert index.search("unknownword") == [] and index.search("") == []


def test_top_50_and_ties_in_catalog_order():
    ids = [f"a{i:03d}" for i in range(80)]
    index = SearchIndex.build(ids, ["cotton towel"] * 80)
    hits = index.search("towel")
    assert len(hits) == TOP_N and hits == ids[:TOP_N]


def test_index_is_cached_on_disk(tmp_path):
    docs = {"x1": "wool socks", "x2": "cotton socks", "x3": "lamp"}
    first = SearchIndex.build(list(docs), list(docs.values()), tmp_path)
    second = SearchIndex.build(list(docs), list(docs.values()), tmp_path)
    assert not first.loaded_from_cache and second.loaded_from_cache
    assert second.search("wool socks") == first.search("wool socks") == ["x1", "x2"]
    changed = SearchIndex.build(list(docs), ["wool socks", "cotton socks", "brass lamp"], tmp_path)
    assert not changed.loaded_from_cache  # other documents, other key


def test_product_document_is_upstreams_text(bundled_env):
    product = next(p for p in bundled_env.shop.products if p["options"])
    doc = product_document(product)
    assert doc.startswith(product["Title"].lower() + " " + product["Description"].lower())
    group, values = next(iter(product["options"].items()))
    assert f"{group}: {', '.join(values)}".lower() in doc
