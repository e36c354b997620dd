"""Scoring as upstream AgentBench (``dbbench/result_processor.py``, FC main branch).

SELECT-type answers: both sides are normalized (None/null/nan/inf/empty -> "0", a trailing
percent sign dropped, thousands separators removed); one value each: equal, both "0", or
floats within 0.01; several: when all are floats, a one-to-one match within 0.01, else
set equality. INSERT/UPDATE/DELETE: the MD5 over the whole table (below) must equal the
stored ``answer_md5``.

The table hash is upstream's SQL
``md5(group_concat(rowhash order by rowhash))`` over
``substring(md5(concat_ws(',', <columns>)), 1, 5)``, which :func:`table_hash` recomputes
in Python for the SQLite backend (with MySQL 8's default ``group_concat_max_len`` of 1024).

Upstream parses strings with ``eval``; this module uses :func:`ast.literal_eval`, which
accepts the same literals (the only strings parsed here are stored hashes and labels).
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from agentrl_env_db.tasks import MODIFY_TYPES

GROUP_CONCAT_MAX_LEN = 1024  # MySQL 8's default, which upstream's mysql:8 server used

_SPECIAL = {
    "none": "0",
    "null": "0",
    "undefined": "0",
    "nan": "0",
    "inf": "0",
    "infinity": "0",
    "-inf": "0",
    "-infinity": "0",
    "": "0",
}


def normalize_value(value: Any) -> str:
    """Upstream ``_normalize_special_values``."""
    if value is None:
        return "0"
    text = str(value).strip()
    if text.endswith("%"):
        return text[:-1].strip()  # upstream returns here: no separator or special handling
    if "," in text and not text.startswith("[") and not text.endswith("]"):
        text = text.replace(",", "")
    return _SPECIAL.get(text.lower(), text)


def _strip_quotes(value: Any) -> str:
    return str(value).strip().strip("'\"")


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _NOT_LITERAL


_NOT_LITERAL = object()


def _clean_mysql_result(result: Any) -> list[str] | None:
    """Upstream ``_clean_mysql_result``: a string such as ``[('x',), ('y',)]``."""
    if not (isinstance(result, str) and result.startswith("[") and result.endswith("]")):
        return None
    parsed = _literal(result)
    if isinstance(parsed, list) and all(isinstance(item, tuple) for item in parsed):
        # Upstream keeps one-value tuples only.
        return [_strip_quotes(item[0]) for item in parsed if len(item) == 1]
    inner = result.strip("[]")
    if inner.count("(") == 1 and inner.startswith("(") and inner.endswith(",)"):
        return [inner[1:-2].strip().strip("'\"")]
    return None


def clean_answer(answer: Any) -> list[str]:
    """Upstream ``_clean_answer``: any answer -> a list of normalized strings."""
    if answer is None:
        return ["0"]
    mysql = _clean_mysql_result(answer)
    if mysql is not None:
        return [normalize_value(x) for x in mysql]
    if isinstance(answer, str):
        answer = answer.strip()
        if answer.startswith("[") and answer.endswith("]"):
            parsed = _literal(answer)
            if isinstance(parsed, list):
                return [normalize_value(_strip_quotes(_one(item))) for item in parsed]
            return _split_list_text(answer[1:-1])
        return [normalize_value(_strip_quotes(answer))]
    if isinstance(answer, list | tuple):
        return [normalize_value(_strip_quotes(_one(item))) for item in answer]
    return [normalize_value(_strip_quotes(answer))]


def _one(item: Any) -> Any:
    return item[0] if isinstance(item, tuple) and len(item) == 1 else item


def _split_list_text(text: str) -> list[str]:
    """Upstream's manual split of a list-looking string that ``eval`` rejected."""
    items, current, in_quotes = [], "", False
    for char in text:
        if char in "\"'":
            in_quotes = not in_quotes
        elif char == "," and not in_quotes:
            if current:
                items.append(normalize_value(_strip_quotes(current)))
                current = ""
        else:
            current += char
    if current:
        items.append(normalize_value(_strip_quotes(current)))
    return items


def is_float(value: Any) -> bool:
    try:
        float(value)
    except (ValueError, TypeError, OverflowError):
        return False
    return True


def float_equal(a: Any, b: Any, tol: float = 1e-2) -> bool:
    try:
        return abs(float(a) - float(b)) <= tol
    except (ValueError, TypeError, OverflowError):
        return False


def compare_results(answer: Any, ground_truth: Any, query_type: str) -> bool:
    """Upstream ``compare_results``: is ``answer`` correct for a task of ``query_type``?"""
    got = clean_answer(answer)
    want = clean_answer(ground_truth)
    if query_type in MODIFY_TYPES:
        return got == want
    if len(got) == 1 and len(want) == 1:
        a, b = got[0], want[0]
        if a == "0" and b == "0":
            return True
        if is_float(a) and is_float(b):
            return float_equal(a, b)
        return a == b
    if all(is_float(x) for x in got) and all(is_float(x) for x in want):
        if len(got) != len(want):
            return False
        matched = [False] * len(want)
        for a in got:
            for i, b in enumerate(want):
                if not matched[i] and float_equal(a, b):
                    matched[i] = True
                    break
            else:
                return False
        return all(matched)
    return set(got) == set(want)


# ---------------------------------------------------------------------------------------
# Table hashes


def row_hash(row: Sequence[Any]) -> str:
    """``substring(md5(concat_ws(',', cols)), 1, 5)``: NULLs are skipped as CONCAT_WS does."""
    text = ",".join(_sql_text(v) for v in row if v is not None)
    return hashlib.md5(text.encode("utf-8")).hexdigest()[:5]


def _sql_text(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def table_hash(rows: Iterable[Sequence[Any]], max_len: int = GROUP_CONCAT_MAX_LEN) -> str | None:
    """``md5(group_concat(rowhash order by rowhash))``; None (SQL NULL) for an empty table."""
    hashes = sorted(row_hash(r) for r in rows)
    if not hashes:
        return None
    joined = ",".join(hashes)[:max_len]
    return hashlib.md5(joined.encode("ascii")).hexdigest()


def combine_hashes(hashes: Iterable[str | None]) -> str:
    """Upstream joins the per-table hash strings (``None`` prints as 'None') sorted with '_'."""
    return "_".join(sorted("None" if h is None else h for h in hashes))
