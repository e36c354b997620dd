"""SGLang's LoRA endpoints, driven by the sglang driver and the adapter sync, against the strict TEST DOUBLE.

SGLang takes exact adapter names only and its unload waits for the requests running with the
adapter (``tests/core/sglang_double.py`` imitates both). The learner loads ``policy@vN`` and
points the server's weight version at it; the client names ``policy@v<that version>`` and
tags every token with it.
"""

from __future__ import annotations

import sys
import threading

import anyio
import httpx
import pytest
from sglang_double import install_shim

from agentrl_core.config import EngineConfig, LoraConfig, ModelConfig, SGLangOptions
from agentrl_core.rollout.engine_client import EngineClient, EngineError
from agentrl_core.rollout.sglang_driver import SGLangDriver

pytestmark = pytest.mark.anyio
LORA = LoraConfig(enabled=True, rank=4, alpha=8.0, target_modules=["q_proj", "v_proj"])


@pytest.fixture
def anyio_backend():
    return "asyncio"


def test_model_lora_turns_on_sglangs_lora_with_room_for_the_versions_kept(tmp_path):
    config = EngineConfig(driver="sglang", device="cuda", sglang=SGLangOptions(max_loras=3))
    cmd = SGLangDriver(config, model=ModelConfig(lora=LORA), log_dir=str(tmp_path)).command("/m", 1, 1, "current-0", 0)
    flags = " ".join(cmd)
    assert ("--enable-lora --max-lora-rank 4 --lora-target-modules q_proj v_proj --max-loras-per-batch 3 "
            "--max-loaded-loras 4") in flags  # one more than a batch: the version being loaded
    everything = LoraConfig(enabled=True, target_modules=["all-linear"])
    cmd = SGLangDriver(config, model=ModelConfig(lora=everything), log_dir=str(tmp_path)).command("/m", 1, 1, "c", 0)
    assert cmd[cmd.index("--lora-target-modules") + 1] == "all"
    assert "--enable-lora" not in SGLangDriver(config, model=ModelConfig(), log_dir=str(tmp_path)).command(
        "/m", 1, 1, "c", 0)


