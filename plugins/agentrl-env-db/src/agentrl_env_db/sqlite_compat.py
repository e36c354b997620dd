"""The few MySQL behaviours the SQLite backend imitates, so both backends score alike.

* :func:`mysql_ci`: a collation comparing text as MySQL's ``utf8mb4_*_ci`` collations do
  for practical purposes: case- and accent-insensitive, trailing spaces ignored.
* :func:`translate_literals`: MySQL string literals (``'...'`` and, with ``sql_mode=''``,
  ``"..."``) with backslash escapes (``\\n``, ``\\'``, ...) rewritten as SQLite literals.
* ``md5``, ``concat`` and ``concat_ws`` functions.

Everything else is SQLite's own dialect (no ``SHOW TABLES``, text compared with numbers as
text, identifiers may not start with a digit); the README lists the differences measured.
"""

from __future__ import annotations

import functools
import hashlib
import unicodedata
from typing import Any

_ESCAPES = {"0": "\0", "b": "\b", "n": "\n", "r": "\r", "t": "\t", "Z": "\x1a", "%": "\\%", "_": "\\_"}


@functools.lru_cache(maxsize=65536)
def fold(value: str) -> str:
    """MySQL ``_ci`` equality key: no case, no accents, no trailing spaces."""
    decomposed = unicodedata.normalize("NFKD", value)
    return "".join(c for c in decomposed if not unicodedata.combining(c)).casefold().rstrip(" ")


def mysql_ci(a: str, b: str) -> int:
    ka, kb = fold(a), fold(b)
    return (ka > kb) - (ka < kb)


def _read_literal(sql: str, start: int) -> tuple[str, int] | None:
    """Parse a MySQL string literal starting at ``sql[start]`` (a quote); (value, end) or None."""
    quote = sql[start]
    out = []
    i = start + 1
    while i < len(sql):
        c = sql[i]
        if c == "\\" and i + 1 < len(sql):
            nxt = sql[i + 1]
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
        elif c == quote:
            if i + 1 < len(sql) and sql[i + 1] == quote:
                out.append(quote)
                i += 2
            else:
                return "".join(out), i + 1
        else:
            out.append(c)
            i += 1
    return None  # unterminated: leave the statement for SQLite to reject


def translate_literals(sql: str) -> str:
    if "\\" not in sql and '"' not in sql:
        return sql  # nothing MySQL-specific in its literals
    out = []
    i = 0
    while i < len(sql):
        c = sql[i]
        if c in "'\"":
            parsed = _read_literal(sql, i)
            if parsed is None:
                return sql
            value, i = parsed
            out.append("'" + value.replace("'", "''") + "'")
        elif c == "`":
            end = sql.find("`", i + 1)
            while end != -1 and sql[end + 1 : end + 2] == "`":
                end = sql.find("`", end + 2)
            if end == -1:
                return sql
            out.append(sql[i : end + 1])
            i = end + 1
        elif sql.startswith("--", i) or c == "#":
            end = sql.find("\n", i)
            end = len(sql) if end == -1 else end
            out.append("--" + sql[i + (2 if c == "-" else 1) : end])
            i = end
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            end = len(sql) if end == -1 else end + 2
            out.append(sql[i:end])
            i = end
        else:
            out.append(c)
            i += 1
    return "".join(out)


def concat(*args: Any) -> str | None:
    return None if any(a is None for a in args) else "".join(str(a) for a in args)


def concat_ws(sep: Any, *args: Any) -> str | None:
    return None if sep is None else str(sep).join(str(a) for a in args if a is not None)


def md5(value: Any) -> str | None:
    if value is None:
        return None
    data = value if isinstance(value, bytes) else str(value).encode("utf-8")
    return hashlib.md5(data).hexdigest()
