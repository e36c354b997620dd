"""Tool arguments read as upstream's dbbench task reads them (``tool_arguments``), on SQLite.

The recorded turns are from third-party AgentBench-FC runs (gautham1419/Agent-bench-lab,
outputs/2026-02-05-01-13-31, dbbench-std): what upstream answered is quoted next to each.
"""

from __future__ import annotations

import json

import anyio
import pytest
from agentrl_env_db.config import DBConfig
from agentrl_env_db.env import DBEnvironment

from agentrl_core.env import Status, assistant_tool_call


@pytest.fixture(params=["sqlite", pytest.param("mysql", marks=pytest.mark.mariadb)])
def backend(request) -> DBConfig:
    """The default config of either backend (MariaDB: the session's private server)."""
    if request.param == "sqlite":
        return DBConfig()
    return DBConfig(backend="mysql", url=request.getfixturevalue("mariadb").url)


def _call(name, raw_arguments, call_id="call_1", content=""):
    """A turn whose arguments are sent as this exact text (not re-encoded)."""
    return {"role": "assistant", "content": content,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": raw_arguments}}]}


async def _play(config, split, index, turns):
    env = DBEnvironment(config)
    session = await env.open(split, index)
    steps = []
    try:
        await session.start()
        for turn in turns:
            steps.append(await session.step(turn))
            if steps[-1].finish:
                break
    finally:
        await session.close()
        await env.aclose()
    return steps


# gemma2-9b, std 288/281/244/200: upstream ran the value of the key "query:" (trailing colon) and
# the episode was won (reward 1, completed).
QUERY_COLON = {
    288: "UPDATE Awards SET Year = '2010' WHERE Recipient = 'Gabriella Cilmi' AND Award = 'ARIA Music Awards'",
    281: "UPDATE Monogram_Town_State SET State='Arizona' WHERE Monogram = 'T'",
    244: "UPDATE Monarchies SET Note = 'Former monarch' WHERE Name = 'Mswati III';",
    200: "UPDATE car_racing_schedule SET Class='Formula 1', Circuit='Atlanta Motor Speedway' WHERE Race='Grand Prix of Atlanta'",
}


@pytest.mark.parametrize("index", sorted(QUERY_COLON))
def test_a_misspelled_key_runs_its_value_on_std_as_upstream(index, backend):
    turns = [_call("execute_sql", json.dumps({"query:": QUERY_COLON[index]})),
             _call("commit_final_answer", '{"answers": [""]}')]
    ran, committed = anyio.run(_play, backend, "std", index, turns)
    assert ran.messages == [{"role": "tool", "tool_call_id": "call_1", "content": "[]"}]  # upstream's reply
    assert ran.metrics["invalid_turns"] == 0 and ran.metrics["lenient_calls"] == 1
    assert committed.status is Status.COMPLETED and committed.reward == 1.0
    assert committed.messages == []  # upstream sends nothing after commit_final_answer


def test_strict_mode_refuses_the_misspelled_key():
    turns = [_call("execute_sql", json.dumps({"query:": QUERY_COLON[288]})),
             _call("commit_final_answer", '{"answers": [""]}')]
    refused, committed = anyio.run(_play, DBConfig(tool_arguments="strict"), "std", 288, turns)
    assert refused.messages[0]["content"] == (
        "Error: invalid arguments for execute_sql: missing required argument 'query'")
    assert refused.metrics["invalid_turns"] == 1 and refused.metrics["lenient_calls"] == 0
    assert committed.status is Status.COMPLETED and committed.reward == 0.0  # the table was never updated


def test_upstreams_replies_to_calls_it_cannot_run(backend):
    turns = [
        _call("execute_sql", "{}"),  # gemma2-2b std 293
        _call("execute_sql", '{"answers": ["10"]}'),  # qwen-4b std 158: a list reaches MySQL's driver
        _call("execute_sql", '{"query": 7}'),
        _call("execute_sql", '{"query": ""}'),  # the driver runs nothing for an empty statement
        _call("execute_sql", '{"query": null}'),
        _call("execute_sql", "[1]"),
        _call("execute_sql", '{"query": "SELECT 1'),
        _call("run_sql", '{"query": "SELECT 1"}'),
        {"role": "assistant", "content": "SELECT 1"},
        _call("execute_sql", '{"query": "SELECT 1", "thought": "check"}'),  # the first value is the query
    ]
    steps = anyio.run(_play, backend, "std", 0, turns)
    assert [s.messages[0]["content"] for s in steps] == [
        "Error executing query: list index out of range",
        "'list' object has no attribute 'encode'",
        "'int' object has no attribute 'encode'",
        "[]",
        "[]",
        "Error executing query: 'list' object has no attribute 'values'",
        "Error: Failed to parse tool call. Tool call format is incorrect.",
        "Invalid function call. Please call a tool instead.",
        "Internal error: No tool calls found despite finish reason.",
        "[(1,)]",
    ]
    assert [s.messages[0]["role"] for s in steps][-2:] == ["user", "tool"]
    assert all(s.status is Status.RUNNING for s in steps)
    assert steps[-1].metrics["invalid_turns"] == 8 and steps[-1].metrics["lenient_calls"] == 1


def test_a_final_answer_is_the_first_value_whatever_its_key():
    # std 0 asks which notes go with the 'decision' method: [('Women +60kg Bronze',)].
    (step,) = anyio.run(_play, DBConfig(), "std", 0, [_call("commit_final_answer", '{"answer": "Women +60kg Bronze"}')])
    assert step.status is Status.COMPLETED and step.reward == 1.0 and step.messages == []
    assert step.metrics["invalid_turns"] == 0 and step.metrics["lenient_calls"] == 1


@pytest.mark.parametrize("raw", ["{}", '{"answers": 3}', '{"answers": {"a": 1}}', '["x"]'])
def test_final_answers_upstream_crashes_on_end_the_episode_as_an_agent_failure(raw):
    # Upstream raises in its own task (IndexError, TypeError on answer[:100], AttributeError) and
    # reports "task error"; here the episode ends with reward 0 and says what upstream reported.
    (step,) = anyio.run(_play, DBConfig(), "std", 0, [_call("commit_final_answer", raw)])
    assert step.status is Status.AGENT_INVALID_ACTION and step.reward == 0.0 and step.messages == []
    assert step.metrics["upstream_status"] == "task error"


@pytest.mark.parametrize("raw", ['{"answers": 0}', '{"answers": ""}', '{"answers": "Women +60kg Bronze"}'])
def test_empty_and_string_answers_are_scored_as_upstream(raw):
    (step,) = anyio.run(_play, DBConfig(), "std", 0, [_call("commit_final_answer", raw)])
    assert step.status is Status.COMPLETED and step.reward == float("Bronze" in raw)


def test_training_sets_default_to_strict_and_std_can_be_strict_too():
    (gen,) = anyio.run(_play, DBConfig(), "gen-train", 0, [_call("execute_sql", '{"query:": "SELECT 1"}')])
    assert gen.messages[0]["content"].startswith("Error: invalid arguments for execute_sql")
    (forced,) = anyio.run(_play, DBConfig(tool_arguments="upstream"), "gen-train", 0,
                          [_call("execute_sql", '{"query:": "SELECT 1"}')])
    assert forced.messages[0]["content"] == "[(1,)]"
    (text,) = anyio.run(_play, DBConfig(tool_arguments="strict"), "std", 0, [{"role": "assistant", "content": "hi"}])
    assert text.messages[0]["role"] == "user" and text.messages[0]["content"].startswith("Error: no tool call found")


def test_a_schema_following_commit_sends_nothing_on_every_split():
    (step,) = anyio.run(_play, DBConfig(), "gen-train", 0, [assistant_tool_call("commit_final_answer", {"answers": []})])
    assert step.finish and step.messages == []
