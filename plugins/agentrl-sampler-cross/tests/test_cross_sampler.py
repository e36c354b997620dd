"""The cross sampler: pools, per-turn choice, reproducibility, metrics."""

from __future__ import annotations

import random

import pytest
from agentrl_sampler_cross.sampler import CrossConfig, CrossSampler, cross_metrics

from agentrl_core.config import load_config
from agentrl_core.errors import ConfigError
from agentrl_core.plugins import get_plugin_manager
from agentrl_core.registry import Registry
from agentrl_core.rollout.sampler import turn_rng
from agentrl_core.types import Trajectory, TurnContext, TurnRecord


def ctx(group="g", sample=0, turn=0, seed=0):
    return TurnContext(group_id=group, sample=sample, turn=turn, task="t", rng=turn_rng(seed, group, sample, turn))


def test_entry_point_is_discovered_by_a_fresh_plugin_manager():
    pm = get_plugin_manager(environ={})
    assert pm.records["sampler_cross"].status == "ok"
    sampler = Registry(pm).build("sampler", "cross", {"stale_step": 5})
    assert isinstance(sampler, CrossSampler) and sampler.config.stale_step == 5


def test_config_from_yaml_with_paper_defaults(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("sampler: cross\n")
    config = load_config(path)
    assert config.sampler.name == "cross"
    assert config.sampler.options["cross"] == CrossConfig(stale_ratio=0.25, stale_step=25)
    with pytest.raises(ConfigError, match=r"sampler.cross.stale_ratio .*must be >= 0.0 and <= 1.0"):
        load_config(path, ["sampler.cross.stale_ratio=1.5"])


def test_pools_and_schedules():
    pools = CrossSampler(CrossConfig()).pools()
    assert [(p.name, p.device_share, p.sync_every) for p in pools] == [("current", 0.75, 1), ("stale", 0.25, 25)]
    pools = CrossSampler(CrossConfig(stale_ratio=0.25, stale_device_share=0.5, stale_step=5)).pools()
    assert [(p.name, p.device_share, p.sync_every) for p in pools] == [("current", 0.5, 1), ("stale", 0.5, 5)]
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        CrossSampler(CrossConfig(stale_ratio=0.0)).pools()
    assert CrossSampler(CrossConfig(stale_step=5)).min_staleness_bound() == 7


def test_choice_is_reproducible_whatever_the_order():
    sampler = CrossSampler(CrossConfig(stale_ratio=0.25))
    keys = [(f"g{g}", s, t) for g in range(20) for s in range(8) for t in range(10)]
    first = {k: sampler.choose(ctx(*k)) for k in keys}
    shuffled = keys[:]
    random.Random(1).shuffle(shuffled)
    second = {k: sampler.choose(ctx(*k)) for k in shuffled}
    assert first == second
    share = sum(v == "stale" for v in first.values()) / len(first)
    assert 0.22 < share < 0.28  # 1,600 Bernoulli(0.25) draws
    other_seed = {k: sampler.choose(ctx(*k, seed=1)) for k in keys}
    assert other_seed != first


def test_choice_matches_the_turn_rng_draw():
    sampler = CrossSampler(CrossConfig(stale_ratio=0.25))
    for turn in range(50):
        expected = "stale" if turn_rng(3, "grp", 2, turn).random() < 0.25 else "current"
        assert sampler.choose(ctx("grp", 2, turn, seed=3)) == expected


def test_evaluation_pools():
    sampler = CrossSampler(CrossConfig(pools=["a", "b"]))
    assert [p.name for p in sampler.pools()] == ["a", "b"]
    picks = [sampler.choose(ctx("g", 0, t)) for t in range(400)]
    assert 150 < picks.count("a") < 250
    weighted = CrossSampler(CrossConfig(pools=["a", "b"], weights=[1.0, 0.0]))
    assert {weighted.choose(ctx("g", 0, t)) for t in range(50)} == {"a"}
    with pytest.raises(ValueError, match="at least two"):
        CrossConfig(pools=["a"])


def traj(turns, reward, status="completed"):
    n = 1
    return Trajectory(
        group_id="g", uid="u", task="t", split="s", index=0, input_ids=[0] * n, loss_mask=[1] * n,
        rollout_logprobs=[0.0] * n, versions=[0] * n,
        turns=[TurnRecord(pool=p, engine="e", version=v, num_tokens=1, finish_reason="stop") for p, v in turns],
        reward=reward, training_reward=reward, status=status, failure="none",
    )


def test_metrics_by_hand():
    # step 10: current turns at versions 10, 9, 10; stale turns at version 5, 5
    trajs = [
        traj([("current", 10), ("stale", 5)], 1.0),
        traj([("current", 9), ("current", 10)], 0.0),
        traj([("stale", 5)], 1.0),
    ]
    m = cross_metrics(trajs, global_step=10)
    assert m["cross/stale_turn_share"] == pytest.approx(2 / 5)
    assert m["cross/current/version_lag_mean"] == pytest.approx((0 + 1 + 0) / 3)
    assert m["cross/stale/version_lag_mean"] == 5 and m["cross/stale/version_lag_max"] == 5
    assert m["cross/success_by_stale_turns/0"] == 0.0
    assert m["cross/success_by_stale_turns/1"] == 1.0
    assert m["cross/trajectories_by_stale_turns/1"] == 2
