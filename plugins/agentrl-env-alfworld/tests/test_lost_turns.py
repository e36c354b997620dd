"""std 108 ("put two peppershaker in drawer"): the episode the issue reported as a divergence.

Its run log has the agent's `take peppershaker 1 from cabinet 2` once, answered twice: "You put
the peppershaker 2 in/on the cabinet 2." (holding peppershaker 2, the take is not admissible and
snaps to the put) and then "You pick up the peppershaker 1 from the cabinet 2.". The second
answer belongs to a repeat of the same turn that the log dropped: the client that wrote it keeps
only messages whose JSON text is new, and the repeat was word for word the same. The engine
answers both sequences exactly as upstream did; the replay restores the lost turn.
"""

from __future__ import annotations

import json

import anyio
from agentrl_env_alfworld.oracle import parse_observation
from agentrl_env_alfworld.transcripts import message_key, read_runs, replay, summarize

from agentrl_core.env import Status, assistant_tool_call

BEFORE = ["go to cabinet 1", "take peppershaker 2 from cabinet 1", "go to cabinet 2", "open cabinet 2"]
TAKE = "take peppershaker 1 from cabinet 2"
AFTER = ["go to drawer 1", "open drawer 1", "put peppershaker 1 in/on drawer 1"]
FINISH = ["go to cabinet 2", "take peppershaker 2 from cabinet 2", "go to drawer 1", "put peppershaker 2 in/on drawer 1"]


def turn(action: str, thought: str) -> dict:
    # As an ollama model sends it: every call has the id call_1.
    return assistant_tool_call("take_action", {"action": action}, call_id="call_1", content=thought)


def thoughts(actions):
    # Distinct thoughts (as in the log), except the repeated take, which the model sent word for word.
    return [f"I need to {a}." if a == TAKE else f"Turn {i}: I need to {a}." for i, a in enumerate(actions)]


async def play(env, actions):
    session = await env.open("std", 108)
    try:
        first = await session.start()
        return first, [await session.step(turn(a, t)) for a, t in zip(actions, thoughts(actions), strict=True)]
    finally:
        await session.close()


def test_the_issue_sequence_answers_as_upstream_would(env):
    """The recorded actions alone: the take snaps to the put, so the agent holds nothing at the
    drawer and its put snaps to taking the cellphone, which is what upstream answers too."""
    _, steps = anyio.run(play, env, [*BEFORE, TAKE, *AFTER])
    text = [parse_observation(s.messages[0]["content"]) for s in steps]
    assert text[4][0] == "You put the peppershaker 2 in/on the cabinet 2."
    assert "examine peppershaker 1" not in text[5][1]
    assert text[7][0] == "You pick up the cellphone 1 from the drawer 1."


def test_the_sequence_with_the_lost_repeat_wins_as_upstream(env):
    _, steps = anyio.run(play, env, [*BEFORE, TAKE, TAKE, *AFTER, *FINISH])
    text = [parse_observation(s.messages[0]["content"]) for s in steps]
    assert text[4][0] == "You put the peppershaker 2 in/on the cabinet 2."
    assert text[5][0] == "You pick up the peppershaker 1 from the cabinet 2."
    assert "examine peppershaker 1" in text[6][1]
    assert text[8][0] == "You put the peppershaker 1 in/on the drawer 1."
    assert [s.status for s in steps] == [Status.RUNNING] * 12 + [Status.COMPLETED]
    assert steps[-1].reward == 1.0


def test_replay_restores_the_turn_a_deduplicating_log_lost(env, tmp_path):
    actions = [*BEFORE, TAKE, TAKE, *AFTER, *FINISH]
    first, steps = anyio.run(play, env, actions)
    conversation = [*first.messages]
    for action, thought, step in zip(actions, thoughts(actions), steps, strict=True):
        conversation += [turn(action, thought), *step.messages]
    kept, seen = [], set()
    for message in conversation:  # what the lossy client writes
        if message_key(message) not in seen:
            seen.add(message_key(message))
            kept.append(message)
    assert len(kept) == len(conversation) - 1  # the repeated take, not its (new) answer
    record = {"index": 108, "output": {"index": 108, "status": "completed",
                                       "result": {"reward": 1, "status": "completed", "messages": kept}}}
    folder = tmp_path / "ollama-test" / "alfworld-std"
    folder.mkdir(parents=True)
    (folder / "runs.jsonl").write_text(json.dumps(record) + "\n")
    [transcript] = read_runs(tmp_path)
    assert (transcript.model, transcript.split, transcript.index, transcript.reward) == ("ollama-test", "std", 108, 1.0)

    async def main():
        return await replay(env, transcript), await replay(env, transcript, restore_lost_turns=False)

    restored, naive = anyio.run(main)
    assert restored.agrees and restored.lost_turns == 1 and restored.status == "completed"
    assert not naive.agrees
    # Without the repeat, the replay parts from the log at the drawer: upstream's agent held the peppershaker.
    assert naive.expected.startswith("The drawer 1 is closed.") and naive.got.startswith("The drawer 1 is closed.")
    assert "examine peppershaker 1" in naive.expected and "examine peppershaker 1" not in naive.got
    summary = summarize([restored])
    assert summary["agree"] == summary["upstream_won_and_won_here"] == summary["agree_with_lost_turns_restored"] == 1
