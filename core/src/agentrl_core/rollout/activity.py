"""What the episodes in flight are doing now: the record behind a run's stall report.

A training step waits for whole groups, so one stuck episode (an environment that never
answers, an engine that stopped generating, a task whose workers are all full) holds the
run without an error. The rollout manager enters every episode it plays in an
:class:`Activity`; the agent loop marks the episode's phase as it goes (:func:`note_phase`,
a no-op outside such an episode); the training job describes what it sees when no step
has finished for ``logging.stall_report`` seconds::

    activity = Activity()
    with activity.episode(request.uid, "db-dev"):
        await agent_loop.run(request)      # calls note_phase("generating", turn) etc.
    activity.describe()   # "db-dev 3: 2 in the environment (turn 1, for up to 95 s), 1 generating ..."

The phase is kept in a context variable, so any agent loop (a plugin's included) reports
it without a change of its signature, and concurrent episodes never see each other's.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator

from attrs import define, field

__all__ = ["Activity", "EpisodeActivity", "current_episode", "note_phase"]

STARTING = "starting a session"


@define
class EpisodeActivity:
    """One episode in flight: its task, when it began, what it does now and since when."""

    uid: str
    task: str
    started: float
    phase: str = STARTING
    turn: int | None = None  # 0-based; None outside a turn (starting, ending)
    since: float = field(default=0.0)  # when the phase began (time.monotonic())

    def note(self, phase: str, turn: int | None = None) -> None:
        self.phase, self.turn, self.since = phase, turn, time.monotonic()


_current: contextvars.ContextVar[EpisodeActivity | None] = contextvars.ContextVar("agentrl_episode", default=None)


def current_episode() -> EpisodeActivity | None:
    """The episode the calling task plays, if an :class:`Activity` entered one (for code that runs elsewhere later)."""
    return _current.get()


def note_phase(phase: str, turn: int | None = None) -> None:
    """Mark what the episode of the calling task does now (``"generating"``, turn 0); no-op outside one."""
    episode = _current.get()
    if episode is not None:
        episode.note(phase, turn)


class Activity:
    """The episodes in flight, by uid (see the module docstring)."""

    def __init__(self) -> None:
        self.episodes: dict[str, EpisodeActivity] = {}

    @contextlib.contextmanager
    def episode(self, uid: str, task: str) -> Iterator[EpisodeActivity]:
        now = time.monotonic()
        record = EpisodeActivity(uid, task, started=now, since=now)
        self.episodes[uid] = record
        token = _current.set(record)
        try:
            yield record
        finally:
            _current.reset(token)
            self.episodes.pop(uid, None)

    def describe(self, now: float | None = None) -> str:
        """Per task, how many episodes are in each phase and for how long at most; "" when none.

        ``"os-dev 5: 3 in the environment (turn 2, for up to 290 s), 2 generating (turn 1, for up
        to 12 s); db-dev 1: 1 starting a session (for up to 130 s)"``: the longest wait first.
        """
        now = time.monotonic() if now is None else now
        groups: dict[str, dict[tuple[str, int | None], float]] = {}  # task -> (phase, turn) -> longest
        counts: dict[str, dict[tuple[str, int | None], int]] = {}
        for e in self.episodes.values():
            key = (e.phase, e.turn)
            longest = groups.setdefault(e.task, {})
            longest[key] = max(longest.get(key, 0.0), now - e.since)
            n = counts.setdefault(e.task, {})
            n[key] = n.get(key, 0) + 1
        parts = []
        for task in sorted(groups, key=lambda t: -max(groups[t].values())):
            phases = sorted(groups[task].items(), key=lambda kv: -kv[1])
            listed = ", ".join(
                f"{counts[task][key]} {key[0]} ("
                + ("" if key[1] is None else f"turn {key[1] + 1}, ") + f"for up to {waited:.0f} s)"
                for key, waited in phases)
            parts.append(f"{task} {sum(counts[task].values())}: {listed}")
        return "; ".join(parts)
