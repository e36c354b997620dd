"""Dynamic sampling (DAPO): groups whose rewards are all equal never reach the learner unless a
fallback needs them; more groups are generated within a bound; every count is checked by hand.

The buffer is tested with hand-built groups; the rollout manager with the labelled test double
of test_rollout_manager.py (``FakeLoop``), whose rewards are scripted per group and sample.
docs/architecture.md section 6.
"""

from __future__ import annotations

import anyio
import attrs
import pytest
from anyio import wait_all_tasks_blocked

from agentrl_core.config import DynamicSamplingConfig, config_from_dict
from agentrl_core.train.buffer import AddResult, GroupBuffer, TakeStats
from agentrl_core.train.rollout_manager import RolloutManager
from agentrl_core.train.task_stream import StreamTask, TaskStream
from agentrl_core.types import Trajectory, failure_kind, training_reward

LIMIT_S = 10  # a guard against hangs, never a synchronization


def traj(group, sample, reward):
    return Trajectory(
        group_id=group, uid=f"{group}/{sample}", task="t", split="train", index=0, input_ids=[1, 2], loss_mask=[0, 1],
        rollout_logprobs=[0.0, -1.0], versions=[-1, 0], turns=[], reward=reward, training_reward=reward,
        status="completed", failure="none", sample=sample,
    )


def add_group(buf, group, rewards):
    """File a whole group; the result of its last member (the one that completes it)."""
    return [buf.add(traj(group, s, r)) for s, r in enumerate(rewards)][-1]


def run(fn):
    async def guarded():
        with anyio.fail_after(LIMIT_S):
            return await fn()

    return anyio.run(guarded)


def ids(batch):
    return sorted({t.group_id for t in batch})


# -- the buffer, with hand-built groups ------------------------------------------------------


def test_equal_rewards_are_set_aside_and_a_reward_spread_is_kept():
    async def main():
        buf = GroupBuffer(n_samples=3, max_size=12, filter_equal_rewards=True)
        assert add_group(buf, "a", [1.0, 1.0, 1.0]) is AddResult.GROUP_FILTERED  # all solved: no signal
        assert add_group(buf, "b", [0.0, 1.0, 0.0]) is AddResult.ACCEPTED
        assert add_group(buf, "c", [-0.2, -0.2, -0.2]) is AddResult.GROUP_FILTERED  # all failed alike
        assert add_group(buf, "d", [0.5, 0.5, 0.25]) is AddResult.ACCEPTED  # fractional rewards, one apart
        stats = buf.stats()
        assert (stats.ready_groups, stats.groups_filtered, stats.set_aside_groups) == (2, 2, 2)
        assert stats.completed_unconsumed == 6  # set-aside groups never hold up admission
        batch = await buf.get(minimum=6)
        assert ids(batch) == ["b", "d"]
        assert buf.last_take == TakeStats(asked=2, useful=2, filtered=2, filled=0, fallback=False)
        assert buf.take_spent() == ["a", "c"] and buf.take_spent() == []  # never trained: done in the stream
        assert buf.stats().set_aside_groups == 0

    run(main)


def test_without_filtering_equal_rewards_reach_the_learner():
    async def main():
        buf = GroupBuffer(n_samples=2, max_size=8)
        assert add_group(buf, "a", [1.0, 1.0]) is AddResult.ACCEPTED
        assert ids(await buf.get(minimum=2)) == ["a"]
        assert buf.last_take is None and buf.take_spent() == []

    run(main)


