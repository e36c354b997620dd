"""The server backend: one database and one user per session on MySQL or MariaDB.

Isolation: each session gets its own database (``utf8mb4``, every column ``TEXT`` as
upstream) and its own user whose grants cover only that database (escaped in ``GRANT`` so
``_`` is no wildcard), with at most a few connections and no global privileges (so no
``mysql.*``, ``FILE``, ``SET GLOBAL`` or other sessions' data). The session connection uses
``sql_mode=''``, has multi-statements switched off, and commits after every statement as
upstream does.

Limits: MariaDB stops a statement past ``query_timeout`` itself (``max_statement_time``,
MySQL: ``max_execution_time`` for SELECT); a client-side watchdog ``KILL``s the
connection if a statement still runs a second later (e.g. after the agent reset the
variable). Rows are read unbuffered and only until ``max_rows``/``max_bytes``; past that
the query is ``KILL QUERY``'d and the rest discarded unread.

Cleanup: ``close`` drops the database and the user (shielded from cancellation, bounded by
``admin_timeout``); names that failed to drop are retried. At start the sweeper removes
databases and users whose worker process is gone (see :mod:`agentrl_env_db.names`).
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiomysql
import anyio
import attrs
from pymysql.constants import CLIENT
from pymysql.err import Error as PyMySQLError

from agentrl_core.errors import EnvError
from agentrl_env_db import names
from agentrl_env_db.backend import Backend, Handle, QueryResult, RowCollector, cut, timeout_text
from agentrl_env_db.config import DBConfig, MySQLURL, resolve_url
from agentrl_env_db.scoring import GROUP_CONCAT_MAX_LEN, combine_hashes
from agentrl_env_db.tasks import DBTask

log = logging.getLogger(__name__)
T = TypeVar("T")

SESSION_GRANTS = (
    "SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, ALTER, INDEX, "
    "CREATE TEMPORARY TABLES, CREATE VIEW, SHOW VIEW"
)
MAX_USER_CONNECTIONS = 4
WATCHDOG_GRACE = 1.0  # seconds past query_timeout before the client kills the connection
_LOST = {2006, 2013, 2055}  # server gone / lost connection
_TIMEOUT = {1969, 3024}  # MariaDB max_statement_time / MySQL max_execution_time
_KILLED = {1317, 1927}  # query interrupted / connection killed
_UNKNOWN_THREAD = 1094


def quote_ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def grant_ident(name: str) -> str:
    """A database name for GRANT, where ``_`` and ``%`` are wildcards unless escaped."""
    return quote_ident(name.replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%"))


def error_text(exc: BaseException) -> str:
    """The database's error as upstream's driver prints it: ``1064 (42000): You have ...``."""
    if isinstance(exc, PyMySQLError) and len(exc.args) >= 2 and isinstance(exc.args[0], int):
        code, message = exc.args[0], exc.args[1]
        state = getattr(exc, "sqlstate", None)
        return f"{code} ({state}): {message}" if state else f"{code}: {message}"
    return str(exc) or type(exc).__name__


def error_code(exc: BaseException) -> int | None:
    if isinstance(exc, PyMySQLError) and exc.args and isinstance(exc.args[0], int):
        return exc.args[0]
    return None


class _QuietCursor(aiomysql.Cursor):
    """No SHOW WARNINGS round trip after statements with warnings (sql_mode='' makes many)."""

    async def _show_warnings(self, conn: Any) -> None:
        return None


class _QuietSSCursor(aiomysql.SSCursor):
    async def _show_warnings(self, conn: Any) -> None:
        return None


class _SingleStatementConnection(aiomysql.Connection):
    """aiomysql always asks for multi-statements; upstream's driver rejects them, so do we."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.client_flag &= ~CLIENT.MULTI_STATEMENTS


async def _connect(url: MySQLURL, *, timeout: float, single: bool = False, **kwargs: Any) -> aiomysql.Connection:
    params = dict(
        host=url.host,
        port=url.port,
        unix_socket=url.unix_socket,
        user=url.user,
        password=url.password,
        charset="utf8mb4",
        connect_timeout=timeout,
        cursorclass=_QuietCursor,
    )
    params.update(kwargs)
    conn = _SingleStatementConnection(**params) if single else aiomysql.Connection(**params)
    try:
        with anyio.fail_after(timeout):
            await conn._connect()  # what aiomysql.connect() awaits
    except BaseException:
        conn.close()
        raise
    return conn


