"""Colocated learner and engines: which weight-sync backend, and engine memory released around learner steps.

* :func:`shared_devices` / :func:`choose_backend` / :func:`release_pools` for every placement
  case (async on separate GPUs, sync colocated, one GPU, cross pools, tensor parallel, two nodes);
* the gloo path when the engine shares learner rank 0's device, end to end with two real
  processes (the learner's rank 0 here, an hf engine process as rank 1);
* the hf engine's ``/release_memory_occupation`` and ``/resume_memory_occupation``;
* the trainer: in a sync-mode colocated run the engines release before each learner step and
  resume before the next generation.

The SGLang side (the strict double's release/resume semantics) is in ``test_sglang_driver.py``.
"""

from __future__ import annotations

import anyio
import httpx
import pytest
import torch

from agentrl_core.errors import ConfigError
from agentrl_core.launch.placement import plan_placement, release_pools, shared_devices
from agentrl_core.train.weight_sync import WeightSyncError, choose_backend
from agentrl_core.types import PoolSpec

CURRENT = [PoolSpec("current", 1.0, 1)]
CROSS = [PoolSpec("current", 0.75, 1), PoolSpec("stale", 0.25, 25)]


# -- the choice, for every placement case -----------------------------------------------------


def test_async_on_separate_gpus_shares_nothing_and_picks_nccl():
    p = plan_placement(list(range(4)), CROSS, kind="cuda", mode="async", rollout_ratio=0.5, learner_ranks=2)
    shared = shared_devices(p)
    assert shared == {"current": {"rank0": False, "any_rank": False}, "stale": {"rank0": False, "any_rank": False}}
    assert choose_backend("auto", cuda=True, shared_device=False) == ("nccl", "the engines are on GPUs of their own")
    assert release_pools(None, "cuda", shared) == []


def test_sync_mode_colocates_every_pool_with_the_learner():
    p = plan_placement(list(range(4)), CURRENT, kind="cuda", mode="sync", rollout_ratio=0.5, learner_ranks=4)
    shared = shared_devices(p)
    assert shared == {"current": {"rank0": True, "any_rank": True}}
    backend, why = choose_backend("auto", cuda=True, shared_device=shared["current"]["rank0"])
    assert backend == "gloo" and "shares learner rank 0's GPU" in why
    assert release_pools(None, "cuda", shared) == ["current"]  # auto: on, on a shared GPU


def test_async_on_one_gpu_falls_back_to_colocated():
    p = plan_placement([0], CROSS, kind="cuda", mode="async", rollout_ratio=0.5, learner_ranks=1)
    shared = shared_devices(p)
    assert all(s == {"rank0": True, "any_rank": True} for s in shared.values())
    assert release_pools(None, "cuda", shared) == ["current", "stale"]


def test_an_engine_on_another_learner_ranks_gpu_releases_but_keeps_nccl():
    # sync on 2 GPUs with one 2-GPU (TP 2) engine: it shares rank 1's GPU too; with 4 learner
    # devices and tp engines on [0,1] and [2,3], the second engine is on ranks 2 and 3 only
    p = plan_placement(list(range(4)), CURRENT, kind="cuda", mode="sync", rollout_ratio=0.5, learner_ranks=4,
                       tp_size=2)
    assert p.pools["current"] == [[0, 1], [2, 3]]
    assert shared_devices(p)["current"] == {"rank0": True, "any_rank": True}
    only_other = type(p)(p.kind, [[0], [1]], {"current": [[1]]}, True)  # an engine on rank 1's GPU only
    assert shared_devices(only_other)["current"] == {"rank0": False, "any_rank": True}
    assert choose_backend("auto", cuda=True, shared_device=False)[0] == "nccl"
    assert release_pools(None, "cuda", shared_devices(only_other)) == ["current"]


def test_same_gpu_id_on_two_nodes_is_not_shared():
    # Ray reserved index 0 (learner) on node A's GPU 0 and index 1 (engine) on node B's GPU 0
    p = plan_placement([0, 1], CURRENT, kind="cuda", mode="async", rollout_ratio=0.5, learner_ranks=1)
    where = {0: ("10.0.0.2", "0"), 1: ("10.0.0.1", "0")}
    assert shared_devices(p, where.get)["current"] == {"rank0": False, "any_rank": False}
    same_node = {0: ("10.0.0.1", "0"), 1: ("10.0.0.1", "0")}  # two indices, one physical GPU: shared
    assert shared_devices(p, same_node.get)["current"]["rank0"]


def test_cpu_placements_pick_gloo_and_release_only_when_asked():
    p = plan_placement([0, 1], CURRENT, kind="cpu", mode="sync", rollout_ratio=0.5, learner_ranks=1)
    shared = shared_devices(p)
    assert choose_backend("auto", cuda=False, shared_device=True) == ("gloo", "no CUDA on learner rank 0")
    assert release_pools(None, "cpu", shared) == []  # auto: nothing to gain on CPU
    assert release_pools(True, "cpu", shared) == ["current"]
    assert release_pools(False, "cuda", {"current": {"rank0": True, "any_rank": True}}) == []


