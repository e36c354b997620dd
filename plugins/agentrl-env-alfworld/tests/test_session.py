"""AgentBench-FC semantics through the real environment (std index 0: put a pencil in shelf).

Its walkthrough: go to desk 2, take pencil 2 from desk 2, go to shelf 5, put pencil 2 in/on shelf 5.
"""

from __future__ import annotations

import anyio
from agentrl_env_alfworld.actions import NO_TOOL_CALL, NO_VALID_TOOL_CALL, SYSTEM_PROMPT
from agentrl_env_alfworld.oracle import parse_observation

from agentrl_core.env import Status, assistant_tool_call

WIN = ["go to desk 2", "take pencil 2 from desk 2", "go to shelf 5", "put pencil 2 in/on shelf 5"]


def act(action: str, call_id: str = "call_0") -> dict:
    return assistant_tool_call("take_action", {"action": action}, call_id=call_id)


def run(coro_fn):
    return anyio.run(coro_fn)


def test_first_messages(env):
    async def main():
        session = await env.open("std", 0)
        try:
            first = await session.start()
        finally:
            await session.close()
        return first

    first = run(main)
    system, user = first.messages
    assert system == {"role": "system", "content": SYSTEM_PROMPT}
    assert user["role"] == "user"
    assert user["content"].startswith("Here is your task. You are in the middle of a room. Looking quickly around you")
    assert "Welcome to TextWorld" not in user["content"]
    assert "\nYour task is to: put a pencil in shelf. AVAILABLE ACTIONS: go to bed 1\n" in user["content"]
    assert user["content"].endswith("go to shelf 6\ninventory\nlook\n")
    assert first.status is Status.RUNNING


def test_win_snapping_and_observations(env):
    async def main():
        session = await env.open("std", 0)
        steps = []
        try:
            await session.start()
            # upper case and a second line, then a paraphrase that snaps to "take pencil 2 from desk 2"
            for action in ["GO TO DESK 2\nand then look around", "pick the pencil 2 from desk 2", WIN[2], WIN[3]]:
                steps.append(await session.step(act(action)))
        finally:
            await session.close()
        return steps

    steps = run(main)
    observation, admissible = parse_observation(steps[0].messages[0]["content"])
    assert observation.startswith("On the desk 2, you see")  # "You arrive at loc N. " is dropped
    assert "take pencil 2 from desk 2" in admissible
    assert steps[0].messages[0]["role"] == "tool" and steps[0].messages[0]["tool_call_id"] == "call_0"
    assert parse_observation(steps[1].messages[0]["content"])[0] == "You pick up the pencil 2 from the desk 2."
    assert [s.status for s in steps] == [Status.RUNNING] * 3 + [Status.COMPLETED]
    assert steps[-1].reward == 1.0
    assert parse_observation(steps[-1].messages[0]["content"])[0] == "You put the pencil 2 in/on the shelf 5."
    assert steps[-1].metrics["snapped_actions"] == 1
    assert steps[-1].metrics["actions"] == 4


def test_turn_without_tool_call_does_not_stick(make_env):
    """termination 'agentrl': bad turns never change the status of a win (upstream's would)."""
    env = make_env(termination="agentrl", concurrency=1)

    async def main():
        session = await env.open("std", 0)
        try:
            await session.start()
            bad = await session.step({"role": "assistant", "content": "I will go to the desk."})
            malformed = await session.step({
                "role": "assistant", "content": "",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "take_action", "arguments": "{}"}}],
            })
            steps = [await session.step(act(a)) for a in WIN]
        finally:
            await session.close()
        return bad, malformed, steps

    bad, malformed, steps = run(main)
    assert bad.messages == [{"role": "user", "content": NO_TOOL_CALL}]
    assert bad.status is Status.RUNNING and bad.metrics["invalid_turns"] == 1
    assert malformed.messages[0]["role"] == "tool" and "missing required argument 'action'" in malformed.messages[0]["content"]
    assert malformed.status is Status.RUNNING
    assert steps[-1].status is Status.COMPLETED and steps[-1].reward == 1.0
    assert steps[-1].metrics["invalid_turns"] == 2 and steps[-1].metrics["rounds"] == 6


def tool_call(name: str, arguments: str, call_id: str = "call_1") -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}


