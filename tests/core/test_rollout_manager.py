"""The rollout manager: bounded groups in flight, retries of infra failures, dropped groups.

The agent loop here is a labelled test double (``FakeLoop``) returning trajectories with
chosen statuses; the real loop is tested in test_agent_loop.py and end to end in
test_train_pipeline.py.
"""

from __future__ import annotations

import anyio
import pytest

from agentrl_core.train.buffer import GroupBuffer
from agentrl_core.train.rollout_manager import (
    RolloutCircuitOpen,
    RolloutManager,
    default_max_consecutive_drops,
    warmup_minimum,
)
from agentrl_core.train.task_stream import StreamTask, TaskStream
from agentrl_core.types import Trajectory, failure_kind, training_reward


def traj(request, status="completed", reward=1.0):
    return Trajectory(
        group_id=request.group_id, uid=request.uid, task=request.task, split=request.split, index=request.index,
        input_ids=[1, 2], loss_mask=[0, 1], rollout_logprobs=[0.0, -0.5], versions=[-1, 0], turns=[],
        reward=reward, training_reward=training_reward(status, reward), status=status, failure=failure_kind(status),
        sample=request.sample,
    )


class FakeLoop:
    """TEST DOUBLE of the agent loop: scripted outcomes per (group index, sample, attempt)."""

    def __init__(self, outcome=lambda request: "completed", delay=0.0):
        self.outcome = outcome
        self.delay = delay
        self.running = 0
        self.max_running = 0
        self.calls = []

    async def run(self, request):
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        self.calls.append(request.uid)
        try:
            await anyio.sleep(self.delay)
            result = self.outcome(request)
            if isinstance(result, Exception):
                raise result
            return traj(request, result)
        finally:
            self.running -= 1


def make(loop, *, n=4, concurrency=8, batch_groups=2, max_size=64, retries=2, bound=None, step=lambda: 0,
         max_drops=None):
    stream = TaskStream([StreamTask("t", "env", "s", tuple(range(100)))], n_samples=n, seed=0)
    buffer = GroupBuffer(n, max_size, max_infra_retries=retries)
    return RolloutManager(agent_loop=loop, buffer=buffer, stream=stream, concurrency=concurrency,
                          batch_groups=batch_groups, staleness_bound=bound, learner_step=step,
                          retry_backoff=0.01, max_consecutive_drops=max_drops), buffer, stream


def test_run_groups_fills_the_buffer():
    loop = FakeLoop(delay=0.01)
    manager, buffer, stream = make(loop)
    anyio.run(manager.run_groups, 3)
    assert buffer.stats().ready_trajectories == 12 and len(stream.outstanding) == 3
    assert loop.max_running <= 8


def test_run_forever_keeps_groups_in_flight_bounded():
    loop = FakeLoop(delay=0.01)
    manager, buffer, stream = make(loop, concurrency=8, max_size=16)

    async def main():
        async with anyio.create_task_group() as tg:
            tg.start_soon(manager.run_forever)
            batch = await buffer.get(8)
            assert len(batch) >= 8
            await anyio.sleep(0.3)
            tg.cancel_scope.cancel()

    anyio.run(main)
    # without a bound on groups in flight the stream would have issued thousands of groups
    assert manager.groups_started <= 2 + 16 // 4 + 8 // 4 + 2
    # every issued group is outstanding until trained (one may be waiting for admission)
    assert len(stream.outstanding) in (manager.groups_started, manager.groups_started + 1)


def test_infra_failures_are_retried_then_the_group_is_dropped():
    def outcome(request):
        if request.group_id.startswith("00000000"):
            return "task error"  # the first group always fails: dropped after 2 retries per sample
        if request.sample == 1 and "retry" not in request.uid:
            return "task error"  # retried once, then fine
        return "completed"

    loop = FakeLoop(outcome)
    manager, buffer, stream = make(loop)
    anyio.run(manager.run_groups, 2)
    stats = buffer.stats()
    assert stats.groups_dropped == 1 and stats.ready_groups == 1
    assert manager.counters["groups_dropped"] == 1
    # the dropped group is done for the stream (never re-issued); the kept one awaits training
    assert [g.group_id[:8] for g in stream.outstanding] == ["00000001"]
    assert any(uid.endswith("/1/retry1") for uid in loop.calls)


