"""Replay episodes that AgentBench-FC's own task server recorded: same prompts, same observations.

The data (tests/data, see its README) holds the model's action arguments and upstream's tool
messages; the environment must answer every action with exactly upstream's text. These eight
episodes lost no turns in their log; tests/test_lost_turns.py covers logs that did.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from agentrl_core.env import Status, assistant_tool_call

EPISODES = [json.loads(line) for line in (Path(__file__).parent / "data" / "agentbench_fc_alfworld_std.jsonl").open()]


@pytest.mark.parametrize("episode", EPISODES, ids=lambda e: f"{e['model']}-std{e['index']}")
def test_replay_matches_upstream(env, episode):
    async def main():
        session = await env.open("std", episode["index"])
        replies = []
        try:
            first = await session.start()
            for raw, _ in episode["steps"]:
                assert session.status is Status.RUNNING, "the episode ended before upstream's did"
                replies.append(await session.step(assistant_tool_call("take_action", {"action": raw})))
        finally:
            await session.close()
        return first, replies

    first, replies = anyio.run(main)
    assert first.messages[1]["content"] == episode["init"]
    for (raw, expected), step in zip(episode["steps"], replies, strict=True):
        assert step.messages[0]["content"] == expected, raw
    assert all(step.status is Status.RUNNING for step in replies[:-1])
    last, raws = replies[-1], [raw for raw, _ in episode["steps"]]
    if episode["upstream_reward"] == 1:
        assert last.status is Status.COMPLETED and last.reward == 1.0
    if len(raws) > 3 and len(set(raws[-3:])) == 1:
        assert last.status is Status.AGENT_INVALID_ACTION and last.reward == 0.0


def test_the_sticky_failure_episode(env, make_env):
    """Upstream won std/40 (reward 1) but reported 'agent validation failed' after one turn
    without a tool call. termination 'upstream' (the default for std) reports the same; with
    'agentrl' that turn gets its message and the win is 'completed'."""
    episode = next(e for e in EPISODES if e["model"] == "qwen-8b" and e["index"] == 40)
    assert episode["upstream_status"] == "agent validation failed" and episode["upstream_reward"] == 1

    async def main(environment):
        session = await environment.open("std", 40)
        try:
            await session.start()
            *before, final = [raw for raw, _ in episode["steps"]]
            for raw in before:
                await session.step(assistant_tool_call("take_action", {"action": raw}))
            bad = await session.step({"role": "assistant", "content": "I should put the apple in the garbage can."})
            assert bad.status is Status.RUNNING
            return await session.step(assistant_tool_call("take_action", {"action": final}))
        finally:
            await session.close()

    upstream = anyio.run(main, env)
    assert upstream.status is Status.AGENT_VALIDATION_FAILED and upstream.reward == 1.0
    fixed = anyio.run(main, make_env(termination="agentrl", concurrency=1))
    assert fixed.status is Status.COMPLETED and fixed.reward == 1.0
    assert fixed.metrics["invalid_turns"] == upstream.metrics["invalid_turns"] == 1
