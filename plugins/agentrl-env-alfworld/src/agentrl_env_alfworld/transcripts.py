"""Replay AgentBench-FC run logs through the environment, restoring turns the logs lost.

An AgentBench run writes one ``runs.jsonl`` per model and task: per episode the index, the
final status and reward, and ``messages`` (system, first user message, then the assistant
turns and what the task server answered). Some clients record that conversation through a
set of messages already seen (AgentBench-lab's ``TaskClient.run_sample`` keeps a message only
if its JSON text is new). A model that repeats a turn word for word (same thought, same call,
and every call of an ollama model has the id ``call_1``) then loses that turn from the log, and
so does any answer identical to an earlier one ("Nothing happens." with the same actions, "No
valid tool calls found."). Replaying only the recorded turns plays a different game: in
std 108 the agent's second ``take peppershaker 1 from cabinet 2`` is missing from the log, so
the replay never picks up the peppershaker that upstream's agent held from then on.

:func:`replay` therefore searches for the conversation the log was filtered from: at each
point the next turn is the next recorded assistant message or a copy of an earlier one (a
lost repeat), and every answer of the environment must be the next recorded message or a copy
of one already seen (lost in the log). The episode agrees with upstream when such a
conversation exists and ends with upstream's status and reward. The search replays from the
start whenever it backtracks and stops after ``max_env_steps`` game steps.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from attrs import field, frozen

from agentrl_core.env import Environment, Status
from agentrl_core.env.replay import PrefixReplayer
from agentrl_core.types import Message, Step

# AgentBench task names -> our index sets.
SPLIT_OF_TASK = {"alfworld-std": "std", "alfworld-dev": "dev", "alfworld-env_train": "train"}


class TranscriptError(ValueError):
    """A run log that cannot be read."""


@frozen
class Transcript:
    """One recorded episode: the model, the index, upstream's outcome and its messages."""

    model: str
    split: str
    index: int
    status: str
    reward: float
    messages: list[Message] = field(repr=False)  # everything after the system and first user message
    init: str = field(repr=False, default="")  # the first user message


def read_runs(folder: str | Path, split: str | None = None) -> list[Transcript]:
    """Every episode with a result in ``folder/**/runs.jsonl`` (model = the folder above the task's).

    The index set is ``split`` if given, else taken from the task folder's name
    (``alfworld-std`` -> ``std``); files of other tasks are skipped.
    """
    root = Path(folder)
    if not root.is_dir():
        raise TranscriptError(f"transcript folder {root} does not exist")
    found = []
    for path in sorted(root.rglob("runs.jsonl")):
        target = split or SPLIT_OF_TASK.get(path.parent.name)
        if target is None:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                output = record["output"]
                result = output.get("result")
                if not result or "messages" not in result:
                    continue  # a run error: nothing to replay
                messages = list(result["messages"])
                found.append(
                    Transcript(
                        model=path.parent.parent.name,
                        split=target,
                        index=int(output.get("index", record.get("index"))),
                        status=str(output["status"]),
                        reward=float(result.get("reward") or 0),
                        messages=messages[2:],
                        init=str(messages[1].get("content", "")) if len(messages) > 1 else "",
                    )
                )
            except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
                raise TranscriptError(f"{path}:{number}: not an AgentBench run record ({exc!r})") from exc
    return found


def message_key(message: Mapping[str, Any]) -> str:
    """The identity a deduplicating client gives a message: its JSON text with sorted keys."""
    return json.dumps(message, sort_keys=True, ensure_ascii=False)


def _answer_key(message: Mapping[str, Any]) -> str:
    # Our answers carry only these fields; recorded ones may carry more (e.g. a name).
    return message_key({k: message[k] for k in ("role", "content", "tool_call_id") if k in message})


@frozen
class ReplayResult:
    transcript: Transcript
    agrees: bool
    first_prompt_matches: bool
    lost_turns: int = 0  # assistant turns the log had lost and the search restored
    status: str = ""  # ours, at the end of the best replay found
    reward: float = 0.0
    rounds: int = 0
    env_steps: int = 0
    exhausted: bool = False  # the search stopped at max_env_steps
    # Where the replay that got furthest through the log parted from it.
    diverged_at: int | None = None  # position in transcript.messages
    expected: str | None = None
    got: str | None = None


async def replay(env: Environment, transcript: Transcript, *, max_env_steps: int = 400,
                 restore_lost_turns: bool = True) -> ReplayResult:
    """Replay ``transcript`` through ``env``; see the module docstring for the search.

    With ``restore_lost_turns=False`` only the recorded assistant turns are played, each
    answer compared with the message recorded right after it (what a naive replay does).
    """
    recorded = transcript.messages
    player = PrefixReplayer(env, transcript.split, transcript.index)
    best: dict[str, Any] = {"position": -1}
    try:
        await player.restart()
        assert player.first is not None
        first_ok = player.first.messages[-1].get("content") == transcript.init
        seen = {_answer_key({"role": "user", "content": transcript.init})}
        if restore_lost_turns:
            found = await _search(player, recorded, transcript, 0, [], (), seen, best, max_env_steps)
        else:
            found = await _naive(player, recorded, transcript, best)
        final = found or best.get("step")
        return ReplayResult(
            transcript=transcript,
            agrees=bool(found) and first_ok,
            first_prompt_matches=first_ok,
            lost_turns=best.get("lost", 0) if found else 0,
            status=str(final.status) if final is not None else str(Status.RUNNING),
            reward=final.reward if final is not None else 0.0,
            rounds=int(final.metrics.get("rounds", 0)) if final is not None else 0,
            env_steps=player.env_steps,
            exhausted=player.env_steps >= max_env_steps,
            diverged_at=None if found else best.get("position"),
            expected=None if found else best.get("expected"),
            got=None if found else best.get("got"),
        )
    finally:
        await player.aclose()


