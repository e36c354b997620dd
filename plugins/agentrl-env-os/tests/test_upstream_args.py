"""Tool arguments read as upstream's os_interaction task reads them (``tool_arguments``).

The recorded turns are from third-party AgentBench-FC runs (gautham1419/Agent-bench-lab,
outputs/2026-02-05-07-48-57_os_ollama, os-std); what upstream did is quoted next to each.
"""

from __future__ import annotations

import json

import anyio
import pytest
from agentrl_env_os import upstream

from agentrl_core.env import assistant_tool_call
from agentrl_core.types import Status

EMPTY = "The output of the OS is empty."


def _call(name, raw_arguments, content="", call_id="call_1"):
    """A turn whose arguments are sent as this exact text (not re-encoded)."""
    return {"role": "assistant", "content": content,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": raw_arguments}}]}


# -- the reading alone (no container) --------------------------------------------------------------


def test_the_first_value_is_taken_whatever_its_key():
    thought_too = _call("bash_action", json.dumps({"script": "mkdir parentDir", "thought": "Creating it."}))
    assert upstream.read_turn(thought_too) == upstream.Bash("call_1", "mkdir parentDir")  # gemma2-9b std 111
    assert upstream.read_turn(_call("bash_action", '{"command": "ls"}')) == upstream.Bash("call_1", "ls")  # qwen-4b std 7
    assert upstream.read_turn(_call("bash_action", '{"thought": "x", "script": "ls"}')) == upstream.Bash("call_1", "x")
    assert upstream.read_turn(_call("finish_action", "{}")) == upstream.Commit("finish_action", "call_1", None)  # qwen-8b std 51
    assert upstream.read_turn(_call("answer_action", '{"answer": 6}')) == upstream.Commit("answer_action", "call_1", 6)
    assert upstream.read_turn(_call("answer_action", '{"reply": "3"}')) == upstream.Commit("answer_action", "call_1", "3")


def test_replies_and_crashes_are_upstreams():
    invalid = upstream.Reply("call_1", "Invalid function call. Please call a tool instead")
    assert upstream.read_turn(_call("bash", "{}")) == invalid  # qwen-4b std 119
    assert upstream.read_turn(_call("my-project", "{}")) == invalid  # qwen-8b std 85
    assert upstream.read_turn(_call("bash_action", "")) == upstream.Reply("call_1", "Expecting value: line 1 column 1 (char 0)")
    assert upstream.read_turn(_call("bash_action", '["ls"]')) == upstream.Reply("call_1", "'list' object has no attribute 'values'")
    # With no text in the turn, upstream looks for a thought in the arguments first.
    assert upstream.read_turn(_call("bash_action", "5")) == upstream.Reply("call_1", "argument of type 'int' is not iterable")
    assert upstream.read_turn(_call("bash_action", "5", content="hm")) == upstream.Reply("call_1", "'int' object has no attribute 'values'")
    crash = upstream.Crash("IndexError: list index out of range")
    assert upstream.read_turn(_call("bash_action", "{}")) == crash  # gemma2-2b std 143: task error upstream
    assert upstream.read_turn(_call("answer_action", "{}")) == crash  # gemma2-2b std 136: task error upstream
    assert isinstance(upstream.read_turn({"role": "assistant", "tool_calls": [{"id": "c"}]}), upstream.Crash)
    assert upstream.read_turn({"role": "assistant", "content": "3"}) is None


def test_a_regex_match_on_an_answer_that_is_not_text_crashes_upstream():
    assert upstream.match_crashes(None, {"regex": "^a"}) and upstream.match_crashes(6, {"regex": "6"})
    assert not upstream.match_crashes("a", {"regex": "^a"})
    assert not upstream.match_crashes(None, {"answer": "a", "strip": True})


# -- in containers ----------------------------------------------------------------------------------


def _std_index(env, start: str) -> int:
    (index,) = [t.index for t in env.tasks("std") if t.description.startswith(start)]
    return index


async def _play(env, index, turns):
    session = await env.open("std", index)
    steps = []
    try:
        await session.start()
        for turn in turns:
            steps.append(await session.step(turn))
            if steps[-1].finish:
                break
    finally:
        await session.close()
    return steps


# qwen-8b, std 51 (upstream's numbering): the permissions set, then finish_action {}: upstream
# evaluates the answer None (its check scripts get "None", which they ignore) and scores it 1.
VIDEOS = [
    _call("bash_action", json.dumps({"script": "find ~/videos -type f -exec chmod 660 {} \\; && "
                                               "find ~/videos -type d -exec chmod 750 {} \\;"})),
    _call("finish_action", "{}", content="Set file permissions to 660 and directory permissions to 750."),
]


@pytest.mark.docker
def test_finish_without_an_answer_is_scored_as_upstream(make_env):
    env = make_env()
    index = _std_index(env, "set all files in ~/videos to be 660")
    ran, finished = anyio.run(_play, env, index, VIDEOS)
    assert ran.messages[0]["content"] == EMPTY
    assert finished.status is Status.COMPLETED and finished.reward == 1.0 and finished.messages == []
    assert finished.metrics["invalid_turns"] == 0 and finished.metrics["lenient_calls"] == 1

    strict = make_env(tool_arguments="strict")
    ran, refused = anyio.run(_play, strict, index, VIDEOS)
    assert refused.status is Status.RUNNING and refused.metrics["invalid_turns"] == 1
    assert refused.messages[0]["content"] == "Error: invalid arguments for finish_action: missing required argument 'thought'"


@pytest.mark.docker
def test_upstreams_turns_in_a_container(make_env):
    env = make_env()
    index = _std_index(env, "As a student learning Linux operating systems, you are tasked to create a simple directory")
    steps = anyio.run(_play, env, index, [
        # gemma2-9b std 111: the extra thought is ignored, the script runs.
        _call("bash_action", json.dumps({"script": "mkdir parentDir\ncd parentDir\n", "thought": "Creating it."})),
        _call("bash_action", '{"script": "pwd"}'),
        _call("bash_action", '{"script": 5}'),  # upstream's Container.execute runs nothing
        _call("bash", "{}"),
        _call("bash_action", "not json"),
        {"role": "assistant", "content": "done?"},
        _call("bash_action", "{}"),  # upstream: IndexError, task error
    ])
    assert [s.messages[0]["content"] if s.messages else None for s in steps] == [
        EMPTY,
        "The output of the OS:\n\n/root/parentDir\n",
        EMPTY,
        "Invalid function call. Please call a tool instead",
        "Expecting value: line 1 column 1 (char 0)",
        "No executable tool calls found. Please call a tool instead",
        None,
    ]
    assert steps[-1].status is Status.AGENT_INVALID_ACTION and steps[-1].reward == 0.0
    assert steps[-1].metrics["upstream_status"] == "task error"
    assert steps[-1].metrics["lenient_calls"] == 1 and steps[-1].metrics["commands"] == 2


@pytest.mark.docker
def test_a_number_answers_a_match_task_wrongly_and_training_sets_stay_strict(make_env):
    env = make_env()
    love = [t.index for t in env.tasks("std") if t.match == {"answer": "love", "strip": True}][0]
    (step,) = anyio.run(_play, env, love, [_call("answer_action", '{"answer": 6}')])  # qwen-8b std 131
    assert step.status is Status.COMPLETED and step.reward == 0.0 and step.metrics["verdict"] == "answer differs"
    (step,) = anyio.run(_play, env, love, [_call("answer_action", '{"reply": "love"}')])
    assert step.status is Status.COMPLETED and step.reward == 1.0

    async def train_turn():
        session = await env.open("train", 0)
        try:
            await session.start()
            return await session.step(assistant_tool_call("finish_action", {}))
        finally:
            await session.close()

    step = anyio.run(train_turn)
    assert step.status is Status.RUNNING and "missing required argument 'thought'" in step.messages[0]["content"]


@pytest.mark.docker
def test_a_replay_restores_the_turns_the_log_lost(make_env):
    from agentrl_env_os import fidelity

    env = make_env(round_limit=3)
    index = _std_index(env, "How many groups are in this UNIX system?")
    # The recording client keeps a message only if its JSON text is new: of three identical turns
    # (an ollama model's calls all have the id call_1) and their identical answers, one of each is left.
    turn = _call("bash_action", '{"script": "echo hi"}')
    episode = fidelity.RecordedEpisode("m", 0, "task limit reached", 0.0, "",
                                       [turn, {"role": "tool", "tool_call_id": "call_1", "content": "The output of the OS:\n\nhi\n"}])
    restored = anyio.run(lambda: fidelity.replay(env, episode, index))
    assert restored.status == "task limit reached" and restored.lost_turns == 2
    assert restored.outputs == ["same", "same", "same"] and restored.all_same
    trusting = anyio.run(lambda: fidelity.replay(env, episode, index, restore_lost_turns=False))
    assert trusting.status == "running" and trusting.lost_turns == 0 and trusting.outputs == ["same"]
