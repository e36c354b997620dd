"""The embedded backend: one in-memory SQLite database per session, no server.

Every call runs in a worker thread (``run_blocking``) under the handle's lock, so the event
loop never blocks. A progress handler stops a statement past ``query_timeout``; a
cancelled call interrupts its statement. Columns are ``TEXT`` with a collation that
compares like MySQL's ``_ci`` collations, and MySQL string literals are translated (see
:mod:`agentrl_env_db.sqlite_compat`); other MySQL semantics differ, see the README.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from agentrl_core.errors import EnvError
from agentrl_env_db import sqlite_compat as compat
from agentrl_env_db.backend import Backend, Handle, QueryResult, RowCollector, cut, timeout_text
from agentrl_env_db.config import DBConfig
from agentrl_env_db.scoring import combine_hashes, table_hash
from agentrl_env_db.tasks import DBTask, Table

_PROGRESS_STEPS = 1000  # SQLite VM instructions between deadline checks
COLLATION = "MYSQL_CI"


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# Pragmas whose argument names a table or index (they read, never set).
_READ_PRAGMAS = {"table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
                 "foreign_key_list", "foreign_key_check", "integrity_check", "quick_check"}


def _authorize(action: int, arg1: str | None, arg2: str | None, db: str | None, trigger: str | None) -> int:
    """Keep a session inside its own in-memory database: no ATTACH, no PRAGMA that sets."""
    if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_PRAGMA and arg2 is not None and (arg1 or "").lower() not in _READ_PRAGMAS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def connect_memory(max_mb: int = 256) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)  # no ATTACH / VACUUM INTO files on the host
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {max(16, max_mb * (1 << 20) // page_size)}")
    conn.set_authorizer(_authorize)
    conn.create_collation(COLLATION, compat.mysql_ci)
    # A few MySQL functions agents (and upstream's hash query) use.
    conn.create_function("md5", 1, compat.md5, deterministic=True)
    conn.create_function("concat", -1, compat.concat, deterministic=True)
    conn.create_function("concat_ws", -1, compat.concat_ws, deterministic=True)
    conn.create_function("mysql_num", 1, compat.mysql_num, deterministic=True)
    return conn


def load_tables(conn: sqlite3.Connection, tables: tuple[Table, ...]) -> None:
    for table in tables:
        cols = ", ".join(f"{quote_ident(c)} TEXT COLLATE {COLLATION}" for c in table.columns)
        conn.execute(f"CREATE TABLE IF NOT EXISTS {quote_ident(table.name)} ({cols})")
        marks = ", ".join("?" * len(table.columns))
        conn.executemany(f"INSERT INTO {quote_ident(table.name)} VALUES ({marks})", table.rows)


class SQLiteHandle(Handle):
    def __init__(self, backend: SQLiteBackend, conn: sqlite3.Connection, task: DBTask) -> None:
        self.backend = backend
        self.config = backend.config
        self.task = task
        self._conn: sqlite3.Connection | None = conn
        self._lock = threading.Lock()  # one statement at a time, and close waits for it
        self._deadline = float("inf")

    def _progress(self) -> int:
        return 1 if time.monotonic() > self._deadline else 0

    async def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return await anyio.to_thread.run_sync(fn, *args, limiter=self.backend.limiter, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            conn = self._conn
            if conn is not None:
                conn.interrupt()  # the abandoned thread's statement stops at once
            raise

    async def execute(self, sql: str) -> QueryResult:
        if self._conn is None:
            raise RuntimeError("the SQLite handle is closed")
        return await self._call(self._execute_blocking, sql)

    def _execute_blocking(self, sql: str) -> QueryResult:
        config = self.config
        with self._lock:
            conn = self._conn
            if conn is None:
                return QueryResult("Error: the database is closed.", error=True)
            collector = RowCollector(config.output_limit, config.max_rows, config.max_bytes)
            self._deadline = time.monotonic() + config.query_timeout
            conn.set_progress_handler(self._progress, _PROGRESS_STEPS)
            cursor = conn.cursor()
            try:
                try:
                    translated = compat.translate(sql)
                except compat.MySQLSyntaxError as exc:  # refused as MySQL 8 refuses it
                    return QueryResult(cut(str(exc), config.output_limit), error=True)
                cursor.execute(translated)
                if cursor.description is not None:
                    while True:
                        batch = cursor.fetchmany(100)
                        if not batch or not all(collector.add(row) for row in batch):
                            break
                return QueryResult(collector.text(), capped=collector.capped, rows_read=collector.rows)
            except sqlite3.Error as exc:
                if time.monotonic() > self._deadline and "interrupt" in str(exc):
                    return QueryResult(timeout_text(config.query_timeout), error=True, timed_out=True)
                text = f"SQLite execution error: {exc}" if str(exc) else "No response from database."
                return QueryResult(cut(text, config.output_limit), error=True)
            finally:
                cursor.close()
                conn.set_progress_handler(None, 0)
                self._deadline = float("inf")

    async def table_hash(self) -> str:
        return await self._call(self._hash_blocking)

    def _hash_blocking(self) -> str:
        with self._lock:
            conn = self._conn
            if conn is None:
                raise RuntimeError("the SQLite handle is closed")
            hashes = []
            for table in self.task.tables:
                cols = ", ".join(quote_ident(c) for c in table.columns)
                try:
                    rows = conn.execute(f"SELECT {cols} FROM {quote_ident(table.name)}").fetchall()
                except sqlite3.Error as exc:
                    hashes.append(f"<error: {exc}>")
                    continue
                hashes.append(table_hash(rows))
            return combine_hashes(hashes)

    async def close(self) -> None:
        conn = self._conn
        if conn is None:
            return
        conn.interrupt()
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._close_blocking, limiter=self.backend.limiter)

    def _close_blocking(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()
                self.backend.live_handles -= 1


class SQLiteBackend(Backend):
    name = "sqlite"

    def __init__(self, config: DBConfig) -> None:
        self.config = config
        self.limiter = anyio.CapacityLimiter(config.sqlite_threads)
        self.live_handles = 0

    async def create(self, task: DBTask) -> SQLiteHandle:
        conn = await anyio.to_thread.run_sync(self._create_blocking, task, limiter=self.limiter)
        self.live_handles += 1
        return SQLiteHandle(self, conn, task)

    def _create_blocking(self, task: DBTask) -> sqlite3.Connection:
        conn = connect_memory(self.config.sqlite_max_mb)
        try:
            if task.sqlite_file is not None:
                if not Path(task.sqlite_file).is_file():
                    raise EnvError(
                        f"db/{task.split}/{task.index} needs the SQLite file {task.sqlite_file}; "
                        "set environments.db.train_db_dir to upstream's db_train folder"
                    )
                # Upstream's "user_sqlite" rows: a copy of the file, so the original stays intact.
                source = sqlite3.connect(f"file:{task.sqlite_file}?mode=ro", uri=True)
                try:
                    source.backup(conn)
                finally:
                    source.close()
            else:
                load_tables(conn, task.tables)
        except BaseException:
            conn.close()
            raise
        return conn

    def live(self) -> int:
        return self.live_handles