@pytest.mark.processes
async def test_adapters_reach_sglang_by_exact_name_and_a_running_request_keeps_its_version(
        tmp_path, monkeypatch, tiny_model_dir, world_of_one):
    from agentrl_core.config import LossConfig, OptimConfig, TrainConfig
    from agentrl_core.train.adapter_sync import AdapterTransport
    from agentrl_core.train.learner import Learner

    shim = install_shim(tmp_path / "shim")
    monkeypatch.setenv("PYTHONPATH", str(shim))
    learner = Learner(tiny_model_dir, train=TrainConfig(device="cpu"), optim=OptimConfig(), loss=LossConfig(),
                      temperature=1.0, lora=LORA)
    config = EngineConfig(driver="sglang", device="cuda",
                          sglang=SGLangOptions(python=sys.executable, startup_timeout=60, max_loras=2))
    driver = SGLangDriver(config, model=ModelConfig(lora=LORA), log_dir=str(tmp_path / "logs"))
    with driver:
        [url] = await anyio.to_thread.run_sync(driver.launch, "current", str(tiny_model_dir), [[0]])
        async with EngineClient(url, lora="policy") as client:
            # before any sync the server holds no adapter: loud, and never the base model
            with pytest.raises(EngineError, match="requested LoRA adapters are not loaded: policy@v0"):
                await client.generate([1, 2, 3], {"max_new_tokens": 2})
            transport = AdapterTransport(root=tmp_path / "adapters", lora=LORA, model_dir=tiny_model_dir, keep=1,
                                         full_bytes=learner.full_weight_bytes())
            await anyio.to_thread.run_sync(transport.connect, None, [url])
            try:
                assert transport.exact == [url]
                await anyio.to_thread.run_sync(transport.send, learner.adapter_tensors(), 1)
                first = await client.generate([1, 2, 3], {"max_new_tokens": 3})
                assert first.versions == [1, 1, 1] and first.weight_version == 1
                box = {}

                async def long_request():
                    box["long"] = await client.generate([5], {"max_new_tokens": 2000})  # 10 s at 5 ms a token

                synced = threading.Event()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(long_request)
                    async with httpx.AsyncClient() as http:
                        while not (await http.get(url + "/double/state")).json().get("progress"):
                            await anyio.sleep(0.01)

                    def sync():
                        transport.send(learner.adapter_tensors(), 2)  # keep=1: unloads v1, which waits for it
                        synced.set()

                    tg.start_soon(anyio.to_thread.run_sync, sync)
                    with anyio.fail_after(30):
                        while not synced.is_set():
                            await anyio.sleep(0.01)
                    # the sync is done while the request on v1 runs: SGLang's unload of v1 waits for it, the sync not
                    assert "long" not in box
                    async with httpx.AsyncClient() as http:
                        assert (await http.get(url + "/double/state")).json()["loras"] == ["policy@v2"]
                    await anyio.sleep(1.1)  # past the client's one-second cache of the server's version
                    second = await client.generate([1, 2, 3], {"max_new_tokens": 3})
                assert (tmp_path / "adapters" / "policy@v1").is_dir()  # unloaded after the long request ended
                with anyio.fail_after(30):  # SGLang answers the unload of v1 now that its request is done
                    while not all(future.done() for _, future in transport._waiting):
                        await anyio.sleep(0.01)
                await anyio.to_thread.run_sync(transport.send, learner.adapter_tensors(), 3)
                assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == ["policy@v2", "policy@v3"]
                with pytest.raises(EngineError, match="not loaded: policy@v1"):  # an exact name is not re-resolved
                    await client.generate([1, 2, 3], {"max_new_tokens": 1}, lora="policy@v1")
                with anyio.fail_after(30):  # the unload of v2 (nothing runs with it) is answered at once
                    while not all(future.done() for _, future in transport._waiting):
                        await anyio.sleep(0.01)
            finally:
                transport.close()
            async with httpx.AsyncClient() as http:
                seen = (await http.get(url + "/double/requests")).json()
    assert synced.is_set()
    long = box["long"]
    assert long.finish_reason == "length" and long.versions == [1] * 2000  # it ran on v1 to its end
    assert second.versions == [2, 2, 2]
    # v0 twice (refused, asked again after reading the server's version: still refused), v0 once more (the
    # client's version, read under a second before, was still 0: refused, so it read v1), then v1, v1, v2,
    # and the exact policy@v1 at the end, refused without another try
    assert [b["lora_path"] for b in seen["/generate"]] == ["policy@v0", "policy@v0", "policy@v0", "policy@v1",
                                                             "policy@v1", "policy@v2", "policy@v1"]
    assert [b["new_version"] for b in seen["/update_weight_version"]] == ["1", "2", "3"]
    assert all(b["abort_all_requests"] is False for b in seen["/update_weight_version"])
    assert [b["lora_name"] for b in seen["/unload_lora_adapter"]] == ["policy@v1", "policy@v2"]  # beyond keep=1


@pytest.mark.processes
async def test_a_colocated_lora_pool_keeps_its_weights_and_is_continued_after_the_adapter_sync(
        tmp_path, monkeypatch, tiny_model_dir, world_of_one):
    """engine.release_memory with model.lora: only the KV cache goes (no full-weight update would refill
    SGLang's released weights), and the pool, paused for the learner step, is continued after the adapter
    sync, which itself never pauses."""
    from agentrl_core.config import LossConfig, OptimConfig, TrainConfig
    from agentrl_core.rollout.engine_client import EnginePool
    from agentrl_core.train.adapter_sync import AdapterTransport
    from agentrl_core.train.engine_memory import EngineMemory
    from agentrl_core.train.learner import Learner

    shim = install_shim(tmp_path / "shim")
    monkeypatch.setenv("PYTHONPATH", str(shim))
    monkeypatch.setenv("SGLANG_DOUBLE_STARTUP_S", "0")
    learner = Learner(tiny_model_dir, train=TrainConfig(device="cpu"), optim=OptimConfig(), loss=LossConfig(),
                      temperature=1.0, lora=LORA)
    config = EngineConfig(driver="sglang", device="cuda", sglang=SGLangOptions(python=sys.executable,
                                                                              startup_timeout=60))
    driver = SGLangDriver(config, model=ModelConfig(lora=LORA), log_dir=str(tmp_path / "logs"))
    driver.release_memory = True
    with driver:
        [url] = await anyio.to_thread.run_sync(driver.launch, "current", str(tiny_model_dir), [[0]])
        transport = AdapterTransport(root=tmp_path / "adapters", lora=LORA, model_dir=tiny_model_dir)
        await anyio.to_thread.run_sync(transport.connect, None, [url])
        answers = {}
        try:
            await anyio.to_thread.run_sync(transport.send, learner.adapter_tensors(), 0)
            async with EnginePool("current", [url], lora="policy") as pool, \
                    httpx.AsyncClient(base_url=url, timeout=30) as http:
                memory = EngineMemory({"current": pool}, adapters=True)

                async def generate(key, n):
                    answers[key] = await pool.generate(key, [1, 2, 3], {"max_new_tokens": n})

                async with anyio.create_task_group() as tg:
                    await memory.release(["current"])  # the step is due a sync: still only the KV cache
                    state = (await http.get("/double/state")).json()
                    assert state["paused"] and state["released"] == ["kv_cache"]
                    tg.start_soon(generate, "held", 4)  # held while paused
                    await wait_until_generate(http, 1)
                    await memory.resume()
                    await anyio.to_thread.run_sync(transport.send, learner.adapter_tensors(), 1)
                    assert "held" not in answers  # the adapter sync did not continue the pool
                    await memory.continue_unsynced(["current"])
                state = (await http.get("/double/state")).json()
                order = [r for r in state["order"] if "memory" in r or "generation" in r]
        finally:
            transport.close()
    assert state["stale_weights"] == 0 and state["offload_tags"] == []
    assert order == ["/pause_generation", "/release_memory_occupation", "/resume_memory_occupation",
                     "/continue_generation"]
    # it asked for policy@v0 (the server's version then) while paused, and ran with it once continued
    assert answers["held"].output_ids == [6, 7, 8, 9] and answers["held"].versions == [0] * 4


