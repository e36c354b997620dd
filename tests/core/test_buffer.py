"""The group-aware buffer: whole groups, lcm alignment, admission back-pressure, infra retries."""

from __future__ import annotations

import random

import anyio
import pytest
from anyio import wait_all_tasks_blocked
from anyio.lowlevel import checkpoint

from agentrl_core.train.buffer import AddResult, BufferClosed, GroupBuffer
from agentrl_core.types import Trajectory

LIMIT_S = 10  # a guard against hangs, never a synchronization


def traj(group, sample, reward=1.0, status="completed"):
    infra = status in ("task error", "cancelled", "unknown")
    return Trajectory(
        group_id=group, uid=f"{group}/{sample}", task="t", split="train", index=0, input_ids=[1, 2], loss_mask=[0, 1],
        rollout_logprobs=[0.0, -1.0], versions=[-1, 0], turns=[], reward=reward,
        training_reward=None if infra else reward, status=status, failure="infra" if infra else "none", sample=sample,
    )


def run(fn):
    async def guarded():
        with anyio.fail_after(LIMIT_S):
            return await fn()

    return anyio.run(guarded)


def test_releases_only_whole_groups_sorted_by_group():
    async def main():
        buf = GroupBuffer(n_samples=2, max_size=8)
        for t in (traj("b", 1), traj("a", 0), traj("b", 0)):
            assert buf.add(t) is AddResult.ACCEPTED
        assert buf.stats().ready_trajectories == 2 and buf.stats().pending_trajectories == 1
        batch = await buf.get(minimum=2)
        assert [t.uid for t in batch] == ["b/0", "b/1"]
        buf.add(traj("c", 0)), buf.add(traj("c", 1)), buf.add(traj("a", 1))
        batch = await buf.get(minimum=4)
        assert [t.uid for t in batch] == ["a/0", "a/1", "c/0", "c/1"]  # sorted by group id, not completion

    run(main)


def test_get_takes_every_ready_group_aligned_to_lcm():
    async def main():
        # group size 3, multiple 2: unit lcm(3, 2) = 6 trajectories = 2 groups
        buf = GroupBuffer(n_samples=3, max_size=30)
        for g in ("g0", "g1", "g2"):
            for s in range(3):
                buf.add(traj(g, s))
        batch = await buf.get(minimum=4, multiple=2)
        assert len(batch) == 6 and {t.group_id for t in batch} == {"g0", "g1"}  # oldest first
        assert buf.stats().ready_trajectories == 3
        for g in ("g3", "g4", "g5", "g6", "g7"):
            for s in range(3):
                buf.add(traj(g, s))
        # 18 ready, minimum 7 -> every aligned group: 18 // 6 * 6 = 18
        assert len(await buf.get(minimum=7, multiple=2)) == 18

    run(main)


def test_get_waits_for_minimum():
    async def main():
        buf = GroupBuffer(n_samples=2, max_size=8)
        got = []

        async def consumer():
            got.append(await buf.get(minimum=4))

        async with anyio.create_task_group() as tg:
            tg.start_soon(consumer)
            for t in (traj("a", 0), traj("a", 1), traj("b", 0)):
                buf.add(t)
                await wait_all_tasks_blocked()
                assert not got  # 2 ready < 4
            buf.add(traj("b", 1))
        assert len(got[0]) == 4

    run(main)


def test_get_minimum_above_capacity_is_an_error():
    async def main():
        with pytest.raises(ValueError, match="raise the buffer size"):
            await GroupBuffer(n_samples=4, max_size=8).get(minimum=9)

    run(main)


def test_admission_back_pressure_never_blocks_finished_trajectories():
    async def main():
        buf = GroupBuffer(n_samples=2, max_size=4)
        await buf.admit("a")
        await buf.admit("b")
        for t in (traj("a", 0), traj("a", 1), traj("b", 0)):
            buf.add(t)
        # 3 completed, one room left: a new group may still start
        await buf.admit("c")
        buf.add(traj("b", 1))  # now 4 completed: full
        admitted = []

        async def start(group):
            await buf.admit(group)
            admitted.append(group)

        async with anyio.create_task_group() as tg:
            tg.start_soon(start, "d")
            await wait_all_tasks_blocked()
            assert admitted == []  # the new group waits
            await buf.admit("c")  # a member of an admitted group passes at once
            assert buf.add(traj("c", 0)) is AddResult.ACCEPTED  # finished work is never held up
            assert buf.completed_unconsumed == 5
            await wait_all_tasks_blocked()
            assert admitted == []
            await buf.get(minimum=4)  # consumption frees room
        assert admitted == ["d"]

    run(main)


