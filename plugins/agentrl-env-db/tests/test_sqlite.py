"""The embedded SQLite backend: oracle rates, observations, bad turns, limits."""

from __future__ import annotations

import time

import anyio
import pytest
from agentrl_env_db.config import DBConfig
from agentrl_env_db.env import DBEnvironment
from agentrl_env_db.sqlite_compat import translate_literals

from agentrl_core.env import Status, assistant_tool_call, play_episode

# std samples the oracle cannot solve on SQLite, and why (see the README).
# std 180 (gold SQL names the table 1952_British_Grand_Prix_0 unquoted) passes since names that
# start with a digit are quoted as MySQL reads them.
SQLITE_STD_MISSES = {
    225: "the stored hash matches neither the table before nor after the gold UPDATE (upstream data)",
}


async def _oracle_misses(env, split):
    misses = {}
    for index in env.index_sets()[split]:
        episode = await play_episode(env, split, index, env.oracle(split, index))
        assert episode.status is Status.COMPLETED
        if episode.reward != 1.0:
            misses[index] = episode
    return misses


def test_oracle_on_every_split():
    async def main():
        env = DBEnvironment()
        try:
            std = await _oracle_misses(env, "std")
            dev = await _oracle_misses(env, "dev")
            gen = await _oracle_misses(env, "gen-train")
        finally:
            await env.aclose()
        assert env.resource_count() == 0
        return std, dev, gen

    std, dev, gen = anyio.run(main)
    assert set(std) == set(SQLITE_STD_MISSES)
    assert dev == {} and gen == {}


async def _session(env, split="std", index=0):
    session = await env.open(split, index)
    await session.start()
    return session


def _sql(query, call_id="call_0"):
    return assistant_tool_call("execute_sql", {"query": query}, call_id=call_id)


def test_observations_are_upstreams_format():
    async def main():
        env = DBEnvironment()
        session = await _session(env)
        try:
            ok = await session.step(_sql("SELECT Notes FROM `Jiu-Jitsu Championships Results` WHERE Method = 'decision'"))
            assert ok.messages == [{"role": "tool", "tool_call_id": "call_0", "content": "[('Women +60kg Bronze',)]"}]
            count = await session.step(_sql("SELECT COUNT(*) FROM `Jiu-Jitsu Championships Results`"))
            assert count.messages[0]["content"] == "[(18,)]"
            everything = await session.step(_sql("SELECT * FROM `Jiu-Jitsu Championships Results`"))
            text = everything.messages[0]["content"]
            assert len(text) == 800 + len("[TRUNCATED]") and text.endswith("[TRUNCATED]")
            assert text.startswith("[('Win', 'Venla Luukkonen', 'Points (11 x 0)'")
            empty = await session.step(_sql("UPDATE `Jiu-Jitsu Championships Results` SET Notes = 'x' WHERE 0"))
            assert empty.messages[0]["content"] == "[]"
            error = await session.step(_sql("SELEC 1"))
            assert error.messages[0]["content"] == 'SQLite execution error: near "SELEC": syntax error'
            assert not error.finish and error.metrics["sql_errors"] == 1 and error.metrics["sql_calls"] == 5
            surrogate = await session.step(_sql("SELECT '\ud800'"))
            assert surrogate.messages[0]["content"] == "Error: the query is not valid text (surrogates not allowed at position 8)."
            two = await session.step(_sql("SELECT 1; SELECT 2"))
            assert two.messages[0]["content"] == "SQLite execution error: You can only execute one statement at a time."
        finally:
            await session.close()

    anyio.run(main)


def test_mysql_literals_and_collation():
    assert translate_literals(r'''SELECT 'a\nb', "x" -- c''') == "SELECT 'a\nb', 'x' -- c"
    assert translate_literals(r'''SELECT 'it\'s', 'it''s', `we"ird` # c''') == '''SELECT 'it''s', 'it''s', `we"ird` -- c'''
    assert translate_literals("SELECT 'unterminated") == "SELECT 'unterminated"

    async def main():
        env = DBEnvironment()
        session = await _session(env, "std", 206)
        try:
            # The stored value is spelled with accents and another dash; MySQL's collation matches it.
            step = await session.step(_sql("SELECT COUNT(*) FROM `Airport Traffic Data` WHERE `Airport` = "
                                           "'montreal-pierre elliott trudeau international airport  '"))
            assert step.messages[0]["content"] == "[(1,)]"
        finally:
            await session.close()

    anyio.run(main)


def test_bad_turns_continue_and_wrong_answers_score_zero():
    async def main():
        env = DBEnvironment(DBConfig(tool_arguments="strict"))
        session = await _session(env)
        try:
            bad = await session.step({"role": "assistant", "content": "",
                                      "tool_calls": [{"id": "c1", "type": "function",
                                                      "function": {"name": "execute_sql", "arguments": '{"sql": 1}'}}]})
            assert bad.status is Status.RUNNING and bad.metrics["invalid_turns"] == 1
            assert "invalid arguments for execute_sql" in bad.messages[0]["content"]
            not_a_list = await session.step(assistant_tool_call("commit_final_answer", {"answers": "x"}))
            assert not_a_list.status is Status.RUNNING and not_a_list.metrics["invalid_turns"] == 2
            final = await session.step(assistant_tool_call("commit_final_answer", {"answers": ["Women +60kg Silver"]}))
            assert final.status is Status.COMPLETED and final.reward == 0.0 and final.metrics["correct"] is False
        finally:
            await session.close()

    anyio.run(main)


