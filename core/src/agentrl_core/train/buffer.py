"""The group-aware rollout buffer (docs/architecture.md sections 1 and 6).

Trajectories arrive one by one in any order; a group (the ``n`` samples of one prompt)
becomes visible to the learner only when all its members are in, so group statistics are
always computed over whole groups, and different groups never wait for each other.

The producer's side, per group::

    await buffer.admit(group_id)           # back-pressure: waits while the buffer is full
    ... start the n samples; for each finished one:
    while buffer.add(trajectory) is AddResult.RETRY:
        trajectory = await run_sample_again(...)

* ``add`` never blocks (a finished trajectory is never held up). An infrastructure failure
  (``failure == "infra"``) answers ``RETRY`` up to ``max_infra_retries`` times per sample;
  after that the whole group is dropped and counted, its finished members are discarded,
  and members still in flight are discarded when they arrive. An infra failure never
  reaches the learner, so it can never enter group statistics as a zero reward, and a
  failed member can never leave its group waiting forever.
* ``fail(group_id, sample)`` is the same for a sample that produced no trajectory at all
  (its agent loop raised).
* ``admit`` is the back-pressure: a *new* group waits while the completed, unconsumed
  trajectories (ready groups plus finished members of incomplete groups) number
  ``max_size`` or more. Later members of an admitted group pass at once, so incomplete
  groups can always finish. (The bound can be overshot by the members of admitted groups
  still in flight.)

The consumer's side: ``await buffer.get(minimum, multiple)`` waits until at least
``minimum`` trajectories are ready, then takes every ready whole group, as many as
``lcm(n_samples, multiple)`` divides, oldest first, and returns them sorted by
``(group_id, sample)`` so a batch's order does not depend on completion order.

Everything runs on one event loop (anyio); nothing here is thread-safe.
"""

from __future__ import annotations

import enum
import logging
import math
from collections import OrderedDict, deque

import anyio
import attrs
from attrs import define, frozen

from agentrl_core.types import FailureKind, Trajectory

log = logging.getLogger(__name__)

__all__ = ["GroupBuffer", "AddResult", "BufferStats", "BufferClosed"]

_RELEASED_MEMORY = 1 << 16  # released group ids remembered to reject late duplicates


class BufferClosed(Exception):
    """The buffer was closed while a caller waited on it."""


class AddResult(str, enum.Enum):
    """What the producer must do after :meth:`GroupBuffer.add` or :meth:`GroupBuffer.fail`."""

    ACCEPTED = "accepted"  # kept; nothing to do
    RETRY = "retry"  # infra failure within the budget: run this sample again
    GROUP_DROPPED = "group_dropped"  # this failure exhausted the budget: the group is gone
    DISCARDED = "discarded"  # the group was dropped earlier: stop working on it

    def __str__(self) -> str:
        return self.value


@frozen
class BufferStats:
    ready_groups: int
    ready_trajectories: int
    pending_groups: int
    pending_trajectories: int
    completed_unconsumed: int
    groups_released: int
    groups_dropped: int
    trajectories_discarded: int
    infra_failures: int
    infra_retries: int

    def as_metrics(self, prefix: str = "buffer/") -> dict[str, float]:
        return {f"{prefix}{k}": float(v) for k, v in attrs.asdict(self).items()}


@define
class _Group:
    members: dict[int, Trajectory]
    attempts: dict[int, int]  # infra failures per sample
    dropped: bool = False
    finished: set[int] | None = None  # samples with a final outcome, once dropped