class AdminPool:
    """A few connections of the admin account; a connection that failed is discarded."""

    def __init__(self, url: MySQLURL, config: DBConfig) -> None:
        self.url = url
        self.config = config
        self._idle: list[aiomysql.Connection] = []
        self._slots = anyio.Semaphore(config.admin_pool_size)

    async def run(self, fn: Callable[[aiomysql.Cursor], Awaitable[T]]) -> T:
        """Run ``fn(cursor)`` on an admin connection within ``admin_timeout``, never cancelled midway."""
        with anyio.CancelScope(shield=True), anyio.fail_after(self.config.admin_timeout):
            async with self._slots:
                conn = self._idle.pop() if self._idle else await self._open()
                try:
                    async with conn.cursor() as cur:
                        result = await fn(cur)
                except BaseException:
                    conn.close()
                    raise
                self._idle.append(conn)
                return result

    async def _open(self) -> aiomysql.Connection:
        timeout = self.config.connect_timeout
        try:
            return await _connect(
                self.url,
                timeout=timeout,
                autocommit=True,
                init_command=(
                    f"SET SESSION group_concat_max_len = {GROUP_CONCAT_MAX_LEN}, "
                    f"SESSION lock_wait_timeout = {max(1, math.ceil(self.config.admin_timeout))}"
                ),
            )
        except (OSError, PyMySQLError, TimeoutError) as exc:
            where = self.url.unix_socket or f"{self.url.host}:{self.url.port}"
            raise EnvError(
                f"cannot connect to the MySQL/MariaDB server at {where} as {self.url.user!r} "
                f"({error_text(exc)}); check environments.db.url and that the server is running"
            ) from None

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class MySQLHandle(Handle):
    def __init__(self, backend: MySQLBackend, name: str, password: str, task: DBTask) -> None:
        self.backend = backend
        self.config = backend.config
        self.name = name
        self.password = password
        self.task = task
        self._conn: aiomysql.Connection | None = None
        self._thread_id: int | None = None
        self._busy = False
        self._closed = False
        self._lock = anyio.Lock()

    # -- connection -------------------------------------------------------------------

    async def _connection(self) -> aiomysql.Connection:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        self._conn = None
        b = self.backend
        conn = await _connect(
            attrs.evolve(b.url, user=self.name, password=self.password),
            timeout=self.config.connect_timeout,
            single=True,
            db=self.name,
            autocommit=False,
            init_command=b.session_init,
        )
        self._conn, self._thread_id = conn, conn.thread_id()
        return conn

    async def load(self) -> None:
        """Create the task's tables as upstream: every column TEXT, all rows in one INSERT."""
        conn = await self._connection()
        async with conn.cursor() as cur:
            for table in self.task.tables:
                cols = ", ".join(f"{quote_ident(c)} TEXT" for c in table.columns)
                await cur.execute(f"CREATE TABLE IF NOT EXISTS {quote_ident(table.name)} ({cols})")
                if table.rows:
                    # '%' in a name would be read as a placeholder by the driver's formatting.
                    target = quote_ident(table.name).replace("%", "%%")
                    names_ = ", ".join(quote_ident(c) for c in table.columns).replace("%", "%%")
                    row = "(" + ", ".join(["%s"] * len(table.columns)) + ")"
                    values = [v for r in table.rows for v in r]
                    await cur.execute(
                        f"INSERT INTO {target} ({names_}) VALUES {', '.join([row] * len(table.rows))}", values
                    )
        await conn.commit()

    # -- statements -------------------------------------------------------------------

    async def execute(self, sql: str) -> QueryResult:
        if self._closed:
            raise RuntimeError("the MySQL handle is closed")
        async with self._lock:
            self._busy = True
            try:
                with anyio.move_on_after(self.config.query_timeout + WATCHDOG_GRACE):
                    return await self._execute(sql)
                # Still running past the server-side limit: drop the connection.
                await self._kill(connection=True)
                return QueryResult(timeout_text(self.config.query_timeout), error=True, timed_out=True)
            except BaseException:
                if self._conn is not None and self._conn.closed:
                    await self._kill(connection=True)  # cancelled mid-statement
                raise
            finally:
                self._busy = False

    async def _execute(self, sql: str) -> QueryResult:
        config = self.config
        try:
            conn = await self._connection()
        except (OSError, PyMySQLError, TimeoutError) as exc:
            raise EnvError(f"cannot reconnect session database {self.name}: {error_text(exc)}") from None
        collector = RowCollector(config.output_limit, config.max_rows, config.max_bytes)
        cur = await conn.cursor(_QuietSSCursor)
        try:
            await cur.execute(sql)
            if cur.description is not None:
                while True:
                    batch = await cur.fetchmany(100)
                    if not batch or not all(collector.add(row) for row in batch):
                        break
                if collector.capped:
                    await self._kill(connection=False)  # stop producing rows nobody reads
                await self._discard_rest(cur)
            await conn.commit()
            return QueryResult(collector.text(), capped=collector.capped, rows_read=collector.rows)
        except PyMySQLError as exc:
            code = error_code(exc)
            await self._recover(conn)
            if code in _TIMEOUT:
                return QueryResult(timeout_text(config.query_timeout), error=True, timed_out=True)
            text = error_text(exc) or "No response from database."
            return QueryResult(cut(text, config.output_limit), error=True)

    async def _discard_rest(self, cur: aiomysql.SSCursor) -> None:
        try:
            await cur.close()  # reads (without keeping) what the server already sent
        except PyMySQLError as exc:
            if error_code(exc) not in _KILLED | _TIMEOUT:
                raise

    async def _recover(self, conn: aiomysql.Connection) -> None:
        if conn.closed:
            self._conn = None
            return
        try:
            await conn.rollback()
        except PyMySQLError:
            conn.close()
            self._conn = None

    async def _kill(self, *, connection: bool) -> None:
        """KILL QUERY (the statement) or KILL CONNECTION through the admin account."""
        thread_id = self._thread_id
        if connection:
            if self._conn is not None:
                self._conn.close()
            self._conn = None
        if thread_id is None:
            return

        async def kill(cur: aiomysql.Cursor) -> None:
            try:
                await cur.execute(f"KILL {'CONNECTION' if connection else 'QUERY'} {int(thread_id)}")
            except PyMySQLError as exc:
                if error_code(exc) != _UNKNOWN_THREAD:
                    raise

        await self.backend.admin.run(kill)

    # -- hashing and cleanup ----------------------------------------------------------

    async def table_hash(self) -> str:
        """Upstream's hash query, run by the admin account (the agent cannot tamper with it)."""

        async def run(cur: aiomysql.Cursor) -> str:
            hashes: list[str | None] = []
            for table in self.task.tables:
                cols = ", ".join(quote_ident(c) for c in table.columns)
                try:
                    await cur.execute(
                        "select md5(group_concat(rowhash order by rowhash)) as hash "
                        f"from( SELECT substring(MD5(CONCAT_WS(',', {cols})), 1, 5) AS rowhash "
                        f"FROM {quote_ident(self.name)}.{quote_ident(table.name)}) as sub;"
                    )
                    (value,) = await cur.fetchone()
                    hashes.append(value)
                except PyMySQLError as exc:
                    hashes.append(f"<error: {error_text(exc)}>")
            return combine_hashes(hashes)

        return await self.backend.admin.run(run)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            conn = self._conn
            if conn is not None and not self._busy and not conn.closed:
                # Idle, so it holds no locks: say goodbye (COM_QUIT) and let the server end it.
                self._conn = None
                with anyio.move_on_after(self.config.connect_timeout):
                    await conn.ensure_closed()
                conn.close()
            else:
                await self._kill(connection=True)
            await self.backend.drop(self.name)


