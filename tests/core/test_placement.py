"""Device placement of learner and pools in async and sync modes."""

from __future__ import annotations

import pytest

from agentrl_core.errors import ConfigError
from agentrl_core.launch.placement import plan_placement
from agentrl_core.types import PoolSpec

CURRENT = [PoolSpec("current", 1.0, 1)]
CROSS = [PoolSpec("current", 0.75, 1), PoolSpec("stale", 0.25, 25)]


def test_async_on_two_cores_is_disjoint():
    p = plan_placement([0, 1], CURRENT, kind="cpu", mode="async", rollout_ratio=0.5, learner_ranks=1)
    assert p.pools == {"current": [[0]]} and p.learner == [[1]] and not p.colocated


def test_sync_colocates_everything():
    p = plan_placement([0, 1], CURRENT, kind="cpu", mode="sync", rollout_ratio=0.5, learner_ranks=2)
    assert p.pools == {"current": [[0, 1]]} and p.learner == [[0], [1]] and p.colocated


def test_cross_pools_split_the_rollout_share_on_gpus():
    p = plan_placement(list(range(16)), CROSS, kind="cuda", mode="async", rollout_ratio=0.5, learner_ranks=8)
    assert p.pools["current"] == [[0], [1], [2], [3], [4], [5]]
    assert p.pools["stale"] == [[6], [7]]
    assert p.learner == [[8], [9], [10], [11], [12], [13], [14], [15]]


def test_tensor_parallel_engines_and_errors():
    p = plan_placement(list(range(8)), CURRENT, kind="cuda", mode="async", rollout_ratio=0.5, learner_ranks=4, tp_size=2)
    assert p.pools["current"] == [[0, 1], [2, 3]]
    with pytest.raises(ConfigError, match="world_size=4"):
        plan_placement([0, 1, 2], CURRENT, kind="cpu", mode="async", rollout_ratio=0.5, learner_ranks=4)


def test_single_device_falls_back_to_colocated():
    p = plan_placement([0], CROSS, kind="cpu", mode="async", rollout_ratio=0.5, learner_ranks=1)
    assert p.colocated and p.pools == {"current": [[0]], "stale": [[0]]}


def test_bundles_ask_for_exactly_the_devices_there_are():
    from agentrl_core.launch.ray_pools import plan_bundles

    # async cross on 2 cores: the stale pool shares the current pool's core; each gets half of it
    # (asking a whole core each made a 3-CPU placement group on a 2-CPU Ray: it never started)
    p = plan_placement([0, 1], CROSS, kind="cpu", mode="async", rollout_ratio=0.5, learner_ranks=1)
    assert plan_bundles(p).resources == [{"CPU": 1.0}, {"CPU": 0.5}, {"CPU": 0.5}]
    # sync: 2 learner ranks and one engine over both cores
    p = plan_placement([0, 1], CURRENT, kind="cpu", mode="sync", rollout_ratio=0.5, learner_ranks=2)
    assert plan_bundles(p).resources == [{"CPU": 0.5}, {"CPU": 0.5}, {"CPU": 1.0}]
    # one device, three claimants
    p = plan_placement([0], CROSS, kind="cpu", mode="async", rollout_ratio=0.5, learner_ranks=1)
    assert 0.99999 <= sum(b["CPU"] for b in plan_bundles(p).resources) <= 1.0
    # GPUs: one GPU per disjoint bundle, plus a CPU for the actor
    p = plan_placement(list(range(16)), CROSS, kind="cuda", mode="async", rollout_ratio=0.5, learner_ranks=8)
    assert plan_bundles(p).resources == [{"GPU": 1.0, "CPU": 1}] * 16


def test_custom_resources_pin_learner_and_engine_bundles_to_nodes():
    from agentrl_core.launch.ray_pools import plan_bundles

    p = plan_placement([0, 1], CURRENT, kind="cpu", mode="async", rollout_ratio=0.5, learner_ranks=1)
    plan = plan_bundles(p, {"trainer": 1}, {"rollout": 0.5})
    assert plan.resources == [{"CPU": 1.0, "trainer": 1.0}, {"CPU": 1.0, "rollout": 0.5}]
    # GPUs: a colocated GPU bundle holds both kinds and asks for both
    p = plan_placement([0, 1], CURRENT, kind="cuda", mode="sync", rollout_ratio=0.5, learner_ranks=2)
    plan = plan_bundles(p, {"trainer": 1}, {"rollout": 1})
    assert p.learner == [[0], [1]] and p.pools == {"current": [[0], [1]]}
    assert plan.resources == [{"GPU": 1.0, "CPU": 2.0, "trainer": 1.0, "rollout": 1.0}] * 2
    assert plan.slot_bundle == [0, 1, 0, 1] and plan.slot_resources[2] == {"num_cpus": 1.0, "num_gpus": 0.5}