def _note(best: dict[str, Any], position: int, step: Step | None, expected: str | None, got: str | None) -> None:
    if position > best["position"]:
        best.update(position=position, step=step, expected=expected, got=got)


def _ends_as_upstream(step: Step, transcript: Transcript) -> bool:
    return str(step.status) == transcript.status and step.reward == transcript.reward


async def _naive(player: PrefixReplayer, recorded: Sequence[Message], transcript: Transcript,
                 best: dict[str, Any]) -> Step | None:
    """Play every recorded assistant turn (until the episode ends); the final step if all agreed."""
    turns: list[Message] = []
    keys: list[str] = []
    step: Step | None = None
    mismatch: tuple[int, str | None, str | None] | None = None
    for position, message in enumerate(recorded):
        if message.get("role") != "assistant":
            continue
        if step is not None and step.finish:
            mismatch = mismatch or (position, message.get("content"), "the episode had ended")
            break
        turns.append(message)
        keys.append(message_key(message))
        step = await player.answer(turns, tuple(keys))
        following = recorded[position + 1] if position + 1 < len(recorded) else None
        got = step.messages[0] if step.messages else {}
        if following is not None and following.get("role") != "assistant" and _answer_key(got) != _answer_key(following):
            mismatch = mismatch or (position + 1, following.get("content"), got.get("content"))
    if mismatch is None and (step is None or not _ends_as_upstream(step, transcript)):
        mismatch = (len(recorded), f"{transcript.status} (reward {transcript.reward:g})",
                    f"{step.status if step else 'running'} (reward {step.reward if step else 0:g})")
    if mismatch is None:
        return step
    best.update(position=mismatch[0], step=step, expected=mismatch[1], got=mismatch[2])
    return None


async def _search(player: PrefixReplayer, recorded: Sequence[Message], transcript: Transcript, position: int,
                  turns: list[Message], keys: tuple[str, ...], seen: set[str], best: dict[str, Any],
                  max_env_steps: int, lost: int = 0) -> Step | None:
    """Depth-first: the recorded next turn first, then lost repeats (most recent first)."""
    candidates: list[tuple[Message, bool]] = []
    if position < len(recorded) and recorded[position].get("role") == "assistant":
        candidates.append((recorded[position], True))
    repeats: dict[str, Message] = {}
    for message in reversed(recorded[:position]):
        if message.get("role") == "assistant":
            repeats.setdefault(message_key(message), message)
    candidates.extend((message, False) for message in repeats.values())
    for turn, is_recorded in candidates:
        if player.env_steps >= max_env_steps:
            return None
        turn_key = message_key(turn)
        step = await player.answer([*turns, turn], (*keys, turn_key))
        at = position + (1 if is_recorded else 0)
        now_seen = seen | {turn_key}
        answer = step.messages[0] if step.messages else {}
        answer_key = _answer_key(answer)
        if answer_key not in now_seen:  # new, so it must be the next recorded message
            following = recorded[at] if at < len(recorded) else None
            if following is None or following.get("role") == "assistant" or _answer_key(following) != answer_key:
                _note(best, at, step, None if following is None else following.get("content"), answer.get("content"))
                continue
            at += 1
            now_seen = now_seen | {answer_key}
        _note(best, at, step, None, None)
        if step.finish:
            if at == len(recorded) and _ends_as_upstream(step, transcript):
                best["lost"] = lost + (0 if is_recorded else 1)
                return step
            expected = (f"{transcript.status} (reward {transcript.reward:g})" if at == len(recorded)
                        else recorded[at].get("content"))
            _note(best, at + 1 if at == len(recorded) else at, step, expected, f"{step.status} (reward {step.reward:g})")
            continue
        found = await _search(player, recorded, transcript, at, [*turns, turn], (*keys, turn_key), now_seen, best,
                              max_env_steps, lost + (0 if is_recorded else 1))
        if found is not None:
            return found
    return None


def summarize(results: Iterable[ReplayResult]) -> dict[str, Any]:
    """Agreement counts: episodes, identical ones, upstream's wins won here, statuses."""
    results = list(results)
    won = [r for r in results if r.transcript.reward >= 1]
    return {
        "episodes": len(results),
        "agree": sum(r.agrees for r in results),
        "agree_with_lost_turns_restored": sum(r.agrees and r.lost_turns > 0 for r in results),
        "lost_turns_restored": sum(r.lost_turns for r in results if r.agrees),
        "first_prompt_matches": sum(r.first_prompt_matches for r in results),
        "status_agrees": sum(r.status == r.transcript.status for r in results),
        "reward_agrees": sum(r.reward == r.transcript.reward for r in results),
        "upstream_won": len(won),
        "upstream_won_and_won_here": sum(r.reward >= 1 for r in won),
        "search_exhausted": sum(r.exhausted for r in results),
        "env_steps": sum(r.env_steps for r in results),
    }
