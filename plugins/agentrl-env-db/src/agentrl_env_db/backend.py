"""What the two backends share: the handle interface and the observation format.

An observation is upstream's ``str(rows)`` (a list of row tuples; ``[]`` for a statement
without rows) or the database's error text, cut at ``output_limit`` characters with
``[TRUNCATED]`` appended. :class:`RowCollector` builds exactly that string while reading
rows one batch at a time: it keeps only the rows the cut string needs and counts the rest
against the row and byte caps, so a huge result is never loaded.
"""

from __future__ import annotations

import abc
from typing import Any

from attrs import Factory, define, frozen

from agentrl_env_db.tasks import DBTask

TRUNCATED = "[TRUNCATED]"


def cut(text: str, limit: int) -> str:
    return text[:limit] + TRUNCATED if len(text) > limit else text


def timeout_text(seconds: float) -> str:
    return f"Error: SQL execution timed out after {seconds:g} s; the query was stopped."


@frozen
class QueryResult:
    text: str
    error: bool = False
    timed_out: bool = False
    capped: bool = False  # stopped reading at max_rows / max_bytes
    rows_read: int = 0


@define
class RowCollector:
    """Accumulate rows until the printed list is past ``limit`` characters or a cap is hit."""

    limit: int
    max_rows: int
    max_bytes: int
    parts: list[str] = Factory(list)
    length: int = 1  # the opening "["
    rows: int = 0
    nbytes: int = 0
    capped: bool = False

    @property
    def full(self) -> bool:
        """True once more rows cannot change the first ``limit`` characters."""
        return self.length > self.limit

    def add(self, row: tuple[Any, ...]) -> bool:
        """Take one row; False when a cap is reached and reading must stop."""
        self.rows += 1
        self.nbytes += sum(len(v) if isinstance(v, str | bytes | bytearray) else 8 for v in row)
        if not self.full:
            text = repr(tuple(row))
            self.length += len(text) + (2 if self.parts else 0)
            self.parts.append(text)
        if self.rows >= self.max_rows or self.nbytes >= self.max_bytes:
            self.capped = True
            return False
        return True

    def text(self) -> str:
        body = "[" + ", ".join(self.parts)
        if self.full:
            return body[: self.limit] + TRUNCATED
        if self.capped:
            return body + TRUNCATED
        return cut(body + "]", self.limit)


class Handle(abc.ABC):
    """One session's database: execute statements, hash tables, close (idempotent)."""

    @abc.abstractmethod
    async def execute(self, sql: str) -> QueryResult: ...

    @abc.abstractmethod
    async def table_hash(self) -> str:
        """Upstream's combined MD5 over every table of the task."""

    @abc.abstractmethod
    async def close(self) -> None: ...


class Backend(abc.ABC):
    name: str = ""

    @abc.abstractmethod
    async def create(self, task: DBTask) -> Handle:
        """A fresh database holding the task's tables, reachable only through the handle."""

    def live(self) -> int:
        """Session databases created and not yet dropped."""
        return 0

    async def aclose(self) -> None:
        """Release backend-wide resources (connection pools)."""
