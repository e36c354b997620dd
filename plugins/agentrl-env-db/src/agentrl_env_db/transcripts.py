"""Replay AgentBench-FC run logs (``dbbench-std``) through the environment, restoring lost turns.

An AgentBench run writes one ``runs.jsonl`` per model and task: per episode the index, the
final status and reward, and ``messages`` (system, first user message, then the assistant
turns and what the task server answered). The client of the runs we compare with
(AgentBench-lab's ``TaskClient.run_sample``) keeps a message only if its JSON text is new, so a
model that repeats a call word for word (every call of an ollama model has the id ``call_1``)
loses that turn from the log, and so does an answer identical to an earlier one. Replaying only
the recorded turns then plays a different episode: fewer rounds (a ``task limit reached`` log
of 15 rounds may hold 3 turns), or a repeated ``INSERT`` that upstream ran twice.

:func:`replay` searches, as ALFWorld's replay does (``agentrl_env_alfworld.transcripts``), for
the conversation the log was filtered from: at each point the next turn is the next recorded
assistant message or a copy of an earlier one (a lost repeat), and every answer of the
environment must be the next recorded message or a copy of one already seen (lost in the log).
It backtracks by replaying from the start (a new database) and stops after ``max_env_steps``
steps. Answers are compared as text, except for the session's database name that MySQL's error
messages quote (random upstream and here). Outcomes, in order:

* ``agrees``: such a conversation exists and ends with upstream's status and reward;
* ``observations_agree``: such a conversation exists (every answer as upstream's) but ends
  otherwise (scoring differs);
* neither: the answers differ somewhere; status and reward are then those of the recorded turns
  played once in order and the last one repeated until the episode ends (the usual lost turns:
  a model that loops).

Upstream's ``task error`` for a call its task crashed on is ours ``agent invalid action`` with
``metrics.upstream_status``; that status is what is compared.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from attrs import field, frozen

from agentrl_core.env import Environment
from agentrl_core.env.replay import PrefixReplayer
from agentrl_core.types import Message, Step

# AgentBench task names -> our index sets.
SPLIT_OF_TASK = {"dbbench-std": "std", "dbbench-dev": "dev"}


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
    (``dbbench-std`` -> ``std``); files of other tasks are skipped.
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
                if not result or not result.get("messages"):
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


# A session's database name, upstream's (dbbench_<uuid>) or ours (names.SessionName), as error
# messages quote it ("Table 'dbbench_....Olympics' doesn't exist"): random on both sides.
_DATABASE_NAME = re.compile(r"'(?:dbbench_[0-9a-f]{8}(?:_[0-9a-f]{4}){3}_[0-9a-f]{12}|[a-z][a-z0-9]{0,4}_[0-9a-f]{6}_\d+_[0-9a-z]+_[0-9a-z]+)\.")


def _answer_key(message: Mapping[str, Any]) -> str:
    # Our answers carry only these fields; recorded ones may carry more.
    kept = {k: message[k] for k in ("role", "content", "tool_call_id") if k in message}
    if isinstance(kept.get("content"), str):
        kept["content"] = _DATABASE_NAME.sub("'<database>.", kept["content"])
    return message_key(kept)


def upstream_status(step: Step) -> str:
    """The status upstream would report for ``step`` (``task error`` where its task crashed)."""
    return str(step.metrics.get("upstream_status") or step.status)


@frozen
class ReplayResult:
    transcript: Transcript
    agrees: bool  # every answer as upstream's, and upstream's status and reward
    observations_agree: bool  # every answer as upstream's
    first_prompt_matches: bool
    lost_turns: int = 0  # assistant turns the log had lost and the search restored
    status: str = ""  # ours (as upstream would name it), from the conversation found or the plain replay
    reward: float = 0.0
    env_steps: int = 0
    exhausted: bool = False  # a search stopped at max_env_steps
    # Where the search that got furthest through the log parted from it.
    diverged_at: int | None = None  # position in transcript.messages
    expected: str | None = None
    got: str | None = None


class _Search:
    """Depth-first search for the conversation a deduplicated log was filtered from."""

    def __init__(self, player: PrefixReplayer, transcript: Transcript, *, max_env_steps: int, outcome: bool,
                 restore: bool = True) -> None:
        self.player, self.transcript = player, transcript
        self.restore = restore  # False: only the recorded turns, each answer the next recorded message
        self.recorded = transcript.messages
        self.budget = player.env_steps + max_env_steps
        self.outcome = outcome  # also require upstream's status and reward at the end
        self.best: dict[str, Any] = {"position": -1}
        self.lost = 0  # of the conversation found
        self.exhausted = False
        self.found: Step | None = None

    def note(self, position: int, expected: str | None, got: str | None) -> None:
        if position > self.best["position"]:
            self.best.update(position=position, expected=expected, got=got)

    def ends_as_upstream(self, step: Step) -> bool:
        return upstream_status(step) == self.transcript.status and step.reward == self.transcript.reward

    async def run(self) -> Step | None:
        seen = {_answer_key({"role": "user", "content": self.transcript.init})}
        self.found = await self._from(0, [], (), seen, 0)
        return self.found

    async def _from(self, position: int, turns: list[Message], keys: tuple[str, ...], seen: set[str],
                    lost: int) -> Step | None:
        recorded = self.recorded
        candidates: list[tuple[Message, bool]] = []
        if position < len(recorded) and recorded[position].get("role") == "assistant":
            candidates.append((recorded[position], True))
        repeats: dict[str, Message] = {}
        for message in reversed(recorded[:position] if self.restore else ()):
            if message.get("role") == "assistant":
                repeats.setdefault(message_key(message), message)
        candidates.extend((message, False) for message in repeats.values())
        for turn, is_recorded in candidates:
            if self.player.env_steps >= self.budget:
                self.exhausted = True
                return None
            turn_key = message_key(turn)
            step = await self.player.answer([*turns, turn], (*keys, turn_key))
            at = position + (1 if is_recorded else 0)
            now_seen = seen | {turn_key}
            for answer in step.messages:
                answer_key = _answer_key(answer)
                if answer_key in now_seen and self.restore:
                    continue  # identical to a message already kept: lost in the log
                following = recorded[at] if at < len(recorded) else None
                if following is None or following.get("role") == "assistant" or _answer_key(following) != answer_key:
                    break
                at += 1
                now_seen = now_seen | {answer_key}
            else:
                answer = None
            if answer is not None:
                following = recorded[at] if at < len(recorded) else None
                self.note(at, None if following is None else str(following.get("content")), str(answer.get("content")))
                continue
            self.note(at, None, None)
            restored = lost + (0 if is_recorded else 1)
            # Trusting the log, its end is the end; restoring, lost repeats may follow it.
            if step.finish or (not self.outcome and not self.restore and at == len(recorded)):
                if at == len(recorded) and (not self.outcome or self.ends_as_upstream(step)):
                    self.lost = restored
                    return step
                expected = (f"{self.transcript.status} (reward {self.transcript.reward:g})" if at == len(recorded)
                            else str(recorded[at].get("content")))
                self.note(at + 1 if at == len(recorded) else at, expected,
                          f"{upstream_status(step)} (reward {step.reward:g})")
                continue
            found = await self._from(at, [*turns, turn], (*keys, turn_key), now_seen, restored)
            if found is not None:
                return found
        return None


async def _plain(env: Environment, transcript: Transcript) -> Step | None:
    """The recorded assistant turns played once, in order, then the last one again until the
    episode ends (a model that loops loses its repeats from the log); the last step."""
    session = await env.open(transcript.split, transcript.index)
    step = None
    try:
        await session.start()
        turns = [m for m in transcript.messages if m.get("role") == "assistant"]
        for turn in turns:
            step = await session.step(turn)
            if step.finish:
                return step
        while turns and not step.finish:
            step = await session.step(turns[-1])
    finally:
        await session.close()
    return step


async def replay(env: Environment, transcript: Transcript, *, max_env_steps: int = 400,
                 restore_lost_turns: bool = True) -> ReplayResult:
    """Replay ``transcript`` through ``env``; see the module docstring (each search gets ``max_env_steps``).

    With ``restore_lost_turns=False`` only the recorded turns are played, each answer compared
    with the message recorded right after it (what a replay that trusts the log does).
    """
    player = PrefixReplayer(env, transcript.split, transcript.index)
    try:
        await player.restart()
        assert player.first is not None
        first_ok = player.first.messages[-1].get("content") == transcript.init
        exact = _Search(player, transcript, max_env_steps=max_env_steps, outcome=True, restore=restore_lost_turns)
        searches = [exact]
        if await exact.run() is None:
            loose = _Search(player, transcript, max_env_steps=max_env_steps, outcome=False, restore=restore_lost_turns)
            searches.append(loose)
            await loose.run()
    finally:
        await player.aclose()
    last = searches[-1]
    final = last.found if last.found is not None and last.found.finish else await _plain(env, transcript)
    return ReplayResult(
        transcript=transcript,
        agrees=exact.found is not None and first_ok,
        observations_agree=last.found is not None and first_ok,
        first_prompt_matches=first_ok,
        lost_turns=last.lost,
        status=upstream_status(final) if final is not None else "running",
        reward=final.reward if final is not None else 0.0,
        env_steps=player.env_steps,
        exhausted=any(s.exhausted for s in searches),
        diverged_at=None if exact.found else last.best.get("position"),
        expected=None if exact.found else last.best.get("expected"),
        got=None if exact.found else last.best.get("got"),
    )


def summarize(results: Iterable[ReplayResult]) -> dict[str, Any]:
    """Agreement counts: episodes, identical ones, statuses and rewards as upstream's."""
    results = list(results)
    won = [r for r in results if r.transcript.reward >= 1]
    n = len(results)

    def share(count: int) -> float | None:
        return round(count / n, 4) if n else None

    agree = sum(r.agrees for r in results)
    same = sum(r.observations_agree for r in results)
    status = sum(r.status == r.transcript.status for r in results)
    reward = sum(r.reward == r.transcript.reward for r in results)
    return {
        "episodes": n,
        "agree": agree,
        "agree_rate": share(agree),
        "observations_agree": same,
        "observations_agree_rate": share(same),
        "agree_with_lost_turns_restored": sum(r.agrees and r.lost_turns > 0 for r in results),
        "lost_turns_restored": sum(r.lost_turns for r in results if r.observations_agree),
        "first_prompt_matches": sum(r.first_prompt_matches for r in results),
        "status_agrees": status,
        "status_agrees_rate": share(status),
        "reward_agrees": reward,
        "reward_agrees_rate": share(reward),
        "upstream_won": len(won),
        "upstream_won_and_won_here": sum(r.reward >= 1 for r in won),
        "search_exhausted": sum(r.exhausted for r in results),
        "env_steps": sum(r.env_steps for r in results),
    }