def test_get_waits_for_useful_groups_until_the_bound_then_fills():
    async def main():
        # ask 2 groups of 2, at most 1 extra: the wait ends when 3 groups have completed
        buf = GroupBuffer(n_samples=2, max_size=8, filter_equal_rewards=True, max_extra_groups=1)
        got = []

        async def learner():
            got.append(await buf.get(minimum=4))

        async with anyio.create_task_group() as tg:
            tg.start_soon(learner)
            add_group(buf, "u1", [0.0, 1.0])
            add_group(buf, "f1", [0.0, 0.0])
            await wait_all_tasks_blocked()
            assert got == []  # 2 completed < 2 asked + 1 extra
            add_group(buf, "f2", [1.0, 1.0])
        # one useful group, filled with the most recent set-aside one
        assert ids(got[0]) == ["f2", "u1"] and len(got[0]) == 4
        take = buf.last_take
        assert take == TakeStats(asked=2, useful=1, filtered=2, filled=1, fallback=True)
        assert (take.extra, take.useful_share) == (1, pytest.approx(1 / 3))
        assert take.as_metrics() == {
            "dynamic_sampling/groups_filtered": 2.0, "dynamic_sampling/extra_groups": 1.0,
            "dynamic_sampling/useful_share": pytest.approx(1 / 3), "dynamic_sampling/useful_groups": 1.0,
            "dynamic_sampling/filled_groups": 1.0, "dynamic_sampling/fallback": 1.0,
        }
        assert buf.take_spent() == ["f1"]
        stats = buf.stats()
        assert (stats.groups_filtered, stats.groups_filled, stats.fallback_hits) == (2, 1, 1)
        assert buf.groups_filtered_untrained == 1

    run(main)


def test_useful_fallback_trains_the_useful_groups_alone():
    async def main():
        buf = GroupBuffer(n_samples=2, max_size=8, filter_equal_rewards=True, max_extra_groups=1, fallback="useful")
        add_group(buf, "u1", [0.0, 1.0])
        add_group(buf, "f1", [0.0, 0.0])
        add_group(buf, "f2", [1.0, 1.0])
        batch = await buf.get(minimum=4)
        assert ids(batch) == ["u1"]
        assert buf.last_take == TakeStats(asked=2, useful=1, filtered=2, filled=0, fallback=True)
        assert buf.take_spent() == ["f1", "f2"]

    run(main)


@pytest.mark.parametrize("fallback", ["fill", "useful"])
def test_a_step_is_never_empty(fallback):
    async def main():
        # nothing useful at all: both fallbacks fill, the most recent groups first
        buf = GroupBuffer(n_samples=2, max_size=8, filter_equal_rewards=True, max_extra_groups=1, fallback=fallback)
        for g in ("f1", "f2", "f3"):
            assert add_group(buf, g, [0.0, 0.0]) is AddResult.GROUP_FILTERED
        batch = await buf.get(minimum=4)
        assert ids(batch) == ["f2", "f3"]
        assert buf.last_take == TakeStats(asked=2, useful=0, filtered=3, filled=2, fallback=True)
        assert buf.last_take.useful_share == 0.0
        assert buf.take_spent() == ["f1"]

    run(main)


def test_take_ready_falls_back_without_waiting_and_aligns_to_the_unit():
    buf = GroupBuffer(n_samples=2, max_size=12, filter_equal_rewards=True)
    add_group(buf, "u1", [0.0, 1.0])
    add_group(buf, "f1", [1.0, 1.0])
    # ask 8 trajectories (4 groups): 1 useful + the 1 set aside, all there is
    assert ids(buf.take_ready(8)) == ["f1", "u1"]
    assert buf.last_take == TakeStats(asked=4, useful=1, filtered=1, filled=1, fallback=True)
    add_group(buf, "u2", [0.0, 1.0])
    add_group(buf, "u3", [1.0, 0.0])
    add_group(buf, "u4", [0.5, 0.0])
    add_group(buf, "f2", [0.0, 0.0])
    add_group(buf, "f3", [0.0, 0.0])
    # unit lcm(2, 4) = 4 trajectories: of 3 useful groups 2 align; filled up to the 4 groups asked
    assert ids(buf.take_ready(8, multiple=4)) == ["f2", "f3", "u2", "u3"]
    assert buf.last_take == TakeStats(asked=4, useful=2, filtered=2, filled=2, fallback=True)
    assert ids(buf.take_ready(4)) == ["u4"]  # what did not align, short of the ask and nothing to fill with
    assert buf.take_ready(4) == []  # nothing at all: no step, and no fallback counted
    assert buf.stats().fallback_hits == 3 and buf.take_spent() == []