def test_loop_exception_counts_as_infra_failure():
    loop = FakeLoop(lambda r: RuntimeError("boom") if r.sample == 0 and "retry" not in r.uid else "completed")
    manager, buffer, _ = make(loop, n=2)
    anyio.run(manager.run_groups, 1)
    assert manager.counters["loop_exceptions"] == 1 and buffer.stats().ready_trajectories == 2


def test_staleness_bound_pauses_new_groups():
    step = {"v": 0}
    loop = FakeLoop(delay=0.0)
    manager, buffer, _ = make(loop, n=2, batch_groups=2, bound=1, max_size=1000, step=lambda: step["v"])

    async def main():
        async with anyio.create_task_group() as tg:
            tg.start_soon(manager.run_forever)
            await anyio.sleep(0.2)
            started_at_0 = manager.groups_started
            step["v"] = 1
            manager.notify_step()
            await anyio.sleep(0.2)
            tg.cancel_scope.cancel()
        return started_at_0

    started_at_0 = anyio.run(main)
    assert started_at_0 == (0 + 1 + 1) * 2  # (version + bound + 1) x groups per batch
    assert manager.groups_started == (1 + 1 + 1) * 2
    assert manager.counters["staleness_waits"] >= 1


@pytest.mark.parametrize(("batch", "factor", "n", "expected"), [(256 * 8, 1.7, 8, 3488), (16, 1.7, 4, 28), (8, 1.0, 8, 8)])
def test_warmup_minimum(batch, factor, n, expected):
    assert warmup_minimum(batch, factor, n) == expected


def test_dropped_groups_give_their_place_under_the_staleness_bound_back():
    # bound 0, batches of 2 groups: only 2 groups may start at version 0. The first is dropped,
    # so a third must start, or the first batch can never fill (the learner waits forever)
    loop = FakeLoop(lambda r: "task error" if r.group_id.startswith("00000000") else "completed")
    manager, buffer, _ = make(loop, n=2, batch_groups=2, bound=0, retries=0, max_size=1000)

    async def main():
        async with anyio.create_task_group() as tg:
            tg.start_soon(manager.run_forever)
            with anyio.fail_after(10):  # the guard of this test: a deadlock would wait forever
                batch = await buffer.get(4)
            tg.cancel_scope.cancel()
        return batch

    batch = anyio.run(main)
    assert sorted({t.group_id[:8] for t in batch}) == ["00000001", "00000002"]
    assert manager.groups_dropped == 1 and manager.groups_started == 3


def test_the_circuit_opens_after_too_many_dropped_groups_in_a_row():
    loop = FakeLoop(lambda r: "task error")  # every episode: the environment is broken
    manager, buffer, _ = make(loop, n=2, retries=1, concurrency=2, max_drops=3)
    with pytest.raises(RolloutCircuitOpen, match=r"3 groups in a row were dropped .*\(the last: task error\)") as info:
        anyio.run(manager.run_groups, 10)  # sync mode: one batch after another would loop forever
    assert "rollout.max_consecutive_dropped_groups" in str(info.value)

    manager, buffer, _ = make(FakeLoop(lambda r: "task error"), n=2, retries=0, max_drops=4)

    async def forever():
        with anyio.fail_after(10):  # the guard of this test: async mode would issue groups forever
            await manager.run_forever()

    with pytest.raises(RolloutCircuitOpen):
        anyio.run(forever)
    assert manager.drops_in_a_row >= 4


def test_a_kept_group_resets_the_count_of_drops_in_a_row():
    # every other group fails: never 2 in a row, so the circuit stays closed
    loop = FakeLoop(lambda r: "task error" if int(r.group_id[:8]) % 2 == 0 else "completed")
    manager, buffer, _ = make(loop, n=2, retries=0, concurrency=2, max_drops=2)
    anyio.run(manager.run_groups, 8)
    assert manager.groups_dropped == 4 and buffer.stats().ready_groups == 4
    assert default_max_consecutive_drops(256, 2048, 8) == 512 and default_max_consecutive_drops(2, 16, 2) == 16
