"""Adapter-only weight sync (``model.lora``) and the hf engine's served adapters.

The engine's log-probs with an adapter equal the learner's merged weights; a sync sends the
adapter's bytes only and loads ``policy@vN`` without pausing; a request keeps the adapter
version it started with across a sync; a request without its adapter fails loudly.
"""

from __future__ import annotations

import threading

import anyio
import pytest
import torch
from test_engine import reference_logprobs
from test_fsdp import make_samples
from test_lora import _plain

from agentrl_core.config import LoraConfig, LossConfig, OptimConfig, TrainConfig
from agentrl_core.engine.lora import load_adapter, parse_version
from agentrl_core.engine.model import EngineModel, load_hf_model
from agentrl_core.engine.process import BackgroundEngine
from agentrl_core.engine.sampling import SamplingParams
from agentrl_core.engine.scheduler import Request, Scheduler
from agentrl_core.engine.server import EngineServer
from agentrl_core.rollout.engine_client import EngineClient, EngineError
from agentrl_core.train.adapter_sync import AdapterTransport, adapter_versions_kept
from agentrl_core.train.lora import write_adapter

# every projection the engine fuses: q/k/v (one matmul), o, gate/up (one matmul), down
LORA = LoraConfig(enabled=True, rank=4, alpha=8.0,
                  target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def learner(tiny_model_dir, world_of_one):
    from agentrl_core.train.learner import Learner

    return Learner(tiny_model_dir, train=TrainConfig(device="cpu", max_tokens_per_micro_batch=200),
                   optim=OptimConfig(lr=1e-2), loss=LossConfig(kl_coef=0.0, entropy_coef=0.0), temperature=1.0,
                   lora=LORA)


def _trained(learner, tiny_model_dir, seed):
    """One more step, so the adapter differs from the last one (and from zero)."""
    learner.train_step(make_samples(tiny_model_dir, n=4, seed=seed))
    return _plain(tiny_model_dir, dict(learner.named_full_tensors())).float()


def test_served_names_and_versions_kept():
    assert parse_version("policy@v12") == 12 and parse_version("policy") == "policy"
    assert adapter_versions_kept(0) == 2  # the newest and the one running requests started on
    assert adapter_versions_kept(3) == 4  # staleness bound + 1
    assert adapter_versions_kept(None) == 4


def test_engine_logprobs_with_the_adapter_equal_the_merged_weights_in_a_mixed_batch(
        tiny_model_dir, tiny_vocab, learner, tmp_path):
    merged = _trained(learner, tiny_model_dir, seed=1)
    base = _plain(tiny_model_dir).float()
    folder = write_adapter(learner.adapter_tensors(), tmp_path / "policy@v1", LORA, tiny_model_dir)
    model = EngineModel(load_hf_model(tiny_model_dir, dtype="float32"), max_slots=8, max_context=512)
    scheduler = Scheduler(model, eos_token_ids=[])
    adapter = load_adapter("policy@v1", folder, model=model)
    assert adapter.version == 1 and adapter.modules() == sorted(LORA.target_modules)
    scheduler.load_adapter(adapter)
    start = tiny_vocab["im_start"]
    prompts = [[start, 17, 600, 12, 99], [start, 5, 6, 7, 8, 9, 10, 11], [200, 201, 202]]
    box: dict[str, object] = {}
    done = threading.Event()

    def collect(c):
        box[c.rid] = c
        if len(box) == 6:
            done.set()

    scheduler.pause()  # queue all six, so they share every forward: adapter rows and base rows mixed
    for i, prompt in enumerate(prompts):
        params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=i, ignore_eos=True)
        scheduler.submit(Request(f"a{i}", prompt, params, collect, adapter="policy"))
        scheduler.submit(Request(f"b{i}", prompt, params, collect))
    scheduler.start()
    try:
        scheduler.call(scheduler.resume).result(30)
        assert done.wait(120)
    finally:
        scheduler.stop()
    for i, prompt in enumerate(prompts):
        served, plain = box[f"a{i}"], box[f"b{i}"]
        assert served.versions == [1] * 12 and plain.versions == [0] * 12
        lp = torch.tensor(served.logprobs)
        torch.testing.assert_close(lp, reference_logprobs(merged, prompt, served.output_ids, 1.0), rtol=0, atol=1e-4)
        assert (lp - reference_logprobs(base, prompt, served.output_ids, 1.0)).abs().max() > 1e-3
        torch.testing.assert_close(torch.tensor(plain.logprobs),
                                   reference_logprobs(base, prompt, plain.output_ids, 1.0), rtol=0, atol=1e-4)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    with BackgroundEngine(EngineServer(tiny_model_dir, max_running_requests=8, dtype="float32")) as background:
        yield background