def test_explicit_choices_and_nccl_on_a_shared_gpu_is_refused_in_one_sentence():
    assert choose_backend("gloo", cuda=True, shared_device=False) == ("gloo", "set by weight_sync.backend")
    assert choose_backend("nccl", cuda=True, shared_device=False)[0] == "nccl"
    with pytest.raises(WeightSyncError) as refused:
        choose_backend("nccl", cuda=True, shared_device=True, pool="pool 'current'")
    message = str(refused.value)
    assert message.count(". ") == 0 and "NCCL refuses two ranks of one group on one device" in message
    assert "weight_sync.backend to auto" in message
    with pytest.raises(WeightSyncError, match="not one of auto, gloo, nccl"):
        choose_backend("mpi", cuda=True, shared_device=False)


def test_the_trainer_refuses_nccl_on_a_colocated_gpu_placement_before_starting_anything(tmp_path):
    from agentrl_core.config import config_from_dict
    from agentrl_core.jobs.training import Trainer

    config = config_from_dict({"run": {"output_dir": str(tmp_path)}, "model": {"path": "/m"},
                               "tasks": [{"env": "calc"}], "train": {"mode": "sync"},
                               "weight_sync": {"backend": "nccl"}}, validate_plugins=False)
    said = []
    trainer = Trainer(config, echo=said.append)
    colocated = plan_placement([0], CURRENT, kind="cuda", mode="sync", rollout_ratio=0.5, learner_ranks=1)
    with pytest.raises(ConfigError, match="weight_sync.backend nccl cannot work for pool 'current'"):
        trainer._plan_colocation(colocated)
    auto = Trainer(attrs_evolve(config, backend="auto"), echo=said.append)
    auto._plan_colocation(colocated)
    assert any("collective over gloo (an engine shares learner rank 0's GPU" in s for s in said)
    assert auto.release_pools == ["current"] and any("release their memory" in s for s in said)


def attrs_evolve(config, **weight_sync):
    import attrs

    return attrs.evolve(config, weight_sync=attrs.evolve(config.weight_sync, **weight_sync))


# -- gloo on a shared device, end to end ---------------------------------------------------------


def test_a_colocated_pool_syncs_over_gloo_between_two_real_processes(tiny_model_dir, tmp_path):
    """Learner rank 0 (this process) and an hf engine process (rank 1) on the same device:
    ``auto`` with ``shared_device`` picks gloo, and the engine ends up with the sent weights."""
    from safetensors.torch import load_file

    from agentrl_core.config import EngineConfig
    from agentrl_core.rollout.hf_driver import HFDriver
    from agentrl_core.train.weight_sync import CollectiveTransport

    torch.manual_seed(0)
    weights = [(n, t + 0.01 * torch.randn_like(t)) for n, t in load_file(str(tiny_model_dir / "model.safetensors")).items()]
    driver = HFDriver(engine=EngineConfig(device="cpu"), log_dir=str(tmp_path / "logs"))
    try:
        [url] = driver.launch("current", str(tiny_model_dir), [[0]])
        transport = CollectiveTransport(None, backend="auto", shared_device=True, pool="pool 'current'",
                                        bucket_mb=0.25, dtype="float32", timeout_s=60)
        assert transport.backend == "gloo"
        transport.connect("127.0.0.1", [url])
        try:
            stats = transport.send(iter(weights), version=5)
        finally:
            transport.close()
        assert stats["tensors"] == len(weights) and stats["buckets"] > 1
        info = httpx.get(url + "/get_model_info", timeout=30).json()
        assert info["weight_version"] == 5 and not info["paused"]
    finally:
        driver.shutdown()


# -- the hf engine's release and resume ---------------------------------------------------------


@pytest.fixture
def hf_engine(tiny_model_dir):
    from agentrl_core.engine.process import BackgroundEngine
    from agentrl_core.engine.server import EngineServer

    server = EngineServer(tiny_model_dir, device="cpu", dtype="float32", max_running_requests=4)
    with BackgroundEngine(server) as bg:
        yield server, bg.url


def test_hf_engine_releases_its_kv_cache_only_while_paused_and_resumes_it(hf_engine):
    server, url = hf_engine
    with httpx.Client(base_url=url, timeout=30) as http:
        prompt = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4, "temperature": 0.0}}
        before = http.post("/generate", json=prompt).json()["output_ids"]
        assert http.get("/get_server_info").json()["kv_cache_bytes"] > 0
        refused = http.post("/release_memory_occupation", json={})
        assert refused.status_code == 409 and "paused first" in refused.json()["detail"]
        assert http.post("/release_memory_occupation", json={"tags": ["kv"]}).status_code == 400
        http.post("/pause_generation", json={"mode": "abort"}).raise_for_status()
        released = http.post("/release_memory_occupation", json={"tags": ["kv_cache"]})
        assert released.status_code == 200 and released.json() is None  # SGLang answers null
        info = http.get("/get_server_info").json()
        assert info["kv_cache_bytes"] == 0 and info["released_memory"] == ["kv_cache"]
        blocked = http.post("/continue_generation", json={})
        assert blocked.status_code == 409 and "/resume_memory_occupation before" in blocked.json()["detail"]
        http.post("/resume_memory_occupation", json={"tags": ["kv_cache"]}).raise_for_status()
        http.post("/continue_generation", json={}).raise_for_status()
        assert http.get("/get_server_info").json()["released_memory"] == []
        assert http.post("/generate", json=prompt).json()["output_ids"] == before  # greedy: the same tokens


