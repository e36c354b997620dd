"""Discovery, the environment contract, config errors, the CLI, and the wheel's data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from agentrl_env_db.config import DBConfig, resolve_url
from agentrl_env_db.env import TOOLS, DBEnvironment
from agentrl_env_db.tasks import SHIPPED, SYSTEM_PROMPT

from agentrl_core.datafiles import sha256_of
from agentrl_core.env import read_demonstrations
from agentrl_core.errors import ConfigError
from agentrl_core.plugins import get_plugin_manager
from agentrl_core.registry import Registry
from agentrl_core.testing import check_environment

PLUGIN_DIR = Path(__file__).resolve().parents[1]


def test_entry_point_is_discovered_by_a_fresh_plugin_manager():
    pm = get_plugin_manager(environ={})
    assert pm.records["env_db"].status == "ok"
    assert pm.records["env_db"].distribution == "agentrl-env-db"
    spec = Registry(pm).get_environment("db")
    assert spec.factory == "agentrl_env_db.env:DBEnvironment"
    assert Registry(pm).config_schema("environment", "db") is DBConfig


def test_conformance_sqlite():
    report = check_environment("db", oracle_samples=5)
    assert not report.failures


def test_tools_and_prompt_are_upstreams():
    names = [t["function"]["name"] for t in TOOLS]
    assert names == ["execute_sql", "commit_final_answer"]
    answers = TOOLS[1]["function"]["parameters"]
    assert answers["properties"]["answers"] == {
        "type": "array", "items": {"type": "string"}, "description": "The list of final answers to commit.",
    }
    assert answers["required"] == ["answers"] and answers["additionalProperties"] is False
    assert SYSTEM_PROMPT.startswith("I will ask you a question, then you should help me operate a MySQL database")
    assert SYSTEM_PROMPT.endswith("Your input will be raw MySQL response, you have to deal with it by yourself.")
    env = DBEnvironment()
    assert env.config.max_rounds == 15
    task = env.task("std", 0)
    assert task.user_prompt() == (
        "Additional table information about the question: The name of this table is Jiu-Jitsu Championships "
        "Results, and the headers of this table are Result,Opponent,Method,Event,Notes.\n"
        "Question: What are the Notes when the Method is decision?\n"
    )


def test_index_sets():
    sets = DBEnvironment().index_sets()
    assert sets["std"] == list(range(300))
    assert sets["dev"] == [i for i in range(60) if i != 5]  # dev #5 has an empty column name
    assert len(sets["gen-train"]) > 400
    assert "train" not in sets  # only with train_file


def test_config_errors_are_one_clear_sentence(monkeypatch):
    registry = Registry()
    with pytest.raises(ConfigError, match="must be one of 'sqlite', 'mysql'"):
        registry.make_config("environment", "db", {"backend": "postgres"})
    with pytest.raises(ConfigError, match="did you mean 'query_timeout'"):
        registry.make_config("environment", "db", {"query_timout": 3})
    monkeypatch.delenv("AGENTRL_DB_URL", raising=False)
    with pytest.raises(ConfigError, match="no server is configured: set environments.db.url"):
        DBEnvironment(DBConfig(backend="mysql"))
    url = resolve_url(DBConfig(backend="mysql", url="mysql://admin:p%40ss@db.example:3307"))
    assert (url.host, url.port, url.user, url.password) == ("db.example", 3307, "admin", "p@ss")
    monkeypatch.setenv("AGENTRL_DB_URL", "mariadb://root@127.0.0.1")
    assert resolve_url(DBConfig(backend="mysql")).port == 3306


def test_demos_cli_writes_oracle_trajectories(tmp_path):
    env = {**os.environ, "AGENTRL_PLUGINS": ""}
    out = tmp_path / "demos.jsonl"
    subprocess.run([sys.executable, "-m", "agentrl_core.cli.main", "demos", "--env", "db", "--split", "gen-train",
                    "--limit", "12", "--out", str(out)], check=True, env=env, capture_output=True)
    records = list(read_demonstrations(out))
    assert len(records) == 12 and all(r["reward"] == 1.0 for r in records)
    select = next(r for r in records if r["messages"][2]["tool_calls"][0]["function"]["name"] == "execute_sql"
                  and not json.loads(r["messages"][2]["tool_calls"][0]["function"]["arguments"])["query"].startswith(
                      ("INSERT", "UPDATE", "DELETE")))
    assert select["messages"][3]["role"] == "tool" and select["messages"][3]["content"].startswith("[(")


@pytest.mark.slow
def test_wheel_ships_the_data_with_matching_checksums(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(PLUGIN_DIR)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("agentrl_env_db-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        for name, digest in SHIPPED.items():
            target = tmp_path / name
            target.write_bytes(zf.read(f"agentrl_env_db/data/{name}"))
            assert sha256_of(target) == digest
        assert "agentrl_env_db/plugin.py" in zf.namelist()
        entry_points = next(n for n in zf.namelist() if n.endswith("entry_points.txt"))
        assert 'env_db = agentrl_env_db.plugin' in zf.read(entry_points).decode()


def test_missing_server_binaries_fail_with_one_sentence(monkeypatch):
    from agentrl_env_db import server

    from agentrl_core.errors import EnvError

    monkeypatch.setattr(server, "_which", lambda names: None)
    with pytest.raises(EnvError) as info:
        server.PrivateMariaDB()
    message = str(info.value)
    assert message == server.MISSING and "install the mariadb-server package" in message


def test_unreachable_server_is_one_clear_error():
    import anyio
    from agentrl_env_db.server import free_port

    from agentrl_core.errors import EnvError

    async def main():
        env = DBEnvironment(DBConfig(backend="mysql", url=f"mysql://root@127.0.0.1:{free_port()}", admin_timeout=5))
        session = await env.open("std", 0)
        try:
            with pytest.raises(EnvError, match=r"cannot connect to the MySQL/MariaDB server at 127\.0\.0\.1:\d+ as "
                                               r"'root' \(2003: .*\); check environments\.db\.url"):
                await session.start()
        finally:
            await session.close()
            await env.aclose()
        assert env.resource_count() == 0

    anyio.run(main)