def test_round_limit_is_fifteen():
    async def main():
        env = DBEnvironment()
        session = await _session(env)
        try:
            for turn in range(1, 16):
                step = await session.step(_sql("SELECT 1", f"call_{turn}"))
                assert step.finish is (turn == 15)
            assert step.status is Status.TASK_LIMIT_REACHED
        finally:
            await session.close()

    anyio.run(main)


def test_modification_scored_by_table_hash():
    async def main():
        env = DBEnvironment()
        task = env.task("std", 200)
        session = await _session(env, "std", 200)
        try:
            await session.step(_sql(task.gold_sql))
            await session.step(_sql(task.gold_sql.replace("Formula 1", "Formula 2"), "call_1"))  # a later edit
            final = await session.step(assistant_tool_call("commit_final_answer", {"answers": []}, call_id="call_2"))
            assert final.reward == 0.0
        finally:
            await session.close()

    anyio.run(main)


def test_long_query_is_stopped_and_huge_results_are_capped():
    async def main():
        env = DBEnvironment(DBConfig(query_timeout=0.5, max_rows=500))
        session = await _session(env)
        try:
            started = time.monotonic()
            endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"
            step = await session.step(_sql(endless))
            assert time.monotonic() - started < 5
            assert step.messages[0]["content"] == "Error: SQL execution timed out after 0.5 s; the query was stopped."
            assert step.metrics["sql_timeouts"] == 1 and not step.finish
            # 18^4 = 104,976 rows: only max_rows of them are read back.
            t = "`Jiu-Jitsu Championships Results`"
            step = await session.step(_sql(f"SELECT * FROM {t} a, {t} b, {t} c, {t} d", "call_1"))
            assert step.metrics["capped_reads"] == 1 and step.messages[0]["content"].endswith("[TRUNCATED]")
            result = await session.handle.execute(f"SELECT * FROM {t} a, {t} b, {t} c, {t} d")
            assert result.capped and result.rows_read == 500
            ok = await session.step(_sql("SELECT 2", "call_2"))
            assert ok.messages[0]["content"] == "[(2,)]"
        finally:
            await session.close()

    anyio.run(main)


def test_cancel_interrupts_a_running_statement():
    async def main():
        env = DBEnvironment(DBConfig(query_timeout=30))
        session = await _session(env)
        endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"
        started = time.monotonic()
        with anyio.move_on_after(0.3):
            await session.step(_sql(endless))
        await session.close()
        assert time.monotonic() - started < 5
        assert env.resource_count() == 0

    anyio.run(main)


@pytest.mark.parametrize("error_rate", [0.0, 0.5])
def test_oracle_error_rate(error_rate):
    async def main():
        env = DBEnvironment()
        rewards = []
        for index in range(60):
            agent = env.oracle("gen-train", index, error_rate=error_rate, seed=index)
            rewards.append((await play_episode(env, "gen-train", index, agent)).reward)
        return sum(rewards) / len(rewards)

    rate = anyio.run(main)
    assert rate == 1.0 if error_rate == 0 else 0.25 < rate < 0.75


def test_oracle_slips_then_recovers():
    """With error_rate > 0 some correct episodes first send a misspelled statement, get the
    syntax error back, then the right statement: they still win, in one more round."""
    async def main():
        env = DBEnvironment()
        slipped = []
        for index in range(60):
            agent = env.oracle("gen-train", index, error_rate=0.5, seed=index)
            if agent.slip:
                slipped.append((agent, await play_episode(env, "gen-train", index, agent)))
        return slipped

    slipped = anyio.run(main)
    assert 5 <= len(slipped) <= 25  # about 0.5 x 0.5 of 60
    for agent, episode in slipped:
        assert episode.reward == 1.0 and episode.metrics["sql_errors"] == 1
        first = agent.plan[0]["tool_calls"][0]["function"]["arguments"]
        assert agent.plan[0]["tool_calls"][0]["function"]["name"] == "execute_sql"
        assert first.split('"query": "')[1].split(" ")[0] in {"SELEC", "INSER", "UPDAT", "DELET"}
        tool_replies = [m["content"] for m in episode.messages if m["role"] == "tool"]
        assert tool_replies[0].startswith("SQLite execution error:")
    assert all(not env_agent.slip for env_agent in [DBEnvironment().oracle("gen-train", i, error_rate=0.0) for i in range(20)])


def test_sqlite_session_cannot_leave_its_memory_database(tmp_path):
    async def main():
        env = DBEnvironment(DBConfig(sqlite_max_mb=1))
        session = await _session(env)
        target = tmp_path / "escape.db"
        out = []
        try:
            for i, query in enumerate([f"ATTACH DATABASE '{target}' AS x", f"VACUUM INTO '{target}'",
                                       "PRAGMA max_page_count = 100000000", "SELECT load_extension('x')",
                                       "CREATE TABLE big AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 "
                                       "FROM c LIMIT 100000) SELECT randomblob(100) AS b FROM c",
                                       "PRAGMA table_info(`Jiu-Jitsu Championships Results`)"]):
                out.append((await session.step(_sql(query, f"call_{i}"))).messages[0]["content"])
        finally:
            await session.close()
        return out

    out = anyio.run(main)
    assert all(text.startswith("SQLite execution error: ") for text in out[:5]), out
    assert "not authorized" in out[2] and "full" in out[4]
    assert out[5].startswith("[(0, 'Result', 'TEXT', 0, None, 0)")
    assert not (tmp_path / "escape.db").exists()


def test_every_step_says_which_backend_produced_the_result():
    async def main():
        env = DBEnvironment()
        session = await _session(env)
        try:
            step = await session.step(_sql("SELECT 1"))
        finally:
            await session.close()
            await env.aclose()
        return step.metrics["result_source"]

    assert anyio.run(main).startswith("db backend: sqlite (upstream AgentBench ran MySQL 8;")