@pytest.mark.anyio
async def test_a_request_without_its_adapter_fails_loudly(engine):
    async with EngineClient(engine.url, lora="nothing") as client:
        with pytest.raises(EngineError, match="adapter 'nothing' is not loaded.*not run on the base model") as info:
            await client.generate([1, 2, 3], {"max_new_tokens": 2})
        assert info.value.status == 400
        with pytest.raises(EngineError, match="no adapter named 'nothing@v3'"):
            await client.unload_lora_adapter("nothing@v3")
        with pytest.raises(EngineError, match="not a PEFT adapter folder"):
            await client.load_lora_adapter("nothing@v1", "/nonexistent")


@pytest.mark.anyio
async def test_sync_sends_the_adapter_alone_and_a_running_request_keeps_its_version(
        tiny_model_dir, tiny_vocab, learner, engine, tmp_path):
    # the tiny model: hidden 128, 4 layers, 4 heads of 32 (k, v: 2 heads, 64), MLP 384, 875,392 parameters.
    # rank 4 on all seven projections, per layer (A: 4 x in, B: out x 4):
    # q 512+512, k 512+256, v 512+256, o 512+512, gate 512+1536, up 512+1536, down 1536+512 = 9,728
    adapter_bytes = 4 * 9728 * 4  # 4 layers, fp32
    full_bytes = 875_392 * 4
    assert learner.full_weight_bytes() == full_bytes
    transport = AdapterTransport(root=tmp_path / "adapters", lora=LORA, model_dir=tiny_model_dir, keep=1,
                                 full_bytes=learner.full_weight_bytes())
    transport.connect(None, [engine.url])
    start = tiny_vocab["im_start"]
    prompt = [start, 5, 6, 7, 8, 9]
    try:
        stats = transport.send(learner.adapter_tensors(), 1)
        assert stats["bytes"] == adapter_bytes == 155_648 and stats["tensors"] == 4 * 7 * 2
        assert stats["bytes_fraction"] == pytest.approx(155_648 / 3_501_568)  # 4.4 %
        weights_v1 = _plain(tiny_model_dir, dict(learner.named_full_tensors())).float()
        weights_v2 = _trained(learner, tiny_model_dir, seed=2)
        long = {"temperature": 1.0, "max_new_tokens": 300, "ignore_eos": True, "seed": 5}
        async with EngineClient(engine.url, lora="policy") as client:
            results = {}

            async def long_request():
                results["long"] = await client.generate(prompt, long)

            async with anyio.create_task_group() as tg:
                tg.start_soon(long_request)
                while (await client.server_info())["running"] < 1:
                    await anyio.sleep(0.01)
                # a sync while it runs: no pause, v1 stays loaded for it (keep=1: unloaded later)
                stats = await anyio.to_thread.run_sync(transport.send, learner.adapter_tensors(), 2)
                assert stats["adapters_loaded"] == 2 and transport.retiring == ["policy@v1"]
                assert (await client.server_info())["running"] == 1
                results["new"] = await client.generate(prompt, {**long, "max_new_tokens": 8})
            info = await client.model_info()
        # the running request finished on v1: every token, and the log-probs are v1's, not v2's
        old, new = results["long"], results["new"]
        assert old.finish_reason == "length" and old.versions == [1] * 300
        assert new.versions == [2] * 8
        for result, weights, other in ((old, weights_v1, weights_v2), (new, weights_v2, weights_v1)):
            lp = torch.tensor(result.logprobs)
            torch.testing.assert_close(lp, reference_logprobs(weights, prompt, result.output_ids, 1.0),
                                       rtol=0, atol=1e-4)
            assert (lp - reference_logprobs(other, prompt, result.output_ids, 1.0)).abs().max() > 1e-3
        assert info["lora_adapters"] == ["policy@v1", "policy@v2"]
        # the next sync unloads v1 (nothing runs with it now) and v2 (beyond keep=1)
        transport.send(learner.adapter_tensors(), 3)
        async with EngineClient(engine.url) as client:
            assert (await client.model_info())["lora_adapters"] == ["policy@v3"]
        assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == ["policy@v3"]
        # a new transport (a restarted learner, or an engine restart's reconnect) takes over what the engine
        # holds, and syncing the version it holds again keeps the engine's copy
        again = AdapterTransport(root=tmp_path / "adapters", lora=LORA, model_dir=tiny_model_dir, keep=1)
        again.connect(None, [engine.url])
        try:
            assert again.loaded == ["policy@v3"] and again.exact == []
            again.send(learner.adapter_tensors(), 3)
            assert again.loaded == ["policy@v3"]
        finally:
            again.close()
        async with EngineClient(engine.url) as client:
            assert (await client.model_info())["lora_adapters"] == ["policy@v3"]
    finally:
        transport.close()


