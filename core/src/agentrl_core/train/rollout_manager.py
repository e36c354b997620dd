"""The producer side of training: task stream -> agent loops -> group buffer.

One :class:`RolloutManager` runs every group the task stream issues: it waits for the
buffer's admission (back-pressure) and, when a staleness bound is set, for the learner to
catch up; it then runs the group's ``n_samples`` samples concurrently under a global concurrency
limit and files each finished trajectory. Infrastructure failures are re-run as the
buffer says (``RETRY``) or end the group (``GROUP_DROPPED``), which is then marked done in
the stream and counted; a failure never hangs the buffer. A dropped group gives its place
under the staleness bound back (it never reaches the learner). When
``max_consecutive_drops`` groups in a row are dropped, the manager raises
:class:`RolloutCircuitOpen` instead of generating forever against a broken environment or
engine.

``async`` mode runs :meth:`run_forever` beside the learner. ``sync`` mode calls
:meth:`run_batch`: exactly one batch of groups, then trains.

Dynamic sampling (the buffer's ``filter_equal_rewards``): a group whose rewards are all
equal is set aside by the buffer (``GROUP_FILTERED``); like a dropped group it gives its
place under the staleness bound back. In async mode the producer keeps going as admission
allows (the buffer counts set-aside groups against its cap raised by ``max_extra_groups``,
and the learner's ``get`` stops waiting at the same bound); in sync mode :meth:`run_batch`
runs more groups in rounds until the batch has its useful groups or ``max_extra_groups``
more groups have run. Each round is sized by the useful share seen so far, so a batch at a
50 % share takes about two rounds, not one round per halving of the gap; the rounds depend
only on the rewards, so production stays deterministic.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import anyio

from agentrl_core.errors import AgentrlError
from agentrl_core.rollout.activity import Activity
from agentrl_core.rollout.agent_loop import RolloutRequest
from agentrl_core.train.buffer import AddResult, BufferClosed, GroupBuffer
from agentrl_core.train.task_stream import GroupTask, TaskStream

log = logging.getLogger(__name__)


class RolloutCircuitOpen(AgentrlError):
    """Too many groups in a row were dropped after infrastructure failures: stop the run."""


def default_max_consecutive_drops(batch_groups: int, concurrency: int, n_samples: int) -> int:
    """Twice the larger of a batch and the groups kept in flight (one outage drops all of those), at least 8."""
    return max(8, 2 * max(batch_groups, math.ceil(concurrency / n_samples)))


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
        max_consecutive_drops: int | None = None,
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
        self.activity = Activity()  # what each episode in flight does now (the run's stall report)
        self.counters: Counter[str] = Counter()
        self.statuses: Counter[str] = Counter()  # every finished episode, infra failures included
        self._progress = anyio.Event()
        self.dropped_groups: list[str] = []
        self.groups_dropped = 0
        self.extra_groups_started = 0
        self.max_consecutive_drops = max_consecutive_drops
        self.drops_in_a_row = 0
        self.last_failure = ""
        self._dropped_now: set[str] = set()
        self.circuit_error: RolloutCircuitOpen | None = None
        self._groups_scope: anyio.CancelScope | None = None

    # -- admission ----------------------------------------------------------------------

    def notify_step(self) -> None:
        """The learner finished a step (or a group was dropped): wake groups waiting on the staleness bound."""
        self._progress.set()
        self._progress = anyio.Event()

    def _stale_room(self) -> bool:
        if self.staleness_bound is None:
            return True
        # a group started while the learner is at version v is trained by step
        # ~ groups_started // batch_groups + 1; keep that within v + bound (AReaL's rule).
        # Dropped groups never reach the learner, nor do filtered ones (unless a fallback fills
        # with them): counting them would leave batches unfillable.
        allowed = (self.learner_step() + self.staleness_bound + 1) * self.batch_groups
        return self.groups_started - self.groups_dropped - self.buffer.groups_filtered_untrained < allowed

    async def _admit(self, group: GroupTask) -> None:
        while not self._stale_room():
            self.counters["staleness_waits"] += 1
            await self._progress.wait()
        await self.buffer.admit(group.group_id)

    # -- running ------------------------------------------------------------------------

    async def run_forever(self) -> None:
        """Keep issuing groups until cancelled (async mode); a closed buffer ends it too.

        Raises :class:`RolloutCircuitOpen` when too many groups in a row were dropped.
        """
        async with anyio.create_task_group() as tg:
            self._groups_scope = tg.cancel_scope
            while True:
                await self.group_slots.acquire()
                group = self.stream.next_group()
                try:
                    await self._admit(group)
                except BufferClosed:
                    self.group_slots.release()
                    break
                self.groups_started += 1
                tg.start_soon(self._run_group_in_slot, group)
        self._raise_if_open()

    async def run_groups(self, count: int) -> None:
        """Run exactly ``count`` new groups to completion (sync mode); raises :class:`RolloutCircuitOpen`."""
        async with anyio.create_task_group() as tg:
            self._groups_scope = tg.cancel_scope
            for group in self.stream.take(count):
                self.groups_started += 1
                tg.start_soon(self._run_group, group)
        self._raise_if_open()

    async def run_batch(self, count: int) -> None:
        """Sync mode: run ``count`` new groups; with dynamic sampling, then rounds of more until
        ``count`` useful groups are ready or the buffer's ``max_extra_groups`` more groups have
        run. Raises :class:`RolloutCircuitOpen`."""
        await self.run_groups(count)
        extra, max_extra = 0, self.buffer.max_extra_groups
        while self.buffer.filter_equal_rewards and extra < max_extra:
            useful = self.buffer.ready_groups
            missing = count - useful
            if missing <= 0:
                return
            completed = useful + self.buffer.filtered_since_take
            # as many as the useful share so far says will bring the missing ones (a batch's worth
            # when none was useful yet), within the bound and at most a batch per round
            wanted = math.ceil(missing * completed / useful) if useful else count
            launch = min(max_extra - extra, count, wanted)
            extra += launch
            self.extra_groups_started += launch
            await self.run_groups(launch)

    def _raise_if_open(self) -> None:
        if self.circuit_error is not None:
            raise self.circuit_error

    async def _run_group_in_slot(self, group: GroupTask) -> None:
        try:
            await self._run_group(group)
        finally:
            self.group_slots.release()

    async def _run_group(self, group: GroupTask) -> None:
        async with anyio.create_task_group() as tg:
            for sample in range(group.n_samples):
                tg.start_soon(self._run_sample, group, sample)
        if group.group_id in self._dropped_now:
            self._dropped_now.discard(group.group_id)
            self._check_circuit()
        else:
            self.drops_in_a_row = 0

    def _check_circuit(self) -> None:
        limit = self.max_consecutive_drops
        if limit is None or self.drops_in_a_row < limit or self.circuit_error is not None:
            return
        self.circuit_error = RolloutCircuitOpen(
            f"{self.drops_in_a_row} groups in a row were dropped after repeated infrastructure failures "
            f"(the last: {self.last_failure or 'unknown'}); every episode fails, so training stops here. "
            "Check the environment workers and engines (their logs are in the run directory's logs/), "
            "or raise rollout.max_consecutive_dropped_groups."
        )
        if self._groups_scope is not None:
            self._groups_scope.cancel()  # stop every group in flight; run_forever/run_groups raise it

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
                    with self.activity.episode(request.uid, group.task):
                        trajectory = await self.agent_loop.run(request)
                except Exception as exc:  # a bug or an unexpected failure: infra, never a score
                    log.exception("sample %s of group %s raised", sample, group.group_id)
                    self.counters["loop_exceptions"] += 1
                    self.last_failure = f"{type(exc).__name__}: {exc}"
                    result = self.buffer.fail(group.group_id, sample, self.last_failure)
                    trajectory = None
                finally:
                    self.in_flight -= 1
            if trajectory is not None:
                self.statuses[trajectory.status.value] += 1
                self.counters[f"failure/{trajectory.failure.value}"] += 1
                if trajectory.failure.value == "infra":
                    self.last_failure = str(trajectory.metrics.get("infra_error") or trajectory.status.value)
                result = self.buffer.add(trajectory)
            if result is AddResult.RETRY:
                attempt += 1
                self.counters["infra_retries"] += 1
                # back off, so a restarting engine or worker is not hammered into dropping every group
                await anyio.sleep(min(self.retry_backoff * 2 ** (attempt - 1), 30.0))
                continue
            if result is AddResult.GROUP_FILTERED:
                self.notify_step()  # like a dropped group, it frees its place under the staleness bound
            if result is AddResult.GROUP_DROPPED:
                self.counters["groups_dropped"] += 1
                self.groups_dropped += 1
                self.drops_in_a_row += 1
                self._dropped_now.add(group.group_id)
                self.dropped_groups.append(group.group_id)
                self.stream.mark_done(group.group_id)
                self.notify_step()  # its place under the staleness bound is free again
            return

    def take_dropped(self) -> list[str]:
        dropped, self.dropped_groups = self.dropped_groups, []
        return dropped

    def metrics(self) -> dict[str, float]:
        out = {f"rollout/{k}": float(v) for k, v in self.counters.items()}
        out["rollout/in_flight"] = float(self.in_flight)
        out["rollout/groups_started"] = float(self.groups_started)
        if self.buffer.filter_equal_rewards:  # sync mode's rounds; what was filtered is the buffer's count
            out["rollout/extra_groups_started"] = float(self.extra_groups_started)
        total = sum(self.statuses.values())
        for status, n in self.statuses.items():
            out[f"rollout/status/{status}"] = float(n)
        out["rollout/episodes"] = float(total)
        return out


def warmup_minimum(batch_trajectories: int, factor: float, n_samples: int) -> int:
    """Trajectories the first batch waits for: ``factor`` x batch, rounded up to whole groups."""
    return math.ceil(batch_trajectories * factor / n_samples) * n_samples
