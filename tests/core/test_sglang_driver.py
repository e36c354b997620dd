"""The sglang driver: its command line, and its HTTP use against a labelled SGLang TEST DOUBLE.

SGLang cannot run here (no GPU, not installable); ``sglang_double.py`` imitates its
documented API. What these tests show is our side: the launch command uses SGLang 0.5.x
argument names, processes are started/waited for/stopped, and the common client handles
SGLang's answers (string weight versions, abort finish reasons, ``{success, message}``).
"""

from __future__ import annotations

import sys

import anyio
import httpx
import pytest
from sglang_double import install_shim

from agentrl_core.config import EngineConfig, SGLangOptions
from agentrl_core.registry import Registry
from agentrl_core.rollout.engine_client import EngineClient, EngineError, EnginePool
from agentrl_core.rollout.hf_driver import EngineLaunchError
from agentrl_core.rollout.sglang_driver import SGLangDriver

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def wait_until(condition):
    with anyio.fail_after(30):
        while not condition():
            await anyio.sleep(0.01)


async def received(urls, route):
    async with httpx.AsyncClient() as http:
        return [len((await http.get(u + "/double/requests")).json().get(route, [])) for u in urls]


async def wait_until_received(urls, route, counts):
    """Until each double has recorded ``counts[i]`` requests on ``route`` (they are in flight there)."""
    with anyio.fail_after(30):
        while any(n < c for n, c in zip(await received(urls, route), counts, strict=True)):
            await anyio.sleep(0.01)


def sglang_config(**options):
    return EngineConfig(driver="sglang", device="cuda", sglang=SGLangOptions(**options))


def test_command_uses_sglang_05_argument_names():
    driver = SGLangDriver(sglang_config(tp_size=2, mem_fraction_static=0.8, extra_args=["--log-level", "warning"]),
                          dtype="bfloat16", context_length=8192, tool_call_parser="qwen25", seed=7)
    assert driver.command("/models/qwen", 31000, 2, "current-1", 1) == [
        "python", "-m", "sglang.launch_server", "--model-path", "/models/qwen", "--host", "127.0.0.1",
        "--port", "31000", "--tp-size", "2", "--weight-version", "0", "--served-model-name", "current-1",
        "--random-seed", "8", "--skip-server-warmup", "--dtype", "bfloat16", "--mem-fraction-static", "0.8",
        "--context-length", "8192", "--tool-call-parser", "qwen25", "--log-level", "warning",
    ]
    assert driver.gpu_groups([[0, 1], [2, 3]]) == [[0, 1], [2, 3]]
    with pytest.raises(EngineLaunchError, match="needs 2 GPUs"):
        driver.gpu_groups([[0]])


def test_registry_builds_both_drivers():
    registry = Registry()
    assert type(registry.build("rollout_engine", "sglang", None, engine=sglang_config())).__name__ == "SGLangDriver"
    assert type(registry.build("rollout_engine", "hf", None)).__name__ == "HFDriver"


