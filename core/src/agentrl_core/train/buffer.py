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

Dynamic sampling (DAPO; ``filter_equal_rewards=True``): a group whose members all got the
same training reward carries no advantage signal, so when it completes it is *set aside*
instead of becoming ready (``add`` answers ``GROUP_FILTERED``), and the producer keeps
generating. ``max_extra_groups`` (``k``) bounds that extra generation on both sides: ``get``
also stops waiting once the groups completed since the previous take (ready plus set
aside) reach the ask plus ``k``, and ``admit`` counts the groups set aside since the
previous take against ``max_size`` raised by ``k`` groups, so a producer whose groups are
all filtered stops instead of running through the task stream while the learner trains.
A take short of its ask after that is a *fallback*, counted:
``fallback="fill"`` tops the batch up with the most recent set-aside groups (their
advantage is 0 under GRPO/RLOO: that step trains as if nothing were filtered);
``"useful"`` trains the useful groups alone, and fills only when there is none, so a
step is never empty. Set-aside groups not trained by the take that follows are *spent*
(``take_spent`` lists them, to be marked done in the task stream). ``take_ready`` is the
same take without waiting (sync mode, after its generation rounds).

Everything runs on one event loop (anyio); nothing here is thread-safe.
"""

from __future__ import annotations

import enum
import logging
import math
from collections import OrderedDict, deque
from typing import Literal

import anyio
import attrs
from attrs import define, frozen

from agentrl_core.types import FailureKind, Trajectory

log = logging.getLogger(__name__)

__all__ = ["GroupBuffer", "AddResult", "BufferStats", "BufferClosed", "TakeStats"]

_RELEASED_MEMORY = 1 << 16  # released group ids remembered to reject late duplicates


class BufferClosed(Exception):
    """The buffer was closed while a caller waited on it."""


class AddResult(str, enum.Enum):
    """What the producer must do after :meth:`GroupBuffer.add` or :meth:`GroupBuffer.fail`."""

    ACCEPTED = "accepted"  # kept; nothing to do
    GROUP_FILTERED = "group_filtered"  # kept, and it completed a group with equal rewards: set aside
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
    groups_filtered: int = 0  # dynamic sampling, since the start: set aside for equal rewards
    groups_filled: int = 0  # ... of those, trained anyway by a fallback
    fallback_hits: int = 0  # takes that hit the bound on extra groups short of their ask
    set_aside_groups: int = 0  # held now for a fallback

    def as_metrics(self, prefix: str = "buffer/") -> dict[str, float]:
        return {f"{prefix}{k}": float(v) for k, v in attrs.asdict(self).items()}


@frozen
class TakeStats:
    """What one take was made of, with dynamic sampling (all counts are groups)."""

    asked: int  # the take's minimum, in whole groups
    useful: int  # groups with a reward spread, taken
    filtered: int  # groups set aside since the previous take
    filled: int  # set-aside groups taken by the fallback
    fallback: bool  # the bound on extra groups was hit short of the ask

    @property
    def extra(self) -> int:
        """Groups completed for this take beyond its ask."""
        return max(0, self.useful + self.filtered - self.asked)

    @property
    def useful_share(self) -> float:
        completed = self.useful + self.filtered
        return self.useful / completed if completed else 0.0

    def as_metrics(self, prefix: str = "dynamic_sampling/") -> dict[str, float]:
        return {f"{prefix}groups_filtered": float(self.filtered), f"{prefix}extra_groups": float(self.extra),
                f"{prefix}useful_share": self.useful_share, f"{prefix}useful_groups": float(self.useful),
                f"{prefix}filled_groups": float(self.filled), f"{prefix}fallback": float(self.fallback)}


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
        filter_equal_rewards: dynamic sampling: set aside groups whose training rewards are
            all equal (``rollout.dynamic_sampling.enabled``).
        max_extra_groups: with filtering, the groups a take may wait for beyond its ask, set-aside
            ones included; also added to ``max_size`` for admission
            (``ceil(rollout.dynamic_sampling.max_extra_factor x batch_size)``).
        fallback: what a take short of its ask does once the bound on extra groups is hit:
            ``fill`` (with set-aside groups) or ``useful`` (the useful groups alone, filled
            only when there is none) (``rollout.dynamic_sampling.fallback``).
    """

    def __init__(self, n_samples: int, max_size: int, *, max_infra_retries: int = 2,
                 filter_equal_rewards: bool = False, max_extra_groups: int = 0,
                 fallback: Literal["fill", "useful"] = "fill") -> None:
        if n_samples < 1:
            raise ValueError(f"n_samples must be >= 1, got {n_samples}")
        if max_size < n_samples:
            raise ValueError(f"max_size ({max_size}) must hold at least one group of {n_samples}")
        if max_infra_retries < 0:
            raise ValueError(f"max_infra_retries must be >= 0, got {max_infra_retries}")
        if filter_equal_rewards and n_samples < 2:
            raise ValueError("filtering groups with equal rewards needs groups of at least 2 samples; a group of one "
                             "always has equal rewards")
        if max_extra_groups < 0:
            raise ValueError(f"max_extra_groups must be >= 0, got {max_extra_groups}")
        if fallback not in ("fill", "useful"):
            raise ValueError(f"fallback must be 'fill' or 'useful', got {fallback!r}")
        self.filter_equal_rewards = filter_equal_rewards
        self.max_extra_groups = max_extra_groups if filter_equal_rewards else 0
        self.fallback = fallback
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
        self._counts = dict(groups_released=0, groups_dropped=0, trajectories_discarded=0, infra_failures=0, infra_retries=0,
                            groups_filtered=0, groups_filled=0, fallback_hits=0)
        self._set_aside: deque[list[Trajectory]] = deque()  # filtered since the last take, oldest first
        self._filtered_since_take = 0
        self._spent: list[str] = []
        self.last_take: TakeStats | None = None

    # -- producer side --------------------------------------------------------------

    @property
    def completed_unconsumed(self) -> int:
        return self._ready_trajectories + self._pending_trajectories

    def has_room(self) -> bool:
        # groups filtered since the last take were generated for the coming step, within its bound
        filtered = self._filtered_since_take * self.n_samples
        return self.completed_unconsumed + filtered < self.max_size + self.max_extra_groups * self.n_samples

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
        result = AddResult.ACCEPTED
        if len(group.members) == self.n_samples:
            del self._pending[gid]
            self._admitted.discard(gid)
            self._remember_released(gid)
            self._pending_trajectories -= self.n_samples
            members = [group.members[s] for s in sorted(group.members)]
            if self.filter_equal_rewards and len({t.training_reward for t in members}) == 1:
                self._put_aside(members)
                result = AddResult.GROUP_FILTERED
            else:
                self._ready.append(members)
                self._ready_trajectories += self.n_samples
                self._counts["groups_released"] += 1
        self._notify()
        return result

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
        the buffer is closed before that many are ready. With dynamic sampling, the wait
        also ends once ``max_extra_groups`` groups beyond the ask have completed (set-aside
        ones included), with a fallback take (see the module).
        """
        unit, need = self._ask(minimum, multiple)
        while self._ready_trajectories < need and not self._extra_bound_hit(need):
            self._check_open()
            event = self._changed
            await event.wait()
        return self._take(need, unit)

    def take_ready(self, minimum: int, multiple: int = 1) -> list[Trajectory]:
        """Take what is ready now, like :meth:`get` without waiting; a take short of ``minimum``
        falls back as the bound on extra groups does (sync mode, once its rounds have run).
        Empty only when nothing is ready and nothing is set aside."""
        self._check_open()
        unit, need = self._ask(minimum, multiple)
        return self._take(need, unit)

    def take_spent(self) -> list[str]:
        """Ids of set-aside groups that will never be trained, since the last call."""
        spent, self._spent = self._spent, []
        return spent

    @property
    def ready_groups(self) -> int:
        return len(self._ready)

    @property
    def filtered_since_take(self) -> int:
        return self._filtered_since_take

    @property
    def groups_filtered_untrained(self) -> int:
        """Groups set aside and not trained by a fallback: they never reach the learner."""
        return self._counts["groups_filtered"] - self._counts["groups_filled"]

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
            set_aside_groups=len(self._set_aside),
            **self._counts,
        )

    # -- internals ------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise BufferClosed("the rollout buffer is closed")

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def _ask(self, minimum: int, multiple: int) -> tuple[int, int]:
        unit = math.lcm(self.n_samples, max(int(multiple), 1))
        need = max(unit, math.ceil(max(minimum, 1) / unit) * unit)
        if need > self.max_size:
            raise ValueError(
                f"a take of minimum={minimum}, multiple={multiple} needs {need} ready trajectories but the buffer "
                f"admits new groups only below {self.max_size}; raise the buffer size or lower the batch"
            )
        return unit, need

    def _extra_bound_hit(self, need: int) -> bool:
        if not self.filter_equal_rewards:
            return False
        completed = len(self._ready) + self._filtered_since_take
        return completed * self.n_samples >= need + self.max_extra_groups * self.n_samples

    def _take(self, need: int, unit: int) -> list[Trajectory]:
        take = self._ready_trajectories // unit * unit
        if take == 0 and not self._set_aside:
            return []  # only take_ready gets here: there is nothing to train, and no step
        groups = [self._ready.popleft() for _ in range(take // self.n_samples)]
        self._ready_trajectories -= take
        useful, filled = len(groups), 0
        fallback = self.filter_equal_rewards and take < need
        if fallback:
            self._counts["fallback_hits"] += 1
            if self.fallback == "fill" or not groups:
                while self._set_aside and (len(groups) * self.n_samples < need
                                           or len(groups) * self.n_samples % unit):
                    groups.append(self._set_aside.pop())  # the most recent: the freshest weights
                    filled += 1
                while filled and len(groups) * self.n_samples % unit:  # too few set aside to align
                    self._set_aside.append(groups.pop())
                    filled -= 1
            self._counts["groups_filled"] += filled
            log.info("dynamic sampling: the bound on extra groups was hit with %d useful groups of %d asked; "
                     "%d filtered groups fill the batch", useful, need // self.n_samples, filled)
        if self.filter_equal_rewards:
            self.last_take = TakeStats(asked=need // self.n_samples, useful=useful,
                                       filtered=self._filtered_since_take, filled=filled, fallback=fallback)
        self._spent.extend(g[0].group_id for g in self._set_aside)  # the next take wants fresher ones
        self._set_aside.clear()
        self._filtered_since_take = 0
        self._notify()
        groups.sort(key=lambda g: g[0].group_id)
        return [t for g in groups for t in g]

    def _put_aside(self, members: list[Trajectory]) -> None:
        self._counts["groups_filtered"] += 1
        self._filtered_since_take += 1
        self._set_aside.append(members)
        while len(self._set_aside) * self.n_samples > self.max_size:  # more than any fill can use
            self._spent.append(self._set_aside.popleft()[0].group_id)

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