def test_upstream_termination_reads_turns_and_keeps_their_status(env):
    """std plays AgentBench-FC's loop exactly: any tool's first argument is the action, and the
    status a bad turn sets is the one a later win reports (reward 1), as upstream's task.py."""

    async def play(turns):
        session = await env.open("std", 0)
        try:
            await session.start()
            return [await session.step(turn) for turn in turns]
        finally:
            await session.close()

    async def main():
        no_call = await play([{"role": "assistant", "content": "I will go to the desk."}, *map(act, WIN)])
        invalid = await play([
            tool_call("go_to_desk", '{"target": "go to desk 2"}'),  # another tool name: played
            tool_call("take_action", "{}"),  # no argument: upstream's "no valid tool calls"
            tool_call("take_action", '{"action": 2}'),  # not a string: the same
            *map(act, WIN[1:]),
        ])
        return no_call, invalid

    no_call, invalid = run(main)
    assert no_call[0].messages == [{"role": "user", "content": NO_TOOL_CALL}]
    assert [s.status for s in no_call[:-1]] == [Status.RUNNING] * 4
    assert no_call[-1].status is Status.AGENT_VALIDATION_FAILED and no_call[-1].reward == 1.0
    assert no_call[-1].metrics["invalid_turns"] == 1 and no_call[-1].metrics["rounds"] == 5

    played = invalid[0].messages[0]
    assert played["role"] == "tool" and played["tool_call_id"] == "call_1"
    assert parse_observation(played["content"])[0].startswith("On the desk 2, you see")
    assert invalid[1].messages == invalid[2].messages == [{"role": "user", "content": NO_VALID_TOOL_CALL}]
    assert invalid[-1].status is Status.AGENT_INVALID_ACTION and invalid[-1].reward == 1.0
    assert invalid[-1].metrics["invalid_turns"] == 2 and invalid[-1].metrics["actions"] == 4


def test_termination_auto_follows_the_split(make_env):
    auto, agentrl, upstream = (make_env(termination=t, concurrency=1) for t in ("auto", "agentrl", "upstream"))

    async def main():
        sessions = {
            "auto std": await auto.open("std", 0),
            "auto dev": await auto.open("dev", 0),
            "auto train": await auto.open("train", auto.index_sets()["train"][0]),
            "agentrl std": await agentrl.open("std", 0),
            "upstream train": await upstream.open("train", upstream.index_sets()["train"][0]),
        }
        return {name: s.upstream for name, s in sessions.items()}  # never started: nothing to close

    assert run(main) == {
        "auto std": True, "auto dev": True, "auto train": False, "agentrl std": False, "upstream train": True,
    }


def test_nothing_happens_continues(env):
    async def main():
        session = await env.open("std", 0)
        try:
            await session.start()
            return await session.step(act("xyzzy"))
        finally:
            await session.close()

    step = run(main)
    observation, admissible = parse_observation(step.messages[0]["content"])
    assert observation == "Nothing happens."
    assert "go to desk 2" in admissible
    assert step.status is Status.RUNNING and step.metrics["nothing_happens"] == 1


def test_repeated_actions_end_the_episode_as_upstream(env):
    """Upstream checks once more than three actions were played: the 4th identical one fails."""

    async def play(actions):
        session = await env.open("std", 0)
        statuses = []
        try:
            await session.start()
            for action in actions:
                step = await session.step(act(action))
                statuses.append(step.status)
                if step.finish:
                    return statuses, step
        finally:
            await session.close()
        return statuses, step

    async def main():
        return (
            await play(["look"] * 5),
            await play(["go to desk 1", "inventory", "inventory", "inventory"]),
            await play(["look", "LOOK", "look", "Look", "look"]),  # the raw texts differ: no repetition
        )

    (five, last), (mixed, mixed_last), (cased, _) = run(main)
    assert five == [Status.RUNNING] * 3 + [Status.AGENT_INVALID_ACTION]
    assert last.reward == 0.0 and last.metrics["repeated_action"] == "look"
    assert mixed == [Status.RUNNING] * 3 + [Status.AGENT_INVALID_ACTION]
    assert cased == [Status.RUNNING] * 5


def test_step_limit(env):
    async def main():
        session = await env.open("std", 0)
        statuses = []
        try:
            await session.start()
            for i in range(20):
                step = await session.step(act("look" if i % 2 else "inventory"))
                statuses.append(step.status)
        finally:
            await session.close()
        return statuses, step

    statuses, last = run(main)
    assert statuses == [Status.RUNNING] * 19 + [Status.TASK_LIMIT_REACHED]
    assert last.reward == 0.0 and last.metrics["rounds"] == 20


def test_native_wording_plays_to_a_win(make_env):
    env = make_env(wording="native", concurrency=1)

    async def main():
        from agentrl_core.env import play_episode

        return await play_episode(env, "std", 0, env.oracle("std", 0))

    episode = run(main)
    assert episode.status is Status.COMPLETED and episode.reward == 1.0
    assert any("move pencil 2 to shelf 5" in m.get("content", "") for m in episode.messages if m["role"] == "tool")
