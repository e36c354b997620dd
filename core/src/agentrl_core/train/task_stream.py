"""The task stream: which prompt the next group samples, reproducibly and resumably.

Each configured task (an environment's index set, e.g. ``db-train``) is walked in a
shuffled order that is redrawn every epoch from a generator seeded by ``(seed, task,
epoch)``; tasks are interleaved by weight with smooth weighted round-robin (task ``i`` gets
``w_i / sum(w)`` of the groups in every window, deterministically). Each issued group gets a
fresh ``group_id`` (issue number, task, epoch, index) and is sampled ``n`` times under it.
The upstream reference used ``itertools.cycle`` and replayed the first epoch's order and
ids forever; here epoch 2 is a new permutation with new ids.

The stream also tracks the groups issued but not yet trained (or dropped). Its
:meth:`~TaskStream.state_dict` (the cursor plus those outstanding groups) goes into every
checkpoint; after a resume the outstanding groups are issued again first, under the same
ids, so the groups trained over an epoch are exactly the uninterrupted run's.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
from attrs import field, frozen

from agentrl_core.types import Index

__all__ = ["StreamTask", "GroupTask", "TaskStream"]

STATE_VERSION = 1


@frozen
class StreamTask:
    """One task of the stream: ``name`` (the data_source), its environment and indices."""

    name: str
    env: str
    split: str
    indices: tuple[Index, ...] = field(converter=tuple)
    weight: float = 1.0

    def __attrs_post_init__(self) -> None:
        if not self.indices:
            raise ValueError(f"task {self.name!r} has no indices; check the split {self.split!r} of {self.env!r}")
        if not self.weight > 0:
            raise ValueError(f"task {self.name!r}: weight must be > 0, got {self.weight}")

    @classmethod
    def from_config(cls, task: Any, available: Sequence[Index]) -> StreamTask:
        """From a :class:`~agentrl_core.config.TaskConfig` and its split's index list: the task's
        ``select_indices`` (its ``indices``, each checked against the split, or all; then its ``limit``,
        before any shuffling)."""
        return cls(task.task_name, task.env, task.split, tuple(task.select_indices(available)), task.weight)


@frozen
class GroupTask:
    """One issued group: run ``n_samples`` samples of ``(env, split, index)`` under ``group_id``."""

    group_id: str
    task: str
    env: str
    split: str
    index: Index
    n_samples: int
    epoch: int
    seq: int

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


class TaskStream:
    """Weighted, per-epoch reshuffled, checkpointable stream of :class:`GroupTask`."""

    def __init__(self, tasks: Sequence[StreamTask], n_samples: int, seed: int = 0) -> None:
        if not tasks:
            raise ValueError("the task stream needs at least one task (config key `tasks`)")
        names = [t.name for t in tasks]
        if len(set(names)) != len(names):
            raise ValueError(f"task names must be unique, got {names}; set `name:` on repeated env/split pairs")
        if n_samples < 1:
            raise ValueError(f"n_samples must be >= 1, got {n_samples}")
        self.tasks = list(tasks)
        self.n_samples = n_samples
        self.seed = seed
        self._issued = 0
        self._counts = [0] * len(self.tasks)  # groups issued per task, all epochs
        self._orders: dict[tuple[int, int], list[Index]] = {}
        self._outstanding: dict[str, GroupTask] = {}
        self._reissue: deque[GroupTask] = deque()

    # -- issuing ---------------------------------------------------------------------

    def next_group(self) -> GroupTask:
        """The next group: re-issued outstanding groups first (after a resume), then new ones."""
        if self._reissue:
            return self._reissue.popleft()
        i = self._pick_task()
        task = self.tasks[i]
        epoch, position = divmod(self._counts[i], len(task.indices))
        index = self._order(i, epoch)[position]
        group = GroupTask(
            group_id=f"{self._issued:08d}-{task.name}-e{epoch}-{index}",
            task=task.name, env=task.env, split=task.split, index=index,
            n_samples=self.n_samples, epoch=epoch, seq=self._issued,
        )
        self._issued += 1
        self._counts[i] += 1
        self._outstanding[group.group_id] = group
        return group

    def take(self, count: int) -> list[GroupTask]:
        return [self.next_group() for _ in range(count)]

    def mark_done(self, group_ids: str | Iterable[str]) -> None:
        """Groups trained (or dropped for good): they will not be re-issued on resume."""
        for gid in [group_ids] if isinstance(group_ids, str) else group_ids:
            if self._outstanding.pop(gid, None) is None:
                raise ValueError(f"group {gid!r} was not issued by this task stream or is already done")

    @property
    def outstanding(self) -> list[GroupTask]:
        """Issued, not yet done, in issue order."""
        return sorted(self._outstanding.values(), key=lambda g: g.seq)

    def epochs(self) -> dict[str, float]:
        """Fractional epoch of each task (1.5 = half-way through the second pass)."""
        return {t.name: self._counts[i] / len(t.indices) for i, t in enumerate(self.tasks)}

    def _pick_task(self) -> int:
        # smooth weighted round-robin in closed form: the task furthest behind its share
        total = sum(t.weight for t in self.tasks)
        n = self._issued + 1
        return max(range(len(self.tasks)), key=lambda i: (n * self.tasks[i].weight / total - self._counts[i], -i))

    def _order(self, i: int, epoch: int) -> list[Index]:
        key = (i, epoch)
        if key not in self._orders:
            order = list(self.tasks[i].indices)
            random.Random(f"{self.seed}:{self.tasks[i].name}:{epoch}").shuffle(order)
            self._orders = {k: v for k, v in self._orders.items() if k[0] != i}  # keep one epoch per task
            self._orders[key] = order
        return self._orders[key]

    # -- checkpointing ---------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """JSON-serializable cursor plus the outstanding groups."""
        return {
            "version": STATE_VERSION,
            "seed": self.seed,
            "n_samples": self.n_samples,
            "issued": self._issued,
            "tasks": {t.name: {"count": self._counts[i], "size": len(t.indices)} for i, t in enumerate(self.tasks)},
            "outstanding": [g.to_dict() for g in self.outstanding],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a cursor; the outstanding groups will be issued again first."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"task stream state version {state.get('version')!r} is not {STATE_VERSION}")
        saved = state["tasks"]
        mine = {t.name: len(t.indices) for t in self.tasks}
        if {k: v["size"] for k, v in saved.items()} != mine or state["seed"] != self.seed:
            raise ValueError(
                f"the checkpoint's task stream (seed {state['seed']}, tasks {sorted(saved)}) does not match this "
                f"config (seed {self.seed}, tasks {sorted(mine)} with these index counts); resume with the same "
                "tasks and seed"
            )
        self._issued = int(state["issued"])
        self._counts = [int(saved[t.name]["count"]) for t in self.tasks]
        groups = [GroupTask(**g) for g in state["outstanding"]]
        self._outstanding = {g.group_id: g for g in groups}
        self._reissue = deque(sorted(groups, key=lambda g: g.seq))
