"""Config section ``environments.db`` and the MySQL URL it names."""

from __future__ import annotations

import os
import re
from typing import Literal
from urllib.parse import unquote, urlsplit

from attrs import field, frozen

from agentrl_core.errors import ConfigError
from agentrl_core.structure import check, in_range

URL_ENV = "AGENTRL_DB_URL"


@frozen
class DBConfig:
    """Config section ``environments.db`` (every key is optional).

    ``backend: sqlite`` (default) needs no server; ``backend: mysql`` needs ``url`` (or the
    ``AGENTRL_DB_URL`` environment variable): an account that may create databases and
    users, e.g. ``mysql://root:secret@127.0.0.1:3306``.
    """

    backend: Literal["sqlite", "mysql"] = "sqlite"
    url: str | None = None
    max_rounds: int = field(default=15, validator=in_range(1))
    # How tool calls are read: "upstream" (AgentBench-FC's task: the first argument value whatever
    # its key), "strict" (the schemas; a call that breaks them gets the reason), "auto" (upstream
    # for std and dev, strict for the training sets).
    tool_arguments: Literal["auto", "upstream", "strict"] = "auto"
    concurrency: int = field(default=64, validator=in_range(1))
    # One SQL statement may run this long before it is stopped (upstream: 60 s).
    query_timeout: float = field(default=60.0, validator=in_range(0, lo_open=True))
    connect_timeout: float = field(default=10.0, validator=in_range(0, lo_open=True))
    # Creating/dropping a session's database and user; also bounds close().
    admin_timeout: float = field(default=30.0, validator=in_range(0, lo_open=True))
    # Observations are str(rows) cut at this many characters + "[TRUNCATED]" (upstream: 800).
    output_limit: int = field(default=800, validator=in_range(1))
    # Caps on what one query reads back from the database (the rest is never loaded).
    max_rows: int = field(default=10_000, validator=in_range(1))
    max_bytes: int = field(default=1 << 20, validator=in_range(1))
    data_dir: str | None = None
    # The upstream training file (db_out_new.jsonl); its rows become index set `train`.
    train_file: str | None = None
    # Folder of the SQLite files that rows with "user_sqlite": true open (upstream db_train/).
    train_db_dir: str | None = None
    gen_train_per_table: int = field(default=8, validator=in_range(1, 20))
    gen_train_seed: int = 0
    # When set, every gen-train task's table gets a made-up name of its own, drawn with this seed
    # (the questions, rows and answers stay): a model cannot answer from memorized table names.
    gen_train_rename_seed: int | None = None
    # MySQL: session databases and users are named <prefix><host>_<pid>_<time>_<n>.
    name_prefix: str = field(default="agrl_", validator=check(lambda v: re.fullmatch(r"[a-z][a-z0-9]{0,4}_", v) is not None, "must be 1-5 lowercase letters/digits (starting with a letter) and '_'"))
    # Leftovers of this host's dead processes are always swept; other hosts' after this age.
    sweep_max_age: float = field(default=24 * 3600.0, validator=in_range(0, lo_open=True))
    sweep: bool = True
    admin_pool_size: int = field(default=4, validator=in_range(1, 64))
    charset: str = "utf8mb4"
    collation: str = "utf8mb4_unicode_ci"
    user_host: str = "%"
    sqlite_threads: int = field(default=8, validator=in_range(1, 256))
    # Size cap of one in-memory SQLite session database (INSERTs past it fail: "database or disk is full").
    sqlite_max_mb: int = field(default=256, validator=in_range(1))


@frozen
class MySQLURL:
    host: str
    port: int
    user: str
    password: str
    unix_socket: str | None = None


def resolve_url(config: DBConfig) -> MySQLURL:
    """Parse the admin URL from the config or ``AGENTRL_DB_URL``; one clear error if absent."""
    raw = config.url or os.environ.get(URL_ENV)
    if not raw:
        raise ConfigError(
            "environments.db.backend is 'mysql' but no server is configured: set environments.db.url "
            f"(e.g. mysql://root:secret@127.0.0.1:3306) or the {URL_ENV} environment variable."
        )
    parts = urlsplit(raw)
    if parts.scheme not in ("mysql", "mariadb"):
        raise ConfigError(f"environments.db.url must start with mysql:// or mariadb://, got {raw.split('://')[0]!r}")
    query = dict(p.split("=", 1) for p in parts.query.split("&") if "=" in p)
    try:
        port = parts.port or 3306
    except ValueError:
        raise ConfigError("environments.db.url has an invalid port") from None
    return MySQLURL(
        host=parts.hostname or "127.0.0.1",
        port=port,
        user=unquote(parts.username or "root"),
        password=unquote(parts.password or ""),
        unix_socket=unquote(query["unix_socket"]) if "unix_socket" in query else None,
    )