class GroupBuffer:
    """Whole-group buffer with admission back-pressure and bounded infra retries.

    Args:
        n_samples: samples per group (``rollout.n_samples``).
        max_size: completed, unconsumed trajectories at which new groups wait in
            :meth:`admit` (``buffer_max_factor`` x batch size x group size).
        max_infra_retries: re-runs of one sample after infrastructure failures before its
            group is dropped.
    """

    def __init__(self, n_samples: int, max_size: int, *, max_infra_retries: int = 2) -> None:
        if n_samples < 1:
            raise ValueError(f"n_samples must be >= 1, got {n_samples}")
        if max_size < n_samples:
            raise ValueError(f"max_size ({max_size}) must hold at least one group of {n_samples}")
        if max_infra_retries < 0:
            raise ValueError(f"max_infra_retries must be >= 0, got {max_infra_retries}")
        self.n_samples = n_samples
        self.max_size = max_size
        self.max_infra_retries = max_infra_retries
        self._pending: dict[str, _Group] = {}
        self._ready: deque[list[Trajectory]] = deque()
        self._admitted: set[str] = set()
        self._released: OrderedDict[str, None] = OrderedDict()
        self._changed = anyio.Event()
        self._closed = False
        self._pending_trajectories = 0
        self._ready_trajectories = 0
        self._counts = dict(groups_released=0, groups_dropped=0, trajectories_discarded=0, infra_failures=0, infra_retries=0)

    # -- producer side --------------------------------------------------------------

    @property
    def completed_unconsumed(self) -> int:
        return self._ready_trajectories + self._pending_trajectories

    def has_room(self) -> bool:
        return self.completed_unconsumed < self.max_size

    async def admit(self, group_id: str) -> None:
        """Wait until a new group may start; members of an admitted group pass at once."""
        if group_id in self._admitted or group_id in self._pending:
            return
        while not self.has_room():
            self._check_open()
            event = self._changed
            await event.wait()
        self._check_open()
        self._admitted.add(group_id)

    def wants(self, group_id: str) -> bool:
        """False once ``group_id`` was dropped: its remaining samples need not run."""
        group = self._pending.get(group_id)
        return not (group is not None and group.dropped)

    def add(self, trajectory: Trajectory) -> AddResult:
        """File a finished trajectory; never blocks. See :class:`AddResult`."""
        self._check_open()
        gid, sample = trajectory.group_id, trajectory.sample
        group = self._group(gid, sample)
        if group.dropped:
            return self._discard(gid, group, sample)
        if trajectory.failure is FailureKind.INFRA or trajectory.training_reward is None:
            return self._infra_failure(gid, group, sample, f"status {trajectory.status}")
        if sample in group.members:
            raise ValueError(f"group {gid!r} already has sample {sample}; each sample is added once")
        group.members[sample] = trajectory
        self._pending_trajectories += 1
        if len(group.members) == self.n_samples:
            del self._pending[gid]
            self._admitted.discard(gid)
            self._remember_released(gid)
            self._pending_trajectories -= self.n_samples
            self._ready.append([group.members[s] for s in sorted(group.members)])
            self._ready_trajectories += self.n_samples
            self._counts["groups_released"] += 1
        self._notify()
        return AddResult.ACCEPTED

    def fail(self, group_id: str, sample: int, reason: str = "no trajectory") -> AddResult:
        """An infrastructure failure of ``sample`` that produced no trajectory."""
        self._check_open()
        group = self._group(group_id, sample)
        if group.dropped:
            return self._discard(group_id, group, sample)
        return self._infra_failure(group_id, group, sample, reason)

    # -- consumer side --------------------------------------------------------------

    async def get(self, minimum: int, multiple: int = 1) -> list[Trajectory]:
        """Wait for ``minimum`` ready trajectories; take all ready groups, lcm-aligned.

        The number taken is the largest multiple of ``lcm(n_samples, multiple)`` that the
        ready trajectories allow (at least ``minimum``). Raises :class:`BufferClosed` if
        the buffer is closed before that many are ready.
        """
        unit = math.lcm(self.n_samples, max(int(multiple), 1))
        need = max(unit, math.ceil(max(minimum, 1) / unit) * unit)
        if need > self.max_size:
            raise ValueError(
                f"get(minimum={minimum}, multiple={multiple}) needs {need} ready trajectories but the buffer "
                f"admits new groups only below {self.max_size}; raise the buffer size or lower the batch"
            )
        while self._ready_trajectories < need:
            self._check_open()
            event = self._changed
            await event.wait()
        take = self._ready_trajectories // unit * unit
        groups = [self._ready.popleft() for _ in range(take // self.n_samples)]
        self._ready_trajectories -= take
        self._notify()
        groups.sort(key=lambda g: g[0].group_id)
        return [t for g in groups for t in g]

    def close(self) -> None:
        """Wake every waiter with :class:`BufferClosed`; later calls raise it too."""
        self._closed = True
        self._notify()

    def stats(self) -> BufferStats:
        return BufferStats(
            ready_groups=len(self._ready),
            ready_trajectories=self._ready_trajectories,
            pending_groups=sum(1 for g in self._pending.values() if not g.dropped),
            pending_trajectories=self._pending_trajectories,
            completed_unconsumed=self.completed_unconsumed,
            **self._counts,
        )

    # -- internals ------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise BufferClosed("the rollout buffer is closed")

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def _group(self, gid: str, sample: int) -> _Group:
        if not 0 <= sample < self.n_samples:
            raise ValueError(f"group {gid!r}: sample {sample} is outside 0..{self.n_samples - 1}")
        group = self._pending.get(gid)
        if group is None:
            if gid in self._released:
                raise ValueError(f"group {gid!r} was already complete and released; sample {sample} is a duplicate")
            group = self._pending[gid] = _Group(members={}, attempts={})
        return group

    def _infra_failure(self, gid: str, group: _Group, sample: int, reason: str) -> AddResult:
        self._counts["infra_failures"] += 1
        attempts = group.attempts[sample] = group.attempts.get(sample, 0) + 1
        if attempts <= self.max_infra_retries:
            self._counts["infra_retries"] += 1
            log.info("group %s sample %d: infrastructure failure (%s); retry %d/%d",
                     gid, sample, reason, attempts, self.max_infra_retries)
            return AddResult.RETRY
        log.warning("group %s dropped: sample %d failed %d times for infrastructure reasons (%s)",
                    gid, sample, attempts, reason)
        self._counts["groups_dropped"] += 1
        self._counts["trajectories_discarded"] += len(group.members)
        self._pending_trajectories -= len(group.members)
        group.dropped = True
        group.finished = set(group.members) | {sample}
        group.members = {}
        self._admitted.discard(gid)
        self._forget_if_finished(gid, group)
        self._notify()  # room was freed
        return AddResult.GROUP_DROPPED

    def _discard(self, gid: str, group: _Group, sample: int) -> AddResult:
        self._counts["trajectories_discarded"] += 1
        assert group.finished is not None
        group.finished.add(sample)
        self._forget_if_finished(gid, group)
        return AddResult.DISCARDED

    def _forget_if_finished(self, gid: str, group: _Group) -> None:
        if group.finished is not None and len(group.finished) == self.n_samples:
            del self._pending[gid]
            self._remember_released(gid)

    def _remember_released(self, gid: str) -> None:
        self._released[gid] = None
        if len(self._released) > _RELEASED_MEMORY:
            self._released.popitem(last=False)