@pytest.mark.processes
async def test_driver_launches_waits_and_the_common_client_speaks_sglang(tmp_path, monkeypatch):
    shim = install_shim(tmp_path / "shim")
    monkeypatch.setenv("PYTHONPATH", str(shim))
    monkeypatch.setenv("SGLANG_DOUBLE_STARTUP_S", "1.0")  # /health answers 503 first
    driver = SGLangDriver(sglang_config(python=sys.executable, startup_timeout=60), log_dir=str(tmp_path / "logs"))
    with driver:
        urls = await anyio.to_thread.run_sync(driver.launch, "current", "/models/fake", [[0], [1]])
        assert len(urls) == 2
        async with EnginePool("current", urls) as pool:
            result = await pool.generate("traj", [1, 2, 3], {"max_new_tokens": 4, "temperature": 0.8, "seed": 3})
            assert result.output_ids == [6, 7, 8, 9] and result.logprobs == [-0.5] * 4
            assert result.weight_version == 0 and result.finish_reason == "length"  # "0" from SGLang -> 0
            async with httpx.AsyncClient() as http:
                seen = (await http.get(result.engine + "/double/requests")).json()["/generate"][-1]
            assert seen["sampling_params"]["sampling_seed"] == 3 and "seed" not in seen["sampling_params"]

            # pause (abort) while a long request runs on each engine; it comes back aborted
            async def long(key, box):
                box.append(await pool.generate(key, [5], {"max_new_tokens": 2000}))

            before = await received(urls, "/generate")
            boxes = {"k0": [], "k1": []}
            async with anyio.create_task_group() as tg:
                for key, box in boxes.items():
                    tg.start_soon(long, key, box)
                await wait_until(lambda: all(pool.in_flight[u] == 1 for u in urls))  # least loaded: one each
                await wait_until_received(urls, "/generate", [n + 1 for n in before])
                await pool.pause_generation()
                joined = await driver.init_weight_update_group(
                    "current", master_address="10.0.0.1", master_port=29500, group_name="wsync", backend="nccl")
                await pool.update_weights_from_distributed(names=["w"], dtypes=["bfloat16"], shapes=[[2, 2]],
                                                           group_name="wsync", weight_version=1)
                await pool.continue_generation()
            assert all(b[0].finish_reason == "abort" and len(b[0].output_ids) < 2000 for b in boxes.values())
            assert {b[0].engine for b in boxes.values()} == set(urls)
            assert all(r["success"] for r in joined.values())
            after = await pool.generate("traj", [1], {"max_new_tokens": 1})
            assert after.weight_version == 1
            async with httpx.AsyncClient() as http:
                for rank, url in enumerate(urls, start=1):
                    seen = (await http.get(url + "/double/requests")).json()
                    assert seen["/init_weights_update_group"] == [{
                        "master_address": "10.0.0.1", "master_port": 29500, "rank_offset": rank, "world_size": 3,
                        "group_name": "wsync", "backend": "nccl"}]
                    assert seen["/update_weights_from_distributed"][0]["weight_version"] == "1"
            with pytest.raises(EngineError, match="differ in length"):
                await EngineClient(urls[0]).update_weights_from_distributed(
                    names=["a", "b"], dtypes=["float32"], shapes=[[1]], group_name="wsync")
        processes = [p for _, p, _ in driver.procs.processes]
    assert all(p.poll() is not None for p in processes)  # shutdown stopped them


@pytest.mark.processes
def test_a_server_that_dies_during_startup_is_reported_with_its_log(tmp_path, monkeypatch):
    shim = install_shim(tmp_path / "shim")
    monkeypatch.setenv("PYTHONPATH", str(shim))
    driver = SGLangDriver(sglang_config(python=sys.executable, extra_args=["--no-such-flag"], startup_timeout=60),
                          log_dir=str(tmp_path / "logs"))
    with driver, pytest.raises(EngineLaunchError, match="(?s)exited with code 2.*no-such-flag"):
        driver.launch("current", "/models/fake", [[0]])


def test_hf_driver_maps_placements_to_engine_command_lines(tmp_path):
    from agentrl_core.config import HFEngineOptions
    from agentrl_core.rollout.hf_driver import HFDriver, engine_slots

    assert engine_slots([[0, 1], [2]], "cpu") == [{"device": "cpu", "cpus": [0, 1]}, {"device": "cpu", "cpus": [2]}]
    assert engine_slots([[3]], "cuda") == [{"device": "cuda", "gpus": [3]}]
    assert engine_slots(["cuda:1", "cpu", 2], "cpu") == [
        {"device": "cuda", "gpus": [1]}, {"device": "cpu", "cpus": []}, {"device": "cpu", "cpus": [2]}]
    driver = HFDriver(engine=EngineConfig(hf=HFEngineOptions(max_running_requests=8, threads=3, dtype="bfloat16")),
                      python="py", max_context=4096)
    cmd, env = driver.command("/m", {"device": "cpu", "cpus": [0, 1]}, tmp_path / "p.json", "current-0")
    assert cmd == ["py", "-m", "agentrl_core.cli.main", "engine", "serve", "--model", "/m", "--host", "127.0.0.1",
                   "--port", "0", "--port-file", str(tmp_path / "p.json"), "--max-running-requests", "8",
                   "--dtype", "bfloat16", "--served-model-name", "current-0", "--device", "cpu", "--cpus", "0,1",
                   "--threads", "3", "--max-context", "4096"] and env == {}
    cmd, env = driver.command("/m", {"device": "cuda", "gpus": [2]}, tmp_path / "p.json", "stale-0")
    assert env == {"CUDA_VISIBLE_DEVICES": "2"} and cmd[-4:] == ["--device", "cuda", "--max-context", "4096"]