def test_admission_counts_filtered_groups_within_the_bound():
    async def main():
        # 4 trajectories make the buffer full; with 1 extra group allowed, 6 completed for the step
        buf = GroupBuffer(n_samples=2, max_size=4, filter_equal_rewards=True, max_extra_groups=1)
        admitted = []

        async def start(group):
            await buf.admit(group)
            admitted.append(group)

        for g in ("f1", "f2"):
            await buf.admit(g)
            add_group(buf, g, [0.0, 0.0])
        assert buf.has_room()  # 4 filtered < 4 + 2
        await buf.admit("u1")
        add_group(buf, "u1", [0.0, 1.0])
        assert not buf.has_room()  # 2 ready + 4 filtered: a producer whose groups are filtered stops here
        async with anyio.create_task_group() as tg:
            tg.start_soon(start, "g")
            await wait_all_tasks_blocked()
            assert admitted == []
            assert ids(await buf.get(minimum=4)) == ["f2", "u1"]  # the bound is hit at once: fill
        assert admitted == ["g"]  # the take cleared the step's count

    run(main)


def test_set_aside_groups_beyond_any_fill_are_spent_at_once():
    buf = GroupBuffer(n_samples=2, max_size=4, filter_equal_rewards=True)
    for g in ("f1", "f2", "f3"):
        add_group(buf, g, [1.0, 1.0])
    # a fill never needs more than max_size trajectories (2 groups): the oldest goes
    assert buf.take_spent() == ["f1"] and buf.stats().set_aside_groups == 2
    assert ids(buf.take_ready(4)) == ["f2", "f3"]


def test_filtering_needs_groups_of_two():
    with pytest.raises(ValueError, match="at least 2 samples"):
        GroupBuffer(n_samples=1, max_size=4, filter_equal_rewards=True)
    with pytest.raises(ValueError, match="max_extra_groups must be >= 0"):
        GroupBuffer(n_samples=2, max_size=4, filter_equal_rewards=True, max_extra_groups=-1)
    assert GroupBuffer(n_samples=2, max_size=4, max_extra_groups=3).max_extra_groups == 0  # no filter: no extra
    with pytest.raises(ValueError, match="'fill' or 'useful'"):
        GroupBuffer(n_samples=2, max_size=4, filter_equal_rewards=True, fallback="drop")


def test_config_keys_and_defaults():
    assert DynamicSamplingConfig() == DynamicSamplingConfig(enabled=False, max_extra_factor=1.0, fallback="fill")
    config = config_from_dict({"rollout": {"batch_size": 5, "dynamic_sampling": {
        "enabled": True, "max_extra_factor": 0.5, "fallback": "useful"}}}, validate_plugins=False)
    dynamic = config.rollout.dynamic_sampling
    assert dynamic.enabled and dynamic.fallback == "useful"
    assert dynamic.max_extra_groups(config.rollout.batch_size) == 3  # ceil(0.5 x 5)


# -- the rollout manager ------------------------------------------------------------------------


class RewardLoop:
    """TEST DOUBLE of the agent loop: the reward of each sample is ``reward(seq, sample)``."""

    def __init__(self, reward, delay=0.0):
        self.reward = reward
        self.delay = delay
        self.calls = 0

    async def run(self, request):
        self.calls += 1
        await anyio.sleep(self.delay)
        seq = int(request.group_id[:8])
        reward = self.reward(seq, request.sample)
        return Trajectory(
            group_id=request.group_id, uid=request.uid, task=request.task, split=request.split, index=request.index,
            input_ids=[1, 2], loss_mask=[0, 1], rollout_logprobs=[0.0, -0.5], versions=[-1, 0], turns=[],
            reward=reward, training_reward=training_reward("completed", reward), status="completed",
            failure=failure_kind("completed"), sample=request.sample,
        )


