"""The few MySQL behaviours the SQLite backend imitates, so both backends score alike.

* :func:`mysql_ci`: a collation comparing text as MySQL's ``utf8mb4_*_ci`` collations do
  for practical purposes: case- and accent-insensitive, trailing spaces ignored.
* :func:`translate_literals`: MySQL string literals (``'...'`` and, with ``sql_mode=''``,
  ``"..."``) with backslash escapes (``\\n``, ``\\'``, ...) rewritten as SQLite literals.
* :func:`translate` also: names that start with a digit (``1952_British_Grand_Prix_0``) quoted;
  a reserved word of MySQL 8 used as a name (``WHERE Rank = 23``) refused with MySQL's syntax
  error; a decimal stored into a column (``SET x = 7.500``, ``VALUES (7.500)``) stored with
  MySQL's text ``'7.500'``; a column compared with a number compared as numbers (``'42.' = 42``)
  through :func:`mysql_num`.
* ``md5``, ``concat``, ``concat_ws`` and ``mysql_num`` functions.

Everything else is SQLite's own dialect (no ``SHOW TABLES``, SQLite's number formatting of
computed values); the README lists the differences measured.
"""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
from typing import Any

import attrs

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


class MySQLSyntaxError(Exception):
    """A statement MySQL 8 refuses to parse; ``str()`` is MySQL's message as upstream's driver prints it."""