@pytest.mark.anyio
async def test_the_learner_service_syncs_the_adapter_whatever_the_transport(tiny_model_dir, engine, world_of_one):
    """The pipeline's path: LearnerService.connect + sync with model.lora and the default collective transport."""
    import shutil

    from agentrl_core.config import config_from_dict
    from agentrl_core.train.learner_actor import LearnerService

    config = config_from_dict({"model": {"path": str(tiny_model_dir), "lora": {
        "enabled": True, "rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}},
        "rollout": {"staleness_bound": 2}, "train": {"device": "cpu"}}, validate_plugins=False)
    assert config.weight_sync.transport == "collective"
    service = LearnerService(0, str(tiny_model_dir), config, torch.device("cpu"))
    try:
        await anyio.to_thread.run_sync(lambda: service.connect({"current": [engine.url]}, address="127.0.0.1"))
        transport = service.transports["current"]
        assert transport.name == "adapter" and transport.keep == 3  # staleness bound 2 + 1
        metrics = await anyio.to_thread.run_sync(service.sync, ["current"], 7)
        # q (A 4x128, B 128x4) and v (A 4x128, B 64x4) in 4 layers, fp32 on CPU: 4 * (1024 + 768) * 4 bytes
        assert metrics["weight_sync/current/bytes"] == 28_672
        assert metrics["weight_sync/current/bytes_fraction"] == pytest.approx(28_672 / 3_501_568)
        async with EngineClient(engine.url, lora="policy") as client:
            assert "policy@v7" in (await client.model_info())["lora_adapters"]
            result = await client.generate([1, 2, 3], {"max_new_tokens": 3, "temperature": 1.0})
        assert result.versions == [7, 7, 7]
    finally:
        for transport in service.transports.values():
            transport.close()
        async with EngineClient(engine.url) as client:
            await client.unload_lora_adapter("policy@v7")
        shutil.rmtree(service._adapter_root, ignore_errors=True)


@pytest.mark.anyio
async def test_the_gateways_engine_calls_name_the_adapter_too(tiny_model_dir, engine):
    """The OpenAI gateway (openai agent loops) generates through its own lean client: it sends lora_path as well."""
    from agentrl_core.config import config_from_dict
    from agentrl_core.gateway.engines import LeanEngineClient
    from agentrl_core.gateway.process import build_gateway

    config = config_from_dict({"model": {"path": str(tiny_model_dir), "lora": {"enabled": True}}},
                              validate_plugins=False)
    gateway = build_gateway(config, {"current": [engine.url]})
    try:
        assert gateway.router.pools["current"].engines[engine.url].lora == "policy"
    finally:
        await gateway.router.aclose()
    client = LeanEngineClient(engine.url, lora="nothing")
    try:
        with pytest.raises(EngineError, match="adapter 'nothing' is not loaded"):
            await client.generate([1, 2, 3], {"max_new_tokens": 2})
    finally:
        await client.aclose()