def make(loop, *, max_extra, n=2, batch_groups=4, max_size=64, fallback="fill", bound=None, step=lambda: 0):
    stream = TaskStream([StreamTask("t", "env", "s", tuple(range(100)))], n_samples=n, seed=0)
    buffer = GroupBuffer(n, max_size, filter_equal_rewards=True, max_extra_groups=max_extra, fallback=fallback)
    manager = RolloutManager(agent_loop=loop, buffer=buffer, stream=stream, concurrency=8, batch_groups=batch_groups,
                             staleness_bound=bound, learner_step=step, retry_backoff=0.01)
    return manager, buffer, stream


def mixed_if_odd(seq, sample):
    return float(sample % 2) if seq % 2 else 1.0  # odd groups 0/1, even groups all 1


def test_sync_rounds_fill_the_batch_sized_by_the_useful_share():
    manager, buffer, stream = make(RewardLoop(mixed_if_odd), max_extra=8)
    anyio.run(manager.run_batch, 4)
    # round 1: groups 0..3, 2 useful, 2 filtered; share 1/2: ceil(2 missing x 4 / 2) = 4 more (not 2)
    assert manager.groups_started == 8 and manager.extra_groups_started == 4 and buffer.stats().groups_filtered == 4
    batch = buffer.take_ready(4 * 2)
    assert [g[:8] for g in ids(batch)] == ["00000001", "00000003", "00000005", "00000007"]
    assert all(len({t.training_reward for t in batch if t.group_id == g}) == 2 for g in ids(batch))
    assert buffer.last_take == TakeStats(asked=4, useful=4, filtered=4, filled=0, fallback=False)
    assert manager.metrics()["rollout/extra_groups_started"] == 4.0
    stream.mark_done(ids(batch))
    stream.mark_done(buffer.take_spent())
    assert stream.outstanding == []  # every group issued is trained or spent: none re-issued on resume


def test_sync_rounds_stop_at_the_bound_and_the_fallback_fills():
    manager, buffer, stream = make(RewardLoop(lambda seq, sample: 0.0), batch_groups=2, max_extra=3)
    anyio.run(manager.run_batch, 2)
    # nothing useful: rounds of a batch (2), then the 1 left under the bound
    assert manager.groups_started == 5 and manager.extra_groups_started == 3
    batch = buffer.take_ready(2 * 2)
    assert [g[:8] for g in ids(batch)] == ["00000003", "00000004"]  # the two most recent
    assert buffer.last_take == TakeStats(asked=2, useful=0, filtered=5, filled=2, fallback=True)
    assert buffer.last_take.extra == 3
    assert sorted(g[:8] for g in buffer.take_spent()) == ["00000000", "00000001", "00000002"]


def test_sync_without_extra_budget_runs_exactly_one_batch():
    manager, buffer, _ = make(RewardLoop(mixed_if_odd), max_extra=0)
    anyio.run(manager.run_batch, 4)
    assert manager.groups_started == 4
    assert ids(buffer.take_ready(8))[0][:8] == "00000000"  # 2 useful + 2 filled
    assert buffer.last_take == TakeStats(asked=4, useful=2, filtered=2, filled=2, fallback=True)


def test_async_learner_gets_only_useful_groups_while_the_bound_allows():
    manager, buffer, _ = make(RewardLoop(mixed_if_odd, delay=0.001), batch_groups=2, max_extra=100)

    async def main():
        async with anyio.create_task_group() as tg:
            tg.start_soon(manager.run_forever)
            batch = await buffer.get(2 * 2)
            tg.cancel_scope.cancel()
        return batch

    batch = run(main)
    assert all(int(g[:8]) % 2 for g in ids(batch)) and len(ids(batch)) >= 2
    assert not buffer.last_take.fallback and buffer.last_take.filled == 0
    assert buffer.last_take.filtered >= 1


