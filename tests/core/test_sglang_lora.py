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


@pytest.fixture
def world_of_one():
    import torch.distributed as dist

    from agentrl_core.train.learner import init_distributed

    created = not dist.is_initialized()
    init_distributed("cpu")
    yield
    if created:
        dist.destroy_process_group()


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
                    async with httpx.AsyncClient() as http:
                        while "/update_weight_version" not in (await http.get(url + "/double/requests")).json() or \
                                len((await http.get(url + "/double/requests")).json()["/update_weight_version"]) < 2:
                            await anyio.sleep(0.01)
                    await anyio.sleep(1.1)  # past the client's one-second cache of the server's version
                    second = await client.generate([1, 2, 3], {"max_new_tokens": 3})
                    long_done_first = "long" not in box and not synced.is_set()
                    assert long_done_first  # the unload of v1 still waits for the long request
            finally:
                transport.close()
            async with httpx.AsyncClient() as http:
                seen = (await http.get(url + "/double/requests")).json()
    assert synced.is_set()
    long = box["long"]
    assert long.finish_reason == "length" and long.versions == [1] * 2000  # it ran on v1 to its end
    assert second.versions == [2, 2, 2]
    # v0 twice (refused, asked again after reading the server's version: still refused), v0 once more (the
    # client's version, read under a second before, was still 0: refused, so it read v1), then v1, v1, v2
    assert [b["lora_path"] for b in seen["/generate"]] == ["policy@v0", "policy@v0", "policy@v0", "policy@v1",
                                                             "policy@v1", "policy@v2"]
    assert [b["new_version"] for b in seen["/update_weight_version"]] == ["1", "2"]
    assert all(b["abort_all_requests"] is False for b in seen["/update_weight_version"])
    assert [b["lora_name"] for b in seen["/unload_lora_adapter"]] == ["policy@v1"]  # beyond keep=1, once