class MySQLBackend(Backend):
    name = "mysql"

    def __init__(self, config: DBConfig) -> None:
        self.config = config
        self.url = resolve_url(config)
        self.admin = AdminPool(self.url, config)
        self.names = names.NameFactory(config.name_prefix)
        self.session_init = ""
        self.flavor = ""
        self._live: set[str] = set()
        self._undropped: set[str] = set()
        self._ready = False
        self._ready_lock = anyio.Lock()
        self.swept: list[str] = []

    async def ensure_ready(self) -> None:
        """Detect the server flavor and sweep dead workers' leftovers, once."""
        if self._ready:
            return
        async with self._ready_lock:
            if self._ready:
                return

            async def version(cur: aiomysql.Cursor) -> str:
                await cur.execute("SELECT VERSION()")
                return (await cur.fetchone())[0]

            server = await self.admin.run(version)
            self.flavor = "mariadb" if "mariadb" in server.lower() else "mysql"
            timeout = self.config.query_timeout
            limit = (
                f"SESSION max_statement_time = {timeout:g}"
                if self.flavor == "mariadb"
                else f"SESSION max_execution_time = {max(1, math.ceil(timeout * 1000))}"
            )
            self.session_init = f"SET SESSION sql_mode = '', {limit}"
            if self.config.sweep:
                self.swept = await self.sweep()
            self._ready = True

    async def create(self, task: DBTask) -> MySQLHandle:
        await self.ensure_ready()
        if self._undropped:
            await self._retry_drops()
        name = str(self.names.new())
        password = secrets.token_urlsafe(18)
        self._live.add(name)  # before CREATE, so that close/aclose drop whatever was made
        handle = MySQLHandle(self, name, password, task)
        try:
            await self.admin.run(lambda cur: self._create_objects(cur, name, password))
            await handle.load()
        except BaseException:
            await handle.close()
            raise
        return handle

    async def _create_objects(self, cur: aiomysql.Cursor, name: str, password: str) -> None:
        c = self.config
        await cur.execute(f"CREATE DATABASE {quote_ident(name)} CHARACTER SET {c.charset} COLLATE {c.collation}")
        await cur.execute(
            f"CREATE USER %s@%s IDENTIFIED BY %s WITH MAX_USER_CONNECTIONS {MAX_USER_CONNECTIONS}",
            (name, c.user_host, password),
        )
        await cur.execute(f"GRANT {SESSION_GRANTS} ON {grant_ident(name).replace('%', '%%')}.* TO %s@%s", (name, c.user_host))

    async def drop(self, name: str) -> None:
        """Drop a session's database and user; remembered for a retry if the server fails."""
        try:
            await self.admin.run(lambda cur: self._drop_objects(cur, name))
        except (OSError, PyMySQLError, TimeoutError, EnvError) as exc:
            log.warning("could not drop session database %s (%s); will retry", name, error_text(exc))
            self._undropped.add(name)
        else:
            self._undropped.discard(name)
        finally:
            self._live.discard(name)

    async def _drop_objects(self, cur: aiomysql.Cursor, name: str, *, kill: bool = False) -> None:
        if kill:
            await cur.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE USER = %s", (name,))
            for (thread_id,) in await cur.fetchall():
                try:
                    await cur.execute(f"KILL CONNECTION {int(thread_id)}")
                except PyMySQLError as exc:
                    if error_code(exc) != _UNKNOWN_THREAD:
                        raise
        await cur.execute(f"DROP DATABASE IF EXISTS {quote_ident(name)}")
        await cur.execute("DROP USER IF EXISTS %s@%s", (name, self.config.user_host))

    async def _retry_drops(self) -> None:
        for name in list(self._undropped):
            await self.drop(name)

    async def leftovers(self) -> tuple[list[str], list[tuple[str, str]]]:
        """Databases and users on the server whose names carry this prefix."""
        pattern = self.config.name_prefix.replace("_", "\\_") + "%"

        async def run(cur: aiomysql.Cursor) -> tuple[list[str], list[tuple[str, str]]]:
            await cur.execute("SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME LIKE %s", (pattern,))
            dbs = sorted(r[0] for r in await cur.fetchall())
            await cur.execute("SELECT User, Host FROM mysql.user WHERE User LIKE %s", (pattern,))
            users = sorted((r[0], r[1]) for r in await cur.fetchall())
            return dbs, users

        return await self.admin.run(run)

    async def sweep(self) -> list[str]:
        """Remove databases and users of dead workers; returns the names removed."""
        dbs, users = await self.leftovers()
        found = set(dbs) | {u for u, _ in users}
        removed = []
        for raw in sorted(found):
            parsed = names.parse(raw, self.config.name_prefix)
            if parsed is None:
                log.info("sweeper: leaving %s alone (not a session name)", raw)
                continue
            if not names.is_orphan(parsed, max_age=self.config.sweep_max_age):
                continue
            hosts = [h for u, h in users if u == raw] or [self.config.user_host]

            async def drop(cur: aiomysql.Cursor, raw: str = raw, hosts: list[str] = hosts) -> None:
                await self._drop_objects(cur, raw, kill=True)
                for host in hosts:
                    await cur.execute("DROP USER IF EXISTS %s@%s", (raw, host))

            await self.admin.run(drop)
            removed.append(raw)
        if removed:
            log.info("sweeper: removed %d leftover session database(s)/user(s) of dead workers", len(removed))
        return removed

    def live(self) -> int:
        return len(self._live)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            for name in list(self._live) + list(self._undropped):
                await self.drop(name)
            if self.config.sweep and self._ready:
                # a peer worker that died during the run left its sessions' names behind: the sweep
                # at start ran before it died, so the last worker standing removes them on its way out
                try:
                    self.swept += await self.sweep()
                except (OSError, PyMySQLError, TimeoutError, EnvError) as exc:
                    log.warning("sweeper at close: %s", error_text(exc))
            await self.admin.aclose()