# Words reserved in MySQL 8.0 that SQLite takes as plain names, so that as a column name or alias
# (unquoted) they are a syntax error on MySQL only: std/dev tables have columns named Rank (34
# tasks), Int, Dec, Character, Match, Release and System. The window-function names and SYSTEM
# are reserved since MySQL 8.0 (MariaDB 10.11 accepts them; upstream ran mysql:8); the others on
# both servers. Expression keywords (CURRENT_DATE, DEFAULT, ...) are not here: they stand where a
# name could.
MYSQL8_RESERVED_NAMES = frozenset({
    "RANK", "DENSE_RANK", "ROW_NUMBER", "PERCENT_RANK", "CUME_DIST", "NTILE", "LEAD", "LAG", "FIRST_VALUE",
    "LAST_VALUE", "NTH_VALUE", "SYSTEM", "RELEASE", "MATCH", "INT", "DEC", "CHARACTER",
})
_TYPE_NAMES = frozenset({"INT", "DEC", "CHARACTER"})  # column types too: left alone in DDL and after AS
_COMPARISONS = frozenset({"=", "<>", "!=", "<", ">", "<=", ">=", "<=>"})
# A reserved word is used as a name (and refused) when one of these stands next to it.
_NAME_BEFORE = _COMPARISONS | {"SELECT", "BY", "WHERE", "AND", "OR", "SET", "ON", "HAVING", ",", "AS", "DISTINCT"}
_NAME_AFTER = _COMPARISONS | {"IS", "IN", "LIKE", "BETWEEN", "FROM", "ASC", "DESC", ",", ")", ";", ""}
_QUERIES = frozenset({"SELECT", "UPDATE", "DELETE", "INSERT", "REPLACE", "WITH", "("})  # where comparisons are
_SET_END = frozenset({"WHERE", "ORDER", "LIMIT", ";", ""})
# Words that stand before a comparison without being a column.
_NOT_COLUMNS = frozenset({"AND", "OR", "NOT", "XOR", "WHERE", "ON", "HAVING", "WHEN", "THEN", "ELSE", "CASE", "END",
                          "NULL", "SELECT", "SET", "LIMIT", "BY", "IS", "IN", "BETWEEN", "LIKE", "AS", "TRUE",
                          "FALSE", "ALL", "ANY", "SOME", "EXISTS", "CURRENT_DATE", "CURRENT_TIME",
                          "CURRENT_TIMESTAMP"})

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<comment>--[^\n]*|\#[^\n]*|/\*.*?(?:\*/|\Z))
  | (?P<quote>['"])
  | (?P<ident>`(?:[^`]|``)*`)
  | (?P<number>(?:0[xX][0-9a-fA-F]+|0[bB][01]+|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)(?![\w$]))
  | (?P<digitname>\d+[A-Za-z_$][\w$]*)
  | (?P<word>[A-Za-z_$@\u0080-\uffff][\w$\u0080-\uffff]*)
  | (?P<op><=>|<=|>=|<>|!=|==|.)
""", re.VERBOSE | re.DOTALL)
_DECIMAL = re.compile(r"(\d*)\.(\d+)")


@attrs.frozen
class _Token:
    kind: str  # ws, comment, string, ident, number, digitname, word, op
    text: str  # in SQLite's dialect
    start: int  # offset in the statement as written

    @property
    def key(self) -> str:
        return self.text.upper() if self.kind == "word" else self.text


def _tokens(sql: str) -> list[_Token] | None:
    out: list[_Token] = []
    i = 0
    while i < len(sql):
        m = _TOKEN.match(sql, i)
        kind, text = m.lastgroup, m.group()
        if kind == "quote":
            parsed = _read_literal(sql, i)
            if parsed is None:
                return None  # unterminated: SQLite rejects the statement as written
            value, end = parsed
            out.append(_Token("string", "'" + value.replace("'", "''") + "'", i))
            i = end
            continue
        if kind == "comment" and text.startswith("#"):
            text = "--" + text[1:]
        out.append(_Token(kind, text, i))
        i = m.end()
    return out


def _syntax_error(sql: str, start: int) -> MySQLSyntaxError:
    near = sql[start:start + 80]
    line = sql.count("\n", 0, start) + 1
    return MySQLSyntaxError(
        "1064 (42000): You have an error in your SQL syntax; check the manual that corresponds to your MySQL "
        f"server version for the right syntax to use near '{near}' at line {line}"
    )


def _decimal_text(sign: str, literal: str) -> str | None:
    """What MySQL stores in a TEXT column for a DECIMAL literal: its digits as written (``7.500``
    stays ``7.500``) without leading zeros; SQLite would store the REAL's text (``7.5``)."""
    m = _DECIMAL.fullmatch(literal)
    if m is None:
        return None
    return ("-" if sign == "-" else "") + f"{m.group(1).lstrip('0') or '0'}.{m.group(2)}"


def translate(sql: str) -> str:
    """One MySQL statement in SQLite's dialect, as far as this module imitates MySQL: string
    literals, names starting with a digit, decimals stored into columns, text compared with
    numbers (see the module docstring). Raises :class:`MySQLSyntaxError` where MySQL 8 refuses a
    reserved word used as a name."""
    tokens = _tokens(sql)
    if tokens is None:
        return sql
    sig = [t for t in tokens if t.kind not in ("ws", "comment")]
    keys = [t.key for t in sig]

    def at(j: int) -> str:
        return keys[j] if 0 <= j < len(keys) else ""

    ddl = at(0) in ("CREATE", "ALTER")
    assigns = _assignments(keys)
    replace: dict[int, str] = {}  # index in sig -> new text
    depth, values_depth = 0, None  # paren depth; that of an INSERT's VALUES rows
    for j, token in enumerate(sig):
        key = token.key
        if key == "(":
            depth += 1
        elif key == ")":
            depth -= 1
        elif key in ("VALUES", "VALUE") and depth == 0:
            values_depth = 1
        if token.kind == "digitname":
            replace[j] = f"`{token.text}`"  # MySQL names may start with a digit (1952_British_Grand_Prix_0)
        elif token.kind == "word" and key in MYSQL8_RESERVED_NAMES and at(j - 1) != "." and at(j + 1) != "(":
            type_use = key in _TYPE_NAMES and (ddl or at(j - 1) == "AS")
            if not type_use and (at(j - 1) in _NAME_BEFORE or at(j + 1) in _NAME_AFTER):
                raise _syntax_error(sql, token.start)
        elif token.kind == "number":
            sign = at(j - 1) if at(j - 1) in ("-", "+") else ""
            before = j - 2 if sign else j - 1
            stored = values_depth == depth and at(before) in ("(", ",") and at(j + 1) in (",", ")")
            assigned = before in assigns and at(j + 1) in _SET_END | {","}
            text = _decimal_text(sign, token.text) if stored or assigned else None
            if text is not None:
                replace[j] = f"'{text}'"
                if sign:
                    replace[j - 1] = ""
    if at(0) in _QUERIES:
        _compare_as_numbers(sig, keys, assigns, replace)
    index = {t.start: j for j, t in enumerate(sig)}
    return "".join(replace.get(index[t.start], t.text) if t.start in index else t.text for t in tokens)


def _assignments(keys: list[str]) -> set[int]:
    """Indices of the ``=`` that assign in a ``SET`` list of UPDATE or INSERT (or ``ON DUPLICATE
    KEY UPDATE``), as opposed to those that compare."""
    out: set[int] = set()
    depth, active = 0, False
    for j, key in enumerate(keys):
        if key == "(":
            depth += 1
        elif key == ")":
            depth -= 1
        elif depth == 0 and key in ("SET", "UPDATE") and j > 0:
            active = True
        elif depth == 0 and key in _SET_END:
            active = False
        elif active and depth == 0 and key == "=":
            out.add(j)
    return out


def _compare_as_numbers(sig: list[_Token], keys: list[str], assigns: set[int], replace: dict[int, str]) -> None:
    """MySQL compares a text column with a number as numbers (``'42.' = 42``, ``'10' > 9``,
    ``'abc' = 0``); SQLite compares it as text. In ``name <op> number``, ``number <op> name``,
    ``name [NOT] IN (numbers)`` and ``name [NOT] BETWEEN number AND number`` the name becomes
    ``mysql_num(name)``, MySQL's reading of a value as a number."""
    n = len(sig)

    def key(j: int) -> str:
        return keys[j] if 0 <= j < n else ""

    def number_end(j: int) -> int | None:  # a number, maybe signed, starting at j: its last index
        if key(j) in ("-", "+"):
            j += 1
        return j if j < n and sig[j].kind == "number" else None

    def is_name(j: int) -> bool:
        return 0 <= j < n and (sig[j].kind == "ident" or (
            sig[j].kind == "word" and keys[j] not in _NOT_COLUMNS and not keys[j].startswith("@")))

    def name_before(end: int) -> int | None:  # first index of a (qualified) column name ending at end
        j = end
        while is_name(j) and key(j - 1) == "." and is_name(j - 2):
            j -= 2
        return j if is_name(j) and key(j - 1) != "." else None

    def name_after(first: int) -> int | None:  # last index of a (qualified) column name starting at first
        j = first
        while is_name(j) and key(j + 1) == "." and is_name(j + 2):
            j += 2
        return j if is_name(first) and key(j + 1) not in ("(", ".") else None

    def wrap(first: int, last: int) -> None:
        if any(j in replace for j in range(first, last + 1)):
            return
        replace[first] = "mysql_num(" + sig[first].text
        replace[last] = replace.get(last, sig[last].text) + ")"

    for j in range(1, n):
        if keys[j] in _COMPARISONS and j not in assigns:
            first = name_before(j - 1)
            if first is not None and number_end(j + 1) is not None:
                wrap(first, j - 1)
            elif sig[j - 1].kind == "number":
                last = name_after(j + 1)
                if last is not None:
                    wrap(j + 1, last)
        elif keys[j] in ("IN", "BETWEEN"):
            name_end = j - 2 if key(j - 1) == "NOT" else j - 1
            first = name_before(name_end)
            if first is None:
                continue
            if keys[j] == "BETWEEN":
                low = number_end(j + 1)
                if low is not None and key(low + 1) == "AND" and number_end(low + 2) is not None:
                    wrap(first, name_end)
            elif key(j + 1) == "(":
                k = j + 2
                while (end := number_end(k)) is not None and key(end + 1) == ",":
                    k = end + 2
                if end is not None and key(end + 1) == ")":
                    wrap(first, name_end)


_MYSQL_NUMBER = re.compile(r"[ \t\n\r]*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)")


def mysql_num(value: Any) -> Any:
    """A value as MySQL reads it in a numeric comparison: text by its longest numeric prefix
    (``'42.'`` -> 42.0, ``' 7.500'`` -> 7.5, ``'abc'`` -> 0.0), numbers and NULL as they are."""
    if value is None or isinstance(value, (int, float)):
        return value
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    m = _MYSQL_NUMBER.match(text)
    if m is None:
        return 0.0
    try:
        return float(m.group(1))
    except ValueError:  # an exponent past float's range
        return float("inf") if not m.group(1).startswith("-") else float("-inf")


translate_literals = translate  # the name before the dialect grew beyond literals


def concat(*args: Any) -> str | None:
    return None if any(a is None for a in args) else "".join(str(a) for a in args)


def concat_ws(sep: Any, *args: Any) -> str | None:
    return None if sep is None else str(sep).join(str(a) for a in args if a is not None)


def md5(value: Any) -> str | None:
    if value is None:
        return None
    data = value if isinstance(value, bytes) else str(value).encode("utf-8")
    return hashlib.md5(data).hexdigest()
