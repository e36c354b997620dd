"""The MySQL backend against a real MariaDB (a private server started by the session fixture)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import anyio
import attrs
import pytest
from agentrl_env_db.config import DBConfig
from agentrl_env_db.env import DBEnvironment
from agentrl_env_db.mysql_backend import MySQLBackend
from agentrl_env_db.scoring import compare_results

from agentrl_core.env import Status, assistant_tool_call, play_episode
from agentrl_core.testing import check_environment

pytestmark = pytest.mark.mariadb

# The one std sample no correct agent can solve (listed in agentrl_env_db/data/PROVENANCE.md).
MARIADB_STD_MISSES = {225: "the stored hash matches neither the table before nor after the gold UPDATE"}
JIU = "`Jiu-Jitsu Championships Results`"


def _sql(query, call_id="call_0"):
    return assistant_tool_call("execute_sql", {"query": query}, call_id=call_id)


async def _leftovers(config):
    backend = MySQLBackend(config)
    try:
        return await backend.leftovers()
    finally:
        await backend.aclose()


def test_conformance_mysql(mariadb):
    report = check_environment("db", {"backend": "mysql", "url": mariadb.url}, oracle_samples=5)
    assert not report.failures


def test_oracle_on_every_split(mysql_config):
    async def main():
        env = DBEnvironment(mysql_config)
        results = {}
        try:
            for split in ("std", "dev", "gen-train"):
                results[split] = [
                    (i, await play_episode(env, split, i, env.oracle(split, i))) for i in env.index_sets()[split]
                ]
        finally:
            await env.aclose()
        return env, results, await _leftovers(mysql_config)

    env, results, leftovers = anyio.run(main)
    misses = {split: {i for i, ep in eps if ep.reward != 1.0} for split, eps in results.items()}
    assert misses == {"std": set(MARIADB_STD_MISSES), "dev": set(), "gen-train": set()}
    assert all(ep.status is Status.COMPLETED for eps in results.values() for _, ep in eps)
    # Generated questions: executing the gold SQL on MariaDB yields the stored answer too.
    for i, ep in results["gen-train"]:
        task = env.task("gen-train", i)
        if not task.is_modification:
            shown = ep.messages[3]["content"]
            assert compare_results(shown, task.answer, task.kind), (i, shown, task.answer)
    assert leftovers == ([], [])


def test_isolation_between_sessions_and_from_the_server(mysql_config):
    async def main():
        env = DBEnvironment(mysql_config)
        a, b = await env.open("std", 0), await env.open("std", 1)
        await a.start()
        await b.start()
        other = b.handle.name
        twin = a.handle.name.replace("_", "x", 1)  # what GRANT's unescaped '_' wildcard would also cover

        async def make_twin(cur):
            await cur.execute(f"CREATE DATABASE `{twin}`")
            await cur.execute(f"CREATE TABLE `{twin}`.t (x TEXT)")

        await env.backend.admin.run(make_twin)
        out = {}
        queries = {
            "read_other": f"SELECT * FROM `{other}`.`Championship Results`",
            "write_other": f"INSERT INTO `{other}`.`Championship Results` VALUES ('x')",
            "drop_other": f"DROP DATABASE `{other}`",
            "twin": f"SELECT * FROM `{twin}`.t",
            "system": "SELECT * FROM mysql.user",
            "databases": "SHOW DATABASES",
            "global": "SET GLOBAL max_connections = 5",
            "file": "SELECT LOAD_FILE('/etc/passwd')",
            "create_db": "CREATE DATABASE sneaky",
            "grant": f"GRANT SELECT ON `{other}`.* TO CURRENT_USER",
            "multi": f"SELECT 1; DROP TABLE {JIU}",
            "still_there": f"SELECT COUNT(*) FROM {JIU}",
            "syntax": "SELEC 1",
            "sql_mode": "SELECT @@sql_mode",
        }
        try:
            for i, (key, query) in enumerate(queries.items()):
                out[key] = (await a.step(_sql(query, f"call_{i}"))).messages[0]["content"]
        finally:
            await a.close()
            await b.close()
            await env.backend.admin.run(lambda cur: cur.execute(f"DROP DATABASE `{twin}`"))
            await env.aclose()
        return a.handle, out

    _, out = anyio.run(main)
    for key in ("read_other", "write_other", "twin", "system"):
        assert out[key].startswith("1142 (42000): ") and "command denied" in out[key], (key, out[key])
    assert out["drop_other"].startswith("1044 (42000): Access denied")
    assert out["create_db"].startswith("1044 (42000): Access denied")
    assert out["grant"].startswith(("1044 (42000)", "1045 (28000)", "1142 (42000)"))
    assert out["databases"].count("(") == 2 and "information_schema" in out["databases"]
    assert out["global"].startswith("1227 (42000): Access denied; you need (at least one of) the SUPER")
    assert out["file"] == "[(None,)]"
    assert out["multi"].startswith("1064 (42000): You have an error in your SQL syntax")
    assert out["still_there"] == "[(18,)]"
    assert out["syntax"] == ("1064 (42000): You have an error in your SQL syntax; check the manual that corresponds "
                             "to your MariaDB server version for the right syntax to use near 'SELEC 1' at line 1")
    assert out["sql_mode"] == "[('',)]"


def test_long_queries_are_stopped(mariadb):
    config = DBConfig(backend="mysql", url=mariadb.url, query_timeout=0.5)

    async def main():
        env = DBEnvironment(config)
        session = await env.open("std", 0)
        await session.start()
        timed = {}
        try:
            started = time.monotonic()
            step = await session.step(_sql("SELECT SLEEP(3)"))
            timed["server"] = (time.monotonic() - started, step.messages[0]["content"])
            # The agent lifts the server-side limit: the watchdog kills the connection instead.
            await session.step(_sql("SET SESSION max_statement_time = 0", "call_1"))
            started = time.monotonic()
            step = await session.step(_sql("SELECT SLEEP(5)", "call_2"))
            timed["watchdog"] = (time.monotonic() - started, step.messages[0]["content"])
            after = await session.step(_sql("SELECT COUNT(*) FROM " + JIU, "call_3"))
            assert after.messages[0]["content"] == "[(18,)]" and after.metrics["sql_timeouts"] == 2

            async def connections(cur):
                await cur.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = %s",
                                  (session.handle.name,))
                return (await cur.fetchone())[0]

            assert await env.backend.admin.run(connections) == 1  # the killed one is gone
        finally:
            await session.close()
            await env.aclose()
        return timed

    timed = anyio.run(main)
    message = "Error: SQL execution timed out after 0.5 s; the query was stopped."
    assert timed["server"][1] == message and timed["server"][0] < 2.5
    assert timed["watchdog"][1] == message and timed["watchdog"][0] < 4


def test_huge_results_are_capped_not_loaded(mariadb):
    config = DBConfig(backend="mysql", url=mariadb.url, max_rows=1000)

    async def main():
        env = DBEnvironment(config)
        session = await env.open("std", 0)
        await session.start()
        try:
            started = time.monotonic()
            # 18^5 = 1,889,568 rows; only 1000 are read back, then the query is killed.
            result = await session.handle.execute(f"SELECT * FROM {JIU} a, {JIU} b, {JIU} c, {JIU} d, {JIU} e")
            elapsed = time.monotonic() - started
            again = await session.handle.execute("SELECT 1")
        finally:
            await session.close()
            await env.aclose()
        return result, elapsed, again

    result, elapsed, again = anyio.run(main)
    assert result.capped and result.rows_read == 1000 and result.text.endswith("[TRUNCATED]")
    assert len(result.text) == 800 + len("[TRUNCATED]")
    assert elapsed < 10
    assert again.text == "[(1,)]"


def test_many_sessions_with_random_cancels_leave_nothing(mysql_config):
    rng = random.Random(7)
    plans = [rng.choice(["start", "query", "sleep", "finish", "idle"]) for _ in range(40)]

    async def one(env, i, plan):
        session = await env.open("std", i)
        try:
            with anyio.CancelScope() as scope:
                if plan == "start":
                    scope.cancel()  # cancelled while the database is being created
                await session.start()
                await session.step(_sql(f"UPDATE {JIU} SET Notes = 'x'" if i == 0 else "SELECT 1"))
                if plan == "sleep":
                    with anyio.move_on_after(0.05):
                        await session.step(_sql("SELECT SLEEP(1)", "call_1"))
                elif plan == "finish":
                    await session.step(assistant_tool_call("commit_final_answer", {"answers": []}, call_id="call_1"))
        finally:
            await session.close()

    async def main():
        env = DBEnvironment(mysql_config)
        try:
            async with anyio.create_task_group() as tg:
                for i, plan in enumerate(plans):
                    tg.start_soon(one, env, i, plan)
            assert env.resource_count() == 0
        finally:
            await env.aclose()
        return await _leftovers(mysql_config)

    assert anyio.run(main) == ([], [])


WORKER = textwrap.dedent(
    """
    import sys, anyio
    from agentrl_env_db.config import DBConfig
    from agentrl_env_db.env import DBEnvironment

    async def main():
        env = DBEnvironment(DBConfig(backend="mysql", url=sys.argv[1]))
        sessions = [await env.open("std", i) for i in range(3)]
        for s in sessions:
            await s.start()
        print(" ".join(s.handle.name for s in sessions), flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)  # until the parent kills us

    anyio.run(main)
    """
)


@pytest.mark.processes
def test_sweeper_removes_what_a_killed_worker_left(mysql_config, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    worker = subprocess.Popen([sys.executable, str(script), mysql_config.url], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    names = worker.stdout.readline().split()
    assert len(names) == 3 and all(str(worker.pid) in n for n in names)
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()

    async def main():
        live_env = DBEnvironment(attrs.evolve(mysql_config, sweep=False))
        live = await live_env.open("std", 5)
        await live.start()  # a live session of this process: the sweeper must keep it
        live_name = live.handle.name
        dbs, users = await _leftovers(mysql_config)
        assert set(names) <= set(dbs) and set(names) <= {u for u, _ in users}
        fresh = DBEnvironment(mysql_config)
        await fresh.backend.ensure_ready()  # environment start: the sweep
        swept = fresh.backend.swept
        await fresh.aclose()
        after = await _leftovers(mysql_config)
        await live.close()
        await live_env.aclose()
        return swept, live_name, after, await _leftovers(mysql_config)

    swept, live_name, after, final = anyio.run(main)
    assert sorted(swept) == sorted(names)
    assert after == ([live_name], [(live_name, "%")])
    assert final == ([], [])


@pytest.mark.processes
def test_a_worker_outliving_a_killed_peer_removes_its_leftovers_at_close(mysql_config, tmp_path):
    # the survivor swept at its start, before its peer died: without a sweep at close the peer's
    # databases would stay until the next worker starts
    script = tmp_path / "worker.py"
    script.write_text(WORKER)

    async def main():
        survivor = DBEnvironment(mysql_config)
        await survivor.backend.ensure_ready()
        assert survivor.backend.swept == []
        peer = subprocess.Popen([sys.executable, str(script), mysql_config.url], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        names = (await anyio.to_thread.run_sync(peer.stdout.readline)).split()
        os.kill(peer.pid, signal.SIGKILL)
        peer.wait()
        assert set(names) <= set((await _leftovers(mysql_config))[0])
        await survivor.aclose()
        return names, survivor.backend.swept, await _leftovers(mysql_config)

    names, swept, after = anyio.run(main)
    assert len(names) == 3 and sorted(swept) == sorted(names)
    assert after == ([], [])


def test_session_start_is_fast(mysql_config):
    async def main():
        env = DBEnvironment(mysql_config)
        await env.backend.ensure_ready()
        times = []
        try:
            for i in range(20):
                session = await env.open("std", i)
                started = time.perf_counter()
                await session.start()
                times.append(time.perf_counter() - started)
                await session.close()
        finally:
            await env.aclose()
        return sorted(times)[len(times) // 2]

    # A sanity bound on a loaded 2-core machine; benchmarks/env_db.py measures the real number.
    assert anyio.run(main) < 0.5
