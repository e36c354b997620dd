"""The producer side of training: task stream -> agent loops -> group buffer.

One :class:`RolloutManager` runs every group the task stream issues: it waits for the
buffer's admission (back-pressure) and, when a staleness bound is set, for the learner to
catch up; it then runs the group's ``n`` samples concurrently under a global concurrency
limit and files each finished trajectory. Infrastructure failures are re-run as the
buffer says (``RETRY``) or end the group (``GROUP_DROPPED``), which is then marked done in
the stream and counted; a failure never hangs the buffer.

``async`` mode runs :meth:`run_forever` beside the learner. ``sync`` mode calls
:meth:`run_groups` with exactly one batch of groups, then trains.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import anyio

from agentrl_core.rollout.agent_loop import RolloutRequest
from agentrl_core.train.buffer import AddResult, BufferClosed, GroupBuffer
from agentrl_core.train.task_stream import GroupTask, TaskStream

log = logging.getLogger(__name__)


class RolloutManager:
    def __init__(
        self,
        *,
        agent_loop: Any,
        buffer: GroupBuffer,
        stream: TaskStream,
        concurrency: int,
        batch_groups: int,
        staleness_bound: int | None = None,
        learner_step: Callable[[], int] = lambda: 0,
        retry_backoff: float = 1.0,
    ) -> None:
        self.agent_loop = agent_loop
        self.buffer = buffer
        self.stream = stream
        self.limiter = anyio.CapacityLimiter(concurrency)
        # at most this many groups in flight: a group is issued only when a slot frees up,
        # so the stream never runs ahead of what can actually be played
        self.group_slots = anyio.Semaphore(max(1, math.ceil(concurrency / stream.n_samples)))
        self.batch_groups = batch_groups
        self.staleness_bound = staleness_bound
        self.learner_step = learner_step
        self.retry_backoff = retry_backoff
        self.groups_started = 0
        self.in_flight = 0
        self.counters: Counter[str] = Counter()
        self.statuses: Counter[str] = Counter()  # every finished episode, infra failures included
        self._progress = anyio.Event()
        self.dropped_groups: list[str] = []

    # -- admission ----------------------------------------------------------------------

    def notify_step(self) -> None:
        """The learner finished a step: wake groups waiting on the staleness bound."""
        self._progress.set()
        self._progress = anyio.Event()

    def _stale_room(self) -> bool:
        if self.staleness_bound is None:
            return True
        # a group started while the learner is at version v is trained by step
        # ~ groups_started // batch_groups + 1; keep that within v + bound (AReaL's rule)
        allowed = (self.learner_step() + self.staleness_bound + 1) * self.batch_groups
        return self.groups_started < allowed

    async def _admit(self, group: GroupTask) -> None:
        while not self._stale_room():
            self.counters["staleness_waits"] += 1
            await self._progress.wait()
        await self.buffer.admit(group.group_id)

    # -- running ------------------------------------------------------------------------

    async def run_forever(self) -> None:
        """Keep issuing groups until cancelled (async mode); a closed buffer ends it too."""
        async with anyio.create_task_group() as tg:
            while True:
                await self.group_slots.acquire()
                group = self.stream.next_group()
                try:
                    await self._admit(group)
                except BufferClosed:
                    self.group_slots.release()
                    return
                self.groups_started += 1
                tg.start_soon(self._run_group_in_slot, group)

    async def run_groups(self, count: int) -> None:
        """Run exactly ``count`` new groups to completion (sync mode)."""
        async with anyio.create_task_group() as tg:
            for group in self.stream.take(count):
                self.groups_started += 1
                tg.start_soon(self._run_group, group)

    async def _run_group_in_slot(self, group: GroupTask) -> None:
        try:
            await self._run_group(group)
        finally:
            self.group_slots.release()

    async def _run_group(self, group: GroupTask) -> None:
        async with anyio.create_task_group() as tg:
            for sample in range(group.n_samples):
                tg.start_soon(self._run_sample, group, sample)

    async def _run_sample(self, group: GroupTask, sample: int) -> None:
        try:
            await self._run_sample_until_filed(group, sample)
        except BufferClosed:  # training is over; the group was never going to be used
            pass

    async def _run_sample_until_filed(self, group: GroupTask, sample: int) -> None:
        attempt = 0
        while self.buffer.wants(group.group_id):
            request = RolloutRequest(
                task=group.task, index=group.index, group_id=group.group_id,
                uid=f"{group.group_id}/{sample}" + (f"/retry{attempt}" if attempt else ""),
                sample=sample, split=group.split, env=group.env,
            )
            async with self.limiter:
                self.in_flight += 1
                try:
                    trajectory = await self.agent_loop.run(request)
                except Exception as exc:  # a bug or an unexpected failure: infra, never a score
                    log.exception("sample %s of group %s raised", sample, group.group_id)
                    self.counters["loop_exceptions"] += 1
                    result = self.buffer.fail(group.group_id, sample, f"{type(exc).__name__}: {exc}")
                    trajectory = None
                finally:
                    self.in_flight -= 1
            if trajectory is not None:
                self.statuses[trajectory.status.value] += 1
                self.counters[f"failure/{trajectory.failure.value}"] += 1
                result = self.buffer.add(trajectory)
            if result is AddResult.RETRY:
                attempt += 1
                self.counters["infra_retries"] += 1
                # back off, so a restarting engine or worker is not hammered into dropping every group
                await anyio.sleep(min(self.retry_backoff * 2 ** (attempt - 1), 30.0))
                continue
            if result is AddResult.GROUP_DROPPED:
                self.counters["groups_dropped"] += 1
                self.dropped_groups.append(group.group_id)
                self.stream.mark_done(group.group_id)
            return

    def take_dropped(self) -> list[str]:
        dropped, self.dropped_groups = self.dropped_groups, []
        return dropped

    def metrics(self) -> dict[str, float]:
        out = {f"rollout/{k}": float(v) for k, v in self.counters.items()}
        out["rollout/in_flight"] = float(self.in_flight)
        out["rollout/groups_started"] = float(self.groups_started)
        total = sum(self.statuses.values())
        for status, n in self.statuses.items():
            out[f"rollout/status/{status}"] = float(n)
        out["rollout/episodes"] = float(total)
        return out


def warmup_minimum(batch_trajectories: int, factor: float, group_size: int) -> int:
    """Trajectories the first batch waits for: ``factor`` x batch, rounded up to whole groups."""
    return math.ceil(batch_trajectories * factor / group_size) * group_size
