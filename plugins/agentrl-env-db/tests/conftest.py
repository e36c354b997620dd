"""Fixtures: a private MariaDB server for the session (never the system service)."""

from __future__ import annotations

import pytest
from agentrl_env_db.config import DBConfig
from agentrl_env_db.server import PrivateMariaDB


@pytest.fixture(scope="session")
def mariadb():
    """A private mariadbd on a free port with its own datadir, stopped at the end.

    Fails (never skips) with one sentence when the binaries are missing.
    """
    try:
        server = PrivateMariaDB()
    except Exception as exc:
        pytest.fail(str(exc), pytrace=False)
    with server:
        yield server


@pytest.fixture
def mysql_config(mariadb) -> DBConfig:
    return DBConfig(backend="mysql", url=mariadb.url, query_timeout=2.0)