async def wait_until_generate(http, n):
    with anyio.fail_after(30):
        while len((await http.get("/double/requests")).json().get("/generate", [])) < n:
            await anyio.sleep(0.01)


def test_too_few_sglang_adapter_slots_for_the_staleness_bound_are_refused_at_start():
    from agentrl_core.config import config_from_dict
    from agentrl_core.errors import ConfigError
    from agentrl_core.jobs.training import Trainer

    def config(max_loras, bound):
        return config_from_dict({"model": {"path": "/m", "lora": {"enabled": True}}, "tasks": [{"env": "calc"}],
                                 "engine": {"driver": "sglang", "sglang": {"max_loras": max_loras}},
                                 "rollout": {"staleness_bound": bound}}, validate_plugins=False)

    # bound 4: the learner keeps 5 versions loaded; SGLang loads a sixth only below --max-loaded-loras = 4 + 1
    with pytest.raises(ConfigError, match="engine.sglang.max_loras=4 is too small for model.lora: the learner keeps 5 "
                                          ".* set engine.sglang.max_loras to 5 or more"):
        Trainer(config(4, 4))
    Trainer(config(5, 4))  # enough


@pytest.mark.processes
async def test_the_gateways_client_names_sglang_adapters_exactly_too(tmp_path, monkeypatch, tiny_model_dir):
    from agentrl_core.gateway.engines import LeanEngineClient

    shim = install_shim(tmp_path / "shim")
    monkeypatch.setenv("PYTHONPATH", str(shim))
    monkeypatch.setenv("SGLANG_DOUBLE_STARTUP_S", "0")
    config = EngineConfig(driver="sglang", device="cuda", sglang=SGLangOptions(python=sys.executable,
                                                                              startup_timeout=60))
    for version in (5, 6):  # the double reads the adapter's config only
        (tmp_path / f"policy@v{version}").mkdir()
        (tmp_path / f"policy@v{version}" / "adapter_config.json").write_text('{"r": 4, "lora_alpha": 8}')
    with SGLangDriver(config, model=ModelConfig(lora=LORA), log_dir=str(tmp_path / "logs")) as driver:
        [url] = await anyio.to_thread.run_sync(driver.launch, "current", str(tiny_model_dir), [[0]])
        client = LeanEngineClient(url, lora="policy")
        try:
            async with EngineClient(url) as admin:
                await admin.load_lora_adapter("policy@v5", str(tmp_path / "policy@v5"))
                await admin.update_weight_version(5)
                first = await client.generate([1, 2, 3], {"max_new_tokens": 2})
                # the next version while the client still trusts what it read (pinned here, so that a slow machine
                # does not outlast its second): it names v5, is refused, reads v6 and asks again
                client._lora_checked = float("inf")
                await admin.load_lora_adapter("policy@v6", str(tmp_path / "policy@v6"))
                await admin.update_weight_version(6)
                await admin.unload_lora_adapter("policy@v5")
                second = await client.generate([1, 2, 3], {"max_new_tokens": 2})
                seen = [b.get("lora_path") for b in (await admin.http.get(url + "/double/requests")).json()["/generate"]]
        finally:
            await client.aclose()
    assert first.versions == [5, 5] and second.versions == [6, 6] and second.weight_version == 6
    assert seen == ["policy@v5", "policy@v5", "policy@v6"]