def test_hf_engine_weight_offload_keeps_every_view_and_value(tiny_model_dir, monkeypatch):
    """The GPU path of ``release_weights`` (storages emptied in place, refilled from host memory),
    run on CPU tensors: parameters, the fused q/k/v and gate/up views and the tied head survive."""
    from agentrl_core.engine.model import EngineModel, load_hf_model

    hf = load_hf_model(tiny_model_dir, dtype="float32", device="cpu")
    for p in hf.parameters():  # allocator memory, as on a GPU (on CPU some are mapped from the file)
        p.data = p.data.clone()
    model = EngineModel(hf, max_slots=2)
    expected = {n: p.detach().clone() for n, p in model.hf.named_parameters()}
    fused = model.blocks[0].qkv_w.clone()
    monkeypatch.setattr(model, "device", torch.device("cuda"))  # as on a GPU: offload for real
    freed = model.release_weights()
    # one storage per fused q/k/v and gate/up tensor and per other parameter: every byte counted once
    assert freed == sum(p.numel() * 4 for p in model.hf.parameters())
    assert all(p.untyped_storage().nbytes() == 0 for p in model.hf.parameters())
    assert model.blocks[0].qkv_w.untyped_storage().nbytes() == 0
    model.resume_weights()
    assert all(torch.equal(p, expected[n]) for n, p in model.hf.named_parameters())
    assert torch.equal(model.blocks[0].qkv_w, fused)
    assert model.blocks[0].qkv_w.data_ptr() == model.layers[0].self_attn.q_proj.weight.data_ptr()


# -- the trainer: release before the learner step, resume before generation ----------------------


class RecordingPool:
    """TEST DOUBLE of an EnginePool: records the memory calls in one shared log."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    async def model_info(self):
        return {"http://e": {"pause_modes": ["abort", "retract"]}}

    async def pause_generation(self, mode="abort"):
        self.log.append(("pause", self.name, mode))

    async def release_memory_occupation(self, tags=None):
        self.log.append(("release", self.name, tuple(tags)))

    async def resume_memory_occupation(self, tags=None):
        self.log.append(("resume", self.name, tuple(tags)))

    async def continue_generation(self):
        self.log.append(("continue", self.name))


def test_a_sync_colocated_run_releases_before_each_learner_step_and_resumes_before_generating(tmp_path):
    from test_dynamic_sampling import RecordingLearners, RewardLoop, mixed_if_odd, run, trainer_for

    from agentrl_core.train.engine_memory import EngineMemory

    log = []

    class Loop(RewardLoop):
        async def run(self, request):
            if not log or log[-1] != ("generate",):
                log.append(("generate",))
            return await super().run(request)

    class Learners(RecordingLearners):
        async def train_step(self, samples):
            log.append(("train",))
            return await super().train_step(samples)

        async def sync(self, pools, version):
            log.append(("sync", tuple(pools)))  # the transport pauses, sends and continues these
            return {}

    trainer = trainer_for(tmp_path, "sync", Loop(mixed_if_odd))
    trainer.pools.learner = Learners()
    # cross-style pools: "current" synced every step, "stale" never within this run
    trainer.pool_specs = [PoolSpec("current", 0.75, 1), PoolSpec("stale", 0.25, 25)]
    trainer.engine_memory = EngineMemory({"current": RecordingPool("current", log),
                                          "stale": RecordingPool("stale", log)})
    run(trainer._run_sync)
    step = [
        ("generate",),
        ("pause", "current", "abort"), ("release", "current", ("kv_cache", "weights")),
        ("pause", "stale", "abort"), ("release", "stale", ("kv_cache",)),  # not synced: keeps its weights
        ("train",),
        ("resume", "current", ("kv_cache", "weights")), ("resume", "stale", ("kv_cache",)),
        ("sync", ("current",)), ("continue", "stale"),
    ]
    assert log == step + step
    for metrics in trainer.history:
        assert metrics["time/engine_release_s"] >= 0.0 and metrics["time/engine_resume_s"] >= 0.0


def test_engine_memory_pauses_with_retract_where_the_pool_retracts():
    from agentrl_core.train.engine_memory import EngineMemory

    log = []
    memory = EngineMemory({"current": RecordingPool("current", log)}, partial_rollouts=True)

    async def main():
        await memory.release(["current"])
        await memory.resume()
        await memory.continue_unsynced(["current"])

    anyio.run(main)
    assert log == [("pause", "current", "retract"), ("release", "current", ("kv_cache", "weights")),
                   ("resume", "current", ("kv_cache", "weights"))]