def test_infra_failure_retried_then_group_dropped_and_counted():
    async def main():
        buf = GroupBuffer(n_samples=3, max_size=12, max_infra_retries=2)
        assert buf.add(traj("g", 0, reward=1.0)) is AddResult.ACCEPTED
        assert buf.add(traj("g", 1, status="task error")) is AddResult.RETRY
        assert buf.fail("g", 1, "engine connection reset") is AddResult.RETRY
        assert buf.wants("g")
        assert buf.add(traj("g", 1, status="cancelled")) is AddResult.GROUP_DROPPED
        assert not buf.wants("g")
        assert buf.add(traj("g", 2, reward=0.0)) is AddResult.DISCARDED  # a sibling still in flight
        stats = buf.stats()
        assert (stats.groups_dropped, stats.infra_failures, stats.infra_retries) == (1, 3, 2)
        assert stats.trajectories_discarded == 2 and stats.completed_unconsumed == 0
        assert stats.pending_groups == 0  # nothing left behind for the dropped group
        for s in range(3):
            buf.add(traj("h", s))
        batch = await buf.get(minimum=3)
        assert {t.group_id for t in batch} == {"h"}  # the failed member never scored as a zero

    run(main)


def test_zero_retries_drops_at_first_failure():
    buf = GroupBuffer(n_samples=2, max_size=4, max_infra_retries=0)
    assert buf.fail("g", 0) is AddResult.GROUP_DROPPED


def test_duplicates_rejected():
    buf = GroupBuffer(n_samples=2, max_size=4)
    buf.add(traj("g", 0))
    with pytest.raises(ValueError, match="already has sample 0"):
        buf.add(traj("g", 0))
    buf.add(traj("g", 1))
    with pytest.raises(ValueError, match="already complete"):
        buf.add(traj("g", 1))
    with pytest.raises(ValueError, match="outside"):
        buf.add(traj("x", 2))


def test_close_wakes_waiters():
    async def main():
        full = GroupBuffer(n_samples=2, max_size=2)
        full.add(traj("a", 0)), full.add(traj("a", 1))
        empty = GroupBuffer(n_samples=2, max_size=2)
        errors = []

        async def wait(coro):
            try:
                await coro
            except BufferClosed:
                errors.append(coro.__name__)

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait, full.admit("b"))
            tg.start_soon(wait, empty.get(minimum=2))
            await wait_all_tasks_blocked()
            assert errors == []
            full.close()
            empty.close()
        assert sorted(errors) == ["admit", "get"]
        with pytest.raises(BufferClosed):
            full.add(traj("c", 0))

    run(main)


def test_concurrent_producers_with_failures_never_hang():
    """Upstream bug: a dropped trajectory left its group stuck forever. 60 groups of 4 run
    concurrently in random order, ~15 % of attempts fail for infrastructure reasons; every
    group ends released or dropped, the learner receives only whole, scored groups."""

    async def main():
        rng = random.Random(7)
        n, groups = 4, [f"g{i:03d}" for i in range(60)]
        buf = GroupBuffer(n_samples=n, max_size=24, max_infra_retries=1)
        received: list = []
        limiter = anyio.Semaphore(10)

        async def sample(group, s):
            async with limiter:
                while buf.wants(group):
                    for _ in range(rng.randint(0, 3)):
                        await checkpoint()
                    failed = rng.random() < 0.15
                    result = buf.add(traj(group, s, reward=rng.random(), status="task error" if failed else "completed"))
                    if result is not AddResult.RETRY:
                        return

        async def producer():
            async with anyio.create_task_group() as tg:
                for group in groups:
                    await buf.admit(group)
                    for s in range(n):
                        tg.start_soon(sample, group, s)

        async def consumer():
            while True:
                stats = buf.stats()
                if stats.groups_released + stats.groups_dropped == len(groups) and stats.ready_trajectories == 0:
                    return
                if stats.groups_released * n - len(received) >= n:
                    received.extend(await buf.get(minimum=n))
                else:
                    await checkpoint()

        async with anyio.create_task_group() as tg:
            tg.start_soon(producer)
            tg.start_soon(consumer)
        stats = buf.stats()
        assert stats.groups_dropped > 0 and stats.infra_retries > 0
        assert stats.groups_released + stats.groups_dropped == len(groups)
        assert stats.pending_groups == 0 and stats.pending_trajectories == 0
        by_group: dict = {}
        for t in received:
            by_group.setdefault(t.group_id, []).append(t)
        assert len(by_group) == stats.groups_released
        assert all(sorted(t.sample for t in ts) == list(range(n)) for ts in by_group.values())
        assert all(t.training_reward is not None for t in received)

    run(main)
