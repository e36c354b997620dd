"""Ray placement on GPUs without a GPU: ``ray.init(num_gpus=4)`` declares four fake GPUs.

Ray hands each actor GPU ids and sets ``CUDA_VISIBLE_DEVICES`` exactly as on a GPU node; the
engines are SGLang TEST DOUBLES (``sglang_double.py``) started by the real SGLang driver in
the real engine host actors, and report the devices they were given. Checked: in async mode
learner ranks and every engine see disjoint GPUs; colocated (sync) they share them; a
tensor-parallel engine's two ranks join the weight-update group, and a weight sync from the
real (CPU) learner ranks reaches them.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import anyio
import httpx
import pytest
from sglang_double import install_shim

from agentrl_core.config import config_from_dict
from agentrl_core.launch.placement import plan_placement
from agentrl_core.types import PoolSpec

pytestmark = pytest.mark.processes

ray = pytest.importorskip("ray")
CURRENT = [PoolSpec("current", 1.0, 1)]


class ProbeRank:
    """TEST DOUBLE of a learner rank: the real constructor's arguments, no learner; reports what Ray gave it."""

    def __init__(self, rank, world_size, master, devices, kind, model_path, config):
        self.seen = {"rank": rank, "devices": list(devices), "master": tuple(master),
                     "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "ray_gpus": [str(g) for g in ray.get_gpu_ids()]}

    def ready(self):
        return self.seen["rank"]

    def report(self):
        return self.seen

    def shutdown(self):
        pass


@pytest.fixture(scope="module")
def fake_gpus(tmp_path_factory):
    shim = install_shim(tmp_path_factory.mktemp("shim"))
    here = str(Path(__file__).parent)  # the workers import ProbeRank from this module
    ray.init(num_cpus=8, num_gpus=4, include_dashboard=False, logging_level=logging.WARNING,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(shim), here]),
                                       "SGLANG_DOUBLE_STARTUP_S": "0"}})
    try:
        yield
    finally:
        ray.shutdown()


def run_config(model_dir, world_size):
    return config_from_dict({
        "model": {"path": str(model_dir)},
        "engine": {"driver": "sglang", "sglang": {"python": sys.executable, "tp_size": 2, "startup_timeout": 60}},
        "train": {"device": "cpu", "world_size": world_size},
        "loss": {"kl_coef": 0.0},
        "weight_sync": {"backend": "gloo", "timeout_s": 120},
    }, validate_plugins=False)


def engine_state(url):
    return httpx.get(url + "/double/state", timeout=30).json()


def visible(actor):
    return ray.get(actor.__ray_call__.remote(lambda self: os.environ.get("CUDA_VISIBLE_DEVICES")))


def test_async_learner_and_engines_get_disjoint_gpus_and_tp_ranks_join(fake_gpus, tiny_model_dir, tmp_path):
    from agentrl_core.launch.ray_pools import RayPools

    placement = plan_placement([0, 1, 2], CURRENT, kind="cuda", mode="async", rollout_ratio=0.67,
                               learner_ranks=1, tp_size=2)
    assert placement.pools == {"current": [[0, 1]]} and placement.learner == [[2]]
    config = run_config(tiny_model_dir, 1)
    pools = RayPools(placement, config, model_path=str(tiny_model_dir), run_dir=tmp_path)
    try:
        learner_gpus = [visible(r) for r in pools.ranks]
        [url] = pools.urls["current"]
        engine_gpus = engine_state(url)["env"]["CUDA_VISIBLE_DEVICES"].split(",")
        # Ray's physical ids (not the placement's indices): one each, two for the engine, none shared
        assert all(len(g.split(",")) == 1 for g in learner_gpus) and len(engine_gpus) == 2
        assert len({*learner_gpus, *engine_gpus}) == 3
        assert pools.ranks_per_engine == {"current": 2}
        # no engine on a learner GPU: NCCL could carry the weights, and the engine keeps its memory
        assert pools.shared == {"current": {"rank0": False, "any_rank": False}}
        assert "--enable-memory-saver" not in engine_state(url)["argv"]

        async def connect_and_sync():
            await pools.learner.connect(pools.urls, pools.learner_address, pools.ranks_per_engine)
            return await pools.learner.sync(["current"], 4)

        metrics = anyio.run(connect_and_sync)
        state = engine_state(url)
        [group] = state["groups"].values()
        assert group == {"ranks": [1, 2], "world_size": 3}  # both TP ranks of the engine joined
        assert state["weight_version"] == "4" and len(state["tensors"]) == metrics["weight_sync/current/tensors"]
        assert {t["dtype"] for t in state["tensors"].values()} == {"float32"}  # auto on a CPU learner
    finally:
        pools.shutdown()


def test_colocated_sync_mode_shares_each_gpu(fake_gpus, tiny_model_dir, tmp_path):
    from agentrl_core.launch.ray_pools import RayPools

    placement = plan_placement([0, 1, 2, 3], CURRENT, kind="cuda", mode="sync", rollout_ratio=0.5,
                               learner_ranks=4, tp_size=2)
    assert placement.colocated and placement.pools == {"current": [[0, 1], [2, 3]]}
    pools = RayPools(placement, run_config(tiny_model_dir, 4), model_path=str(tiny_model_dir), run_dir=tmp_path,
                     learner_cls=ProbeRank)
    try:
        ranks = ray.get([r.report.remote() for r in pools.ranks])
        assert sorted(r["visible"] for r in ranks) == ["0", "1", "2", "3"]  # one GPU per rank, none twice
        assert all(r["ray_gpus"] == [r["visible"]] == r["devices"] for r in ranks)
        engines = [set(engine_state(u)["env"]["CUDA_VISIBLE_DEVICES"].split(",")) for u in pools.urls["current"]]
        # each engine shares its two GPUs with the two learner ranks placed on the same devices
        assert engines == [{ranks[0]["visible"], ranks[1]["visible"]}, {ranks[2]["visible"], ranks[3]["visible"]}]
        assert {r["master"][0] for r in ranks} == {pools.learner_address}
        # (node, physical GPU) of learner rank 0 is an engine's: gloo, and the engines release memory
        assert pools.shared == {"current": {"rank0": True, "any_rank": True}}
        assert all("--enable-memory-saver" in engine_state(u)["argv"] for u in pools.urls["current"])
    finally:
        pools.shutdown()


def test_on_a_cluster_the_gpus_are_the_clusters_not_the_drivers(fake_gpus):
    # the driver of `agentrl train --address` may run on a node without GPUs (this one has none)
    from agentrl_core.jobs.training import Trainer

    config = config_from_dict({"model": {"path": "/m"}, "tasks": [{"env": "calc"}],
                               "launch": {"address": "auto"}}, validate_plugins=False)
    assert Trainer(config).devices() == ("cuda", [0, 1, 2, 3])
    config = config_from_dict({"model": {"path": "/m"}, "tasks": [{"env": "calc"}], "train": {"device": "cpu"},
                               "launch": {"address": "auto"}}, validate_plugins=False)
    assert Trainer(config).devices()[0] == "cpu"