def test_filtered_groups_give_their_place_under_the_staleness_bound_back():
    # bound 0, batches of 2 groups: 2 groups may start at version 0. Every group is filtered; if
    # they kept their places, the producer would stop at 2 and the learner would wait forever
    manager, buffer, _ = make(RewardLoop(lambda seq, sample: 1.0), batch_groups=2, bound=0, max_extra=3)

    async def main():
        async with anyio.create_task_group() as tg:
            tg.start_soon(manager.run_forever)
            batch = await buffer.get(2 * 2)
            tg.cancel_scope.cancel()
        return batch

    batch = run(main)
    assert len(batch) == 4 and buffer.last_take.fallback and buffer.last_take.filled == 2
    assert buffer.last_take.filtered >= 5 and manager.groups_started >= 5


# -- the trainer's loop, in both modes ----------------------------------------------------------


class RecordingLearners:
    """TEST DOUBLE of the learner ranks: records each step's samples, syncs at once."""

    def __init__(self):
        self.steps = []

    async def train_step(self, samples):
        self.steps.append(samples)
        return {"num_tokens": float(sum(sum(s.loss_mask) for s in samples))}

    async def sync(self, pools, version):
        return {}


def trainer_for(tmp_path, mode, loop, *, task=None, estimator="grpo", **dynamic):
    from agentrl_core.jobs.training import Trainer
    from agentrl_core.train.advantages import build_advantage_fns
    from agentrl_core.train.engine_watch import EngineWatchdog

    config = config_from_dict({
        "run": {"output_dir": str(tmp_path)}, "model": {"path": "/m"}, "tasks": [{"env": "calc", **(task or {})}],
        "advantage": {"estimator": estimator},
        "rollout": {"n_samples": 2, "batch_size": 2, "concurrency": 4, "dynamic_sampling": {"enabled": True, **dynamic}},
        "train": {"mode": mode, "total_steps": 2, "checkpoint_every": 0},
        "logging": {"loggers": [], "sample_rollouts": 0, "progress": False},
    }, validate_plugins=False)
    trainer = Trainer(config, echo=lambda *a: None)
    trainer.pools = type("Pools", (), {"learner": RecordingLearners()})()
    trainer.learner_lock, trainer.metrics_out, trainer.engine_pools = anyio.Lock(), [], {}
    trainer.watchdog = EngineWatchdog({}, restart=None, interval=1.0, unhealthy_checks=1, max_restarts=0)
    trainer.sampler = trainer.build_sampler()
    trainer.pool_specs = trainer.sampler.pools()
    trainer.stream = TaskStream([StreamTask("calc-train", "calc", "train", tuple(range(100)))], n_samples=2, seed=0)
    trainer.estimator, trainer.normalizers = build_advantage_fns(config.advantage, trainer.registry)
    trainer._build_rollout(loop)
    return trainer


def test_the_trainer_scales_a_tasks_rewards_before_its_estimator(tmp_path):
    # tasks[].reward_scale 0.5 with RLOO (no std division): odd groups' rewards 0 and 1 enter as
    # 0 and 0.5, so the advantages are 0.5 * 2 - 0.25 * 2 = +-0.5 instead of +-1
    trainer = trainer_for(tmp_path, "sync", RewardLoop(mixed_if_odd), task={"reward_scale": 0.5}, estimator="rloo")
    run(trainer._run_sync)
    advantages = sorted({a for samples in trainer.pools.learner.steps for s in samples for a in s.advantages if a})
    assert advantages == [-0.5, 0.5]
    assert trainer.history[0]["task/calc-train/reward"] == 0.5  # metrics keep the environment's reward


def trained_steps(trainer):
    return [sorted({s.group_id[:8] for s in samples}) for samples in trainer.pools.learner.steps]


