"""The rollout manager: bounded groups in flight, retries of infra failures, dropped groups.

The agent loop here is a labelled test double (``FakeLoop``) returning trajectories with
chosen statuses; the real loop is tested in test_agent_loop.py and end to end in
test_train_pipeline.py.
"""

from __future__ import annotations

import anyio
import pytest

from agentrl_core.train.buffer import GroupBuffer
from agentrl_core.train.rollout_manager import RolloutManager, warmup_minimum
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


def make(loop, *, n=4, concurrency=8, batch_groups=2, max_size=64, retries=2, bound=None, step=lambda: 0):
    stream = TaskStream([StreamTask("t", "env", "s", tuple(range(100)))], n_samples=n, seed=0)
    buffer = GroupBuffer(n, max_size, max_infra_retries=retries)
    return RolloutManager(agent_loop=loop, buffer=buffer, stream=stream, concurrency=concurrency,
                          batch_groups=batch_groups, staleness_bound=bound, learner_step=step,
                          retry_backoff=0.01), buffer, stream


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