def test_sync_trainer_trains_useful_groups_and_marks_the_filtered_done(tmp_path):
    trainer = trainer_for(tmp_path, "sync", RewardLoop(mixed_if_odd))
    run(trainer._run_sync)
    # each step: groups 4k, 4k+1, then one round of 2 more (share 1/2); the odd ones are trained
    assert trained_steps(trainer) == [["00000001", "00000003"], ["00000005", "00000007"]]
    assert trainer.stream.outstanding == []  # the even ones were spent: none re-issued on resume
    for metrics in trainer.history:
        assert metrics["dynamic_sampling/groups_filtered"] == 2.0 and metrics["dynamic_sampling/extra_groups"] == 2.0
        assert metrics["dynamic_sampling/useful_share"] == 0.5 and metrics["dynamic_sampling/fallback"] == 0.0
    assert trainer.history[-1]["buffer/groups_filtered"] == 4.0 and trainer.history[-1]["rollout/extra_groups_started"] == 4.0


def test_sync_trainer_fallback_fills_with_zero_advantage_groups(tmp_path):
    # rewards 1, 1 in every group: no signal anywhere; the bound (ceil(0.5 x 2) = 1 extra) is hit
    trainer = trainer_for(tmp_path, "sync", RewardLoop(lambda seq, sample: 1.0), max_extra_factor=0.5)
    run(trainer._run_sync)
    assert trained_steps(trainer) == [["00000001", "00000002"], ["00000004", "00000005"]]
    for samples in trainer.pools.learner.steps:
        assert all(a == 0.0 for s in samples for a in s.advantages)  # GRPO: r - mean = 0; the step is never empty
    assert [m["dynamic_sampling/fallback"] for m in trainer.history] == [1.0, 1.0]
    assert [m["dynamic_sampling/filled_groups"] for m in trainer.history] == [2.0, 2.0]
    assert trainer.history[-1]["buffer/fallback_hits"] == 2.0
    assert trainer.stream.outstanding == []


def test_async_trainer_trains_only_useful_groups(tmp_path):
    trainer = trainer_for(tmp_path, "async", RewardLoop(mixed_if_odd, delay=0.001), max_extra_factor=10.0)
    trainer.config = attrs.evolve(trainer.config, rollout=attrs.evolve(trainer.config.rollout, warmup_factor=1.0))
    run(trainer._run_async)
    steps = trained_steps(trainer)
    assert len(steps) == 2 and all(int(g) % 2 for step in steps for g in step)
    assert all(m["dynamic_sampling/useful_share"] > 0 for m in trainer.history)
    # trained or spent groups are done; what is left is in flight or ready, never an even group already set aside
    done = {g for step in steps for g in step}
    assert not done & {g.group_id[:8] for g in trainer.stream.outstanding}


def test_groups_of_one_cannot_be_filtered(tmp_path):
    from agentrl_core.errors import ConfigError
    from agentrl_core.jobs.training import Trainer

    config = config_from_dict({"model": {"path": "/m"}, "tasks": [{"env": "calc"}],
                               "rollout": {"n_samples": 1, "dynamic_sampling": {"enabled": True}}},
                              validate_plugins=False)
    with pytest.raises(ConfigError, match="rollout.dynamic_sampling.enabled needs rollout.n_samples >= 2"):
        Trainer(config)


def test_async_producer_stops_when_every_group_is_filtered():
    # nobody takes: without counting filtered groups at admission the producer would run through
    # the task stream forever; with it, it stops at max_size + the bound: 8 + 2 x 2 trajectories =
    # 6 groups, overshot by at most the groups admitted while others ran (4 slots in flight)
    manager, buffer, stream = make(RewardLoop(lambda seq, sample: 0.0), batch_groups=2, max_size=8, max_extra=2)

    async def main():
        async with anyio.create_task_group() as tg:
            tg.start_soon(manager.run_forever)
            await wait_all_tasks_blocked()
            tg.cancel_scope.cancel()

    run(main)
    assert buffer.stats().groups_filtered == manager.groups_started
    assert 6 <= manager.groups_started < 6 + 4
