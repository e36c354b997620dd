"""The sglang driver: its command line, and its HTTP use against a labelled SGLang TEST DOUBLE.

SGLang cannot run here (no GPU, not installable); ``sglang_double.py`` imitates its
documented API. What these tests show is our side: the launch command uses SGLang 0.5.x
argument names, processes are started/waited for/stopped, and the common client handles
SGLang's answers (string weight versions, abort finish reasons, ``{success, message}``).
"""

from __future__ import annotations

import sys

import anyio
import attrs
import httpx
import pytest
import torch
from sglang_double import install_shim

from agentrl_core.config import EngineConfig, ModelConfig, SGLangOptions
from agentrl_core.registry import Registry
from agentrl_core.rollout.drivers import EngineLaunchError
from agentrl_core.rollout.engine_client import EngineClient, EngineError, EnginePool, pause_mode_for
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


def wait_for(condition, timeout=30.0):
    """Until ``condition()`` (a state the engines reach by themselves), with a deadline."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition was not reached in time"
        time.sleep(0.05)


def sglang_config(**options):
    return EngineConfig(driver="sglang", device="cuda", sglang=SGLangOptions(**options))


def test_command_uses_sglang_05_argument_names(tmp_path):
    model = tmp_path / "qwen"
    model.mkdir()
    (model / "config.json").write_text('{"max_position_embeddings": 4096}')
    driver = SGLangDriver(sglang_config(tp_size=2, mem_fraction_static=0.8, extra_args=["--log-level", "warning"]),
                          model=ModelConfig(path=str(model), dtype="bfloat16", tool_parser="qwen25",
                                            chat_template="{{ messages }}", trust_remote_code=True),
                          max_context=8192, seed=7, log_dir=str(tmp_path / "logs"))
    assert driver.command(str(model), 31000, 2, "current-1", 1) == [
        "python", "-m", "sglang.launch_server", "--model-path", str(model), "--host", "127.0.0.1",
        "--port", "31000", "--tp-size", "2", "--weight-version", "0", "--served-model-name", "current-1",
        "--random-seed", "8", "--skip-server-warmup", "--dtype", "bfloat16", "--mem-fraction-static", "0.8",
        # rollout.max_total_len 8192, capped at the model's 4096 positions (SGLang refuses more)
        "--context-length", "4096", "--tool-call-parser", "qwen25",
        "--chat-template", str(tmp_path / "logs" / "chat_template.jinja"), "--trust-remote-code",
        "--log-level", "warning",
    ]
    assert (tmp_path / "logs" / "chat_template.jinja").read_text() == "{{ messages }}"
    assert driver.gpu_groups([[0, 1], [2, 3]]) == [[0, 1], [2, 3]]
    assert driver.ranks_per_engine == 2
    with pytest.raises(EngineLaunchError, match="needs 2 GPUs"):
        driver.gpu_groups([[0]])


def test_the_server_never_reports_log_probs_before_temperature(monkeypatch):
    # SGLANG_RETURN_ORIGINAL_LOGPROB=1 in the user's shell would make SGLang return
    # log_softmax(logits) while the learner computes log_softmax(logits / temperature)
    monkeypatch.setenv("SGLANG_RETURN_ORIGINAL_LOGPROB", "1")
    env = SGLangDriver(sglang_config()).environment([3])
    assert env == {"CUDA_VISIBLE_DEVICES": "3", "SGLANG_RETURN_ORIGINAL_LOGPROB": "false"}


def test_registry_builds_both_drivers():
    registry = Registry()
    assert type(registry.build("rollout_engine", "sglang", None, engine=sglang_config())).__name__ == "SGLangDriver"
    assert type(registry.build("rollout_engine", "hf", None)).__name__ == "HFDriver"


def test_the_runs_options_reach_both_drivers(tmp_path):
    # model.dtype, model.tool_parser, rollout.max_total_len and run.seed were validated but never used
    from agentrl_core.config import config_from_dict
    from agentrl_core.rollout.drivers import build_engine_driver

    config = config_from_dict({"model": {"path": "/m", "dtype": "float16", "tool_parser": "hermes"},
                               "rollout": {"max_total_len": 2048}, "run": {"seed": 5},
                               "engine": {"driver": "sglang", "sglang": {"tp_size": 2}}}, validate_plugins=False)
    sglang = build_engine_driver(config, log_dir=str(tmp_path), host="10.1.2.3")
    cmd = sglang.command("/m", 1, 2, "current-0", 1)
    assert cmd[cmd.index("--dtype") + 1] == "float16" and cmd[cmd.index("--context-length") + 1] == "2048"
    assert cmd[cmd.index("--tool-call-parser") + 1] == "qwen25" and cmd[cmd.index("--random-seed") + 1] == "6"
    assert cmd[cmd.index("--host") + 1] == "10.1.2.3" and sglang.ranks_per_engine == 2
    hf = build_engine_driver(attrs.evolve(config, engine=EngineConfig()), log_dir=str(tmp_path))
    cmd, _ = hf.command("/m", {"device": "cpu", "cpus": []}, tmp_path / "p.json", "current-1", 1)
    assert cmd[cmd.index("--seed") + 1] == "6" and hf.max_context == 2048


@pytest.mark.processes
async def test_driver_launches_waits_and_the_common_client_speaks_sglang(tmp_path, monkeypatch, tiny_model_dir):
    shim = install_shim(tmp_path / "shim")
    monkeypatch.setenv("PYTHONPATH", str(shim))
    monkeypatch.setenv("SGLANG_DOUBLE_STARTUP_S", "1.0")  # /health answers 503 first
    monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", "1")  # SGLang's is 20 s
    monkeypatch.setenv("SGLANG_RETURN_ORIGINAL_LOGPROB", "1")  # the driver pins it off for the server
    driver = SGLangDriver(sglang_config(python=sys.executable, startup_timeout=60), log_dir=str(tmp_path / "logs"))
    with driver:
        urls = await anyio.to_thread.run_sync(driver.launch, "current", str(tiny_model_dir), [[0], [1]])
        assert len(urls) == 2
        async with EnginePool("current", urls) as pool:
            result = await pool.generate("traj", [1, 2, 3], {"max_new_tokens": 4, "temperature": 0.8, "seed": 3})
            assert result.output_ids == [6, 7, 8, 9]
            assert result.logprobs == [-0.5] * 4  # after temperature (before it: -0.4)
            assert result.weight_version == 0 and result.finish_reason == "length"  # "0" from SGLang -> 0
            async with httpx.AsyncClient() as http:
                seen = (await http.get(result.engine + "/double/requests")).json()["/generate"][-1]
            assert seen["sampling_params"]["sampling_seed"] == 3 and "seed" not in seen["sampling_params"]

            # pause (abort) while a long request decodes on one engine and a long prompt still waits for
            # its prefill on the other: the first comes back with its tokens, the second with none at all
            async def run(key, ids, box):
                box.append(await pool.generate(key, ids, {"max_new_tokens": 2000}))

            before = await received(urls, "/generate")
            boxes = {"decoding": [], "queued": []}
            async with anyio.create_task_group() as tg:
                tg.start_soon(run, "decoding", [5], boxes["decoding"])
                await wait_until(lambda: sum(pool.in_flight.values()) == 1)
                tg.start_soon(run, "queued", [5] * 40000, boxes["queued"])  # 20 s of "prefill"
                await wait_until(lambda: all(n == 1 for n in pool.in_flight.values()))  # least loaded: one each
                await wait_until_received(urls, "/generate", [n + 1 for n in before])
                await pool.pause_generation()
            decoding, queued = boxes["decoding"][0], boxes["queued"][0]
            assert decoding.finish_reason == "abort" and 0 < len(decoding.output_ids) < 2000
            assert queued.finish_reason == "abort" and queued.output_ids == [] and queued.logprobs == []
            assert queued.message == "Abort before prefill"

            # SGLang's /health generates: while paused it waits, then answers 503; the server is alive
            client = pool.engines[urls[0]]
            assert await client.health(timeout=10) is False and await client.alive() is True
            with pytest.raises(EngineError, match="Please call `init_weights_update_group` first"):
                await pool.update_weights_from_distributed(names=["w"], dtypes=["bfloat16"], shapes=[[2, 2]],
                                                           group_name="never-made", weight_version=1)
            with pytest.raises(EngineError, match=r"do not fit a world of 2"):  # rank 2 of a world of 2
                await client.init_weights_update_group(master_address="127.0.0.1", master_port=1, rank_offset=2,
                                                       world_size=2, group_name="g", backend="gloo")
            with pytest.raises(EngineError, match="does not exist"):
                await client.destroy_weights_update_group("never-made")
            await pool.continue_generation()
            assert await client.health() is True
            info = await client.server_info()
            assert info["tp_size"] == 1 and info["internal_states"] and "version" in info
            async with httpx.AsyncClient() as http:
                state = (await http.get(urls[0] + "/double/state")).json()
            assert state["env"] == {"CUDA_VISIBLE_DEVICES": "0", "SGLANG_RETURN_ORIGINAL_LOGPROB": "false"}
        processes = [p for _, p, _ in driver.procs.processes]
    assert all(p.poll() is not None for p in processes)  # shutdown stopped them


def _bf16_sums(model_dir):
    from safetensors.torch import load_file

    return {n: float(t.to(torch.bfloat16).double().sum()) for n, t in load_file(str(model_dir / "model.safetensors")).items()}


@pytest.mark.processes
def test_tensor_parallel_engines_join_the_weight_group_with_every_rank(tmp_path, monkeypatch, tiny_model_dir):
    from safetensors.torch import load_file

    from agentrl_core.train.weight_sync import CollectiveTransport, WeightSyncError

    shim = install_shim(tmp_path / "shim")
    monkeypatch.setenv("PYTHONPATH", str(shim))
    monkeypatch.setenv("SGLANG_DOUBLE_STARTUP_S", "0")
    monkeypatch.setenv("SGLANG_DOUBLE_GROUP_TIMEOUT_S", "20")
    driver = SGLangDriver(sglang_config(python=sys.executable, tp_size=2, startup_timeout=60),
                          log_dir=str(tmp_path / "logs"))
    weights = list(load_file(str(tiny_model_dir / "model.safetensors")).items())
    with driver:
        urls = driver.launch("current", str(tiny_model_dir), [[0, 1], [2, 3]])
        # one rank per engine (what ray_pools did): the second TP rank of an engine has no place
        wrong = CollectiveTransport(None, backend="gloo", timeout_s=20)
        with pytest.raises(WeightSyncError, match=r"ranks \[2, 3\] .* do not fit a world of 3"):
            wrong.connect("127.0.0.1", urls)
        transport = CollectiveTransport(None, backend="gloo", bucket_mb=0.5, dtype="bfloat16", timeout_s=60,
                                        ranks_per_engine=driver.ranks_per_engine)
        transport.connect("127.0.0.1", urls)
        try:
            stats = transport.send(iter(weights), version=5)
            # one deadline for a whole sync: every bucket now takes 0.4 s to load, each call is "fast"
            for url in urls:
                httpx.post(url + "/double/config", json={"load_s": 0.4}, timeout=30).raise_for_status()
            transport.timeout_s = 1.5
            with pytest.raises(WeightSyncError, match=r"did not finish within 1.5 s \(weight_sync.timeout_s\)"):
                transport.send(iter(weights), version=6)  # 5 buckets x 0.4 s > 1.5 s
            assert all(httpx.get(u + "/double/state", timeout=30).json()["paused"] for u in urls)  # no mixed weights
            for url in urls:
                httpx.post(url + "/double/config", json={"load_s": 0}, timeout=30).raise_for_status()
            wait_for(lambda: not any(httpx.get(u + "/double/state", timeout=30).json()["updating"] for u in urls))
            transport.timeout_s = 60
            stats = transport.send(iter(weights), version=7)  # a complete sync continues the pool
        finally:
            transport.close()
        assert stats["tensors"] == len(weights) and stats["buckets"] > 1
        expected = _bf16_sums(tiny_model_dir)
        for i, url in enumerate(urls):
            state = httpx.get(url + "/double/state", timeout=30).json()
            assert state["weight_version"] == "7" and not state["paused"]
            assert state["groups"] == {}  # the failed connect's half-formed group was left, close() left the other
            received = state["tensors"]
            assert set(received) == set(expected)
            assert all(t["dtype"] == "bfloat16" for t in received.values())  # weight_sync.dtype
            assert all(received[n]["sum"] == pytest.approx(v, rel=1e-6, abs=1e-6) for n, v in expected.items())
            joined = httpx.get(url + "/double/requests", timeout=30).json()["/init_weights_update_group"][-1]
            assert joined["rank_offset"] == 1 + 2 * i and joined["world_size"] == 5


@pytest.mark.processes
def test_disk_sync_pauses_loads_and_continues(tmp_path, monkeypatch, tiny_model_dir):
    # unpaused, SGLang's /update_weights_from_disk waits for every running request to finish;
    # the transport pauses (aborting them: the agent loop continues their turns) so a sync takes bounded time.
    # With the run's token: SGLang gets it as --api-key and the transport's client sends it.
    from safetensors import safe_open
    from safetensors.torch import load_file

    from agentrl_core.train.weight_sync import DiskTransport

    shim = install_shim(tmp_path / "shim")
    monkeypatch.setenv("PYTHONPATH", str(shim))
    monkeypatch.setenv("AGENTRL_TOKEN", "disk-sync-token")
    monkeypatch.setenv("SGLANG_DOUBLE_STARTUP_S", "0")
    driver = SGLangDriver(sglang_config(python=sys.executable, startup_timeout=60), log_dir=str(tmp_path / "logs"))
    weights = list(load_file(str(tiny_model_dir / "model.safetensors")).items())
    with driver:
        urls = driver.launch("current", str(tiny_model_dir), [[0]])
        assert httpx.post(urls[0] + "/pause_generation", json={}, timeout=30).status_code == 401
        transport = DiskTransport(None, disk_path=str(tmp_path / "shared"), model_dir=str(tiny_model_dir),
                                  dtype="bfloat16", timeout_s=60)
        transport.connect(None, urls)
        try:
            transport.send(iter(weights), version=3)
        finally:
            transport.close()
        state = httpx.get(urls[0] + "/double/state", timeout=30).json()
    assert state["order"] == ["/pause_generation", "/update_weights_from_disk", "/continue_generation"]
    assert state["weight_version"] == "3" and not state["paused"]
    with safe_open(str(tmp_path / "shared" / "weights_v3" / "model.safetensors"), "pt") as f:
        names = f.keys()
        assert {f.get_slice(k).get_dtype() for k in names} == {"BF16"}


async def wait_for_tokens(url, count, rid=None):
    """Until a request running on the double (``rid``, or any) has generated ``count`` tokens."""
    async with httpx.AsyncClient() as http:
        with anyio.fail_after(30):
            while True:
                progress = (await http.get(url + "/double/state")).json()["progress"]
                if any(n >= count for r, n in progress.items() if rid in (None, r)):
                    return
                await anyio.sleep(0.01)


@pytest.mark.processes
async def test_partial_rollouts_on_sglang_continue_a_cut_turn_from_its_tokens(tmp_path, monkeypatch, tiny_model_dir):
    """SGLang reports one weight version per answer, so its pools pause with abort even with partial
    rollouts on; the turn cut by the sync is continued from its tokens: none discarded, each token
    tagged with the version that sampled it. With partial rollouts off the cut tokens are thrown away."""
    from safetensors.torch import load_file

    from agentrl_core.rollout.agent_loop import generate_turn
    from agentrl_core.train.weight_sync import DiskTransport

    shim = install_shim(tmp_path / "shim")
    monkeypatch.setenv("PYTHONPATH", str(shim))
    monkeypatch.setenv("SGLANG_DOUBLE_STARTUP_S", "0")
    driver = SGLangDriver(sglang_config(python=sys.executable, startup_timeout=60), log_dir=str(tmp_path / "logs"))
    weights = list(load_file(str(tiny_model_dir / "model.safetensors")).items())
    prompt, n = [1, 2, 3], 1000  # 5 ms per token: 5 s, cut by the sync after 20 tokens
    with driver:
        [url] = await anyio.to_thread.run_sync(driver.launch, "current", str(tiny_model_dir), [[0]])
        transport = DiskTransport(None, disk_path=str(tmp_path / "shared"), model_dir=str(tiny_model_dir),
                                  timeout_s=60, partial_rollouts=True)
        await anyio.to_thread.run_sync(transport.connect, None, [url])
        assert transport.pause_mode == "abort"  # /get_model_info lists no pause_modes
        turns = {}
        try:
            async with EnginePool("current", [url]) as pool:
                for partial, version in ((True, 1), (False, 2)):
                    async with anyio.create_task_group() as tg:
                        async def turn(partial=partial):
                            turns[partial] = await generate_turn(pool, f"t{partial}", prompt, {"max_new_tokens": n},
                                                                 partial_rollouts=partial)

                        tg.start_soon(turn)
                        await wait_for_tokens(url, 20)
                        await anyio.to_thread.run_sync(lambda v=version: transport.send(iter(weights), version=v))
        finally:
            transport.close()
    kept = turns[True]
    k = kept.versions.count(0)
    assert 20 <= k < n and kept.versions == [0] * k + [1] * (n - k) and len(kept.ids) == n
    assert kept.ids[:k] == [(6 + i) % 1000 for i in range(k)]  # the cut answer's tokens, as they were
    assert kept.ids[k:] == [(sum(prompt) + sum(kept.ids[:k]) + i) % 1000 for i in range(n - k)]  # given them
    assert kept.aborted == 1 and kept.discarded_tokens == 0 and kept.interrupted and kept.mixed
    assert kept.finish_reason == "length" and len(kept.logprobs) == n
    regenerated = turns[False]
    assert regenerated.versions == [2] * n and regenerated.ids == [(6 + i) % 1000 for i in range(n)]
    assert regenerated.aborted == 1 and 20 <= regenerated.discarded_tokens < n and not regenerated.interrupted


@pytest.mark.processes
async def test_sglang_retract_keeps_tokens_but_reports_one_version_per_answer(tmp_path, monkeypatch, tiny_model_dir):
    """Why agentrl does not retract SGLang engines: the answer cannot say which tokens came before the update."""
    shim = install_shim(tmp_path / "shim")
    monkeypatch.setenv("PYTHONPATH", str(shim))
    monkeypatch.setenv("SGLANG_DOUBLE_STARTUP_S", "0")
    driver = SGLangDriver(sglang_config(python=sys.executable, startup_timeout=60), log_dir=str(tmp_path / "logs"))
    with driver:
        [url] = await anyio.to_thread.run_sync(driver.launch, "current", str(tiny_model_dir), [[0]])
        async with EngineClient(url) as client:
            with pytest.raises(EngineError, match="mode must be one of"):
                await client.pause_generation("freeze")
            async with anyio.create_task_group() as tg:
                box = {}

                async def long():
                    box["r"] = await client.generate([1, 2, 3], {"max_new_tokens": 300}, rid="long")

                tg.start_soon(long)
                await wait_for_tokens(url, 10, "long")
                await client.pause_generation("retract")
                await client.update_weights_from_disk(str(tiny_model_dir), weight_version=7)
                await client.continue_generation()
            info = await client.model_info()
    result = box["r"]
    assert result.finish_reason == "length" and result.output_ids == [(6 + i) % 1000 for i in range(300)]
    assert result.versions == [7] * 300  # the tokens sampled before the update are labelled 7 as well
    assert pause_mode_for([info], partial_rollouts=True) == "abort"


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
    from agentrl_core.rollout.drivers import engine_slots
    from agentrl_core.rollout.hf_driver import HFDriver

    assert engine_slots([[0, 1], [2]], "cpu") == [{"device": "cpu", "cpus": [0, 1]}, {"device": "cpu", "cpus": [2]}]
    assert engine_slots([[3]], "cuda") == [{"device": "cuda", "gpus": [3]}]
    assert engine_slots(["cuda:1", "cpu", 2], "cpu") == [
        {"device": "cuda", "gpus": [1]}, {"device": "cpu", "cpus": []}, {"device": "cpu", "cpus": [2]}]
    driver = HFDriver(engine=EngineConfig(hf=HFEngineOptions(max_running_requests=8, threads=3, dtype="bfloat16")),
                      python="py", max_context=4096)
    assert driver.ranks_per_engine == 1
    cmd, env = driver.command("/m", {"device": "cpu", "cpus": [0, 1]}, tmp_path / "p.json", "current-0")
    assert cmd == ["py", "-m", "agentrl_core.cli.main", "engine", "serve", "--model", "/m", "--host", "127.0.0.1",
                   "--port", "0", "--port-file", str(tmp_path / "p.json"), "--max-running-requests", "8",
                   "--dtype", "bfloat16", "--served-model-name", "current-0", "--seed", "0", "--device", "cpu",
                   "--cpus", "0,1",
                   "--threads", "3", "--max-context", "4096"] and env == {}
    cmd, env = driver.command("/m", {"device": "cuda", "gpus": [2]}, tmp_path / "p.json", "stale-0")
    assert env == {"CUDA_VISIBLE_DEVICES": "2"} and cmd[-4:] == ["--device", "cuda", "--max-context", "4096"]


async def test_busy_metric_on_sglang_reads_get_load_and_is_nonzero_while_generating():
    """Real SGLang's /get_server_info has no request counts and no forward time (the double answers
    only what 0.5.4 does), so the busy metric comes from /get_load: nonzero while the double
    generates, zero before and after."""
    import asyncio

    from sglang_double import FakeSGLang, parse_args

    from agentrl_core.http.server import bind_socket, serve_app
    from agentrl_core.train.step_metrics import pool_busy_metrics

    server = FakeSGLang(parse_args(["--model-path", "none", "--api-key", "k"]))
    server.ready_at = 0.0
    sock = bind_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    stop = asyncio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: serve_app(server.app, sock, stop=stop))
        async with EngineClient(url, token="k") as client:
            with anyio.fail_after(30):
                while not await client.alive():
                    await anyio.sleep(0.01)
            info = await client.server_info()
            state = info["internal_states"][0]
            assert {"last_gen_throughput", "memory_usage"} <= set(state) and info["version"] == "0.5.4"
            # what SGLang does not return, the double does not either
            assert not {"running", "waiting", "forward_seconds", "busy_fraction"} & (set(info) | set(state))
            idle = await client.busy()
            assert (idle.requests, idle.waiting, idle.forward_seconds) == (0, 0, None)
            assert pool_busy_metrics("current", {url: idle}, {}) == {
                "engine/current/busy_fraction": 0.0, "engine/current/requests": 0.0,
                "engine/current/waiting_requests": 0.0}

            done = anyio.Event()

            async def generate():
                await client.generate([1, 2, 3], {"max_new_tokens": 400})  # 2 s at 5 ms a token
                done.set()

            tg.start_soon(generate)
            with anyio.fail_after(30):
                while (await client.busy()).requests == 0:
                    await anyio.sleep(0.01)
            assert pool_busy_metrics("current", {url: await client.busy()}, {}) == {
                "engine/current/busy_fraction": 1.0, "engine/current/requests": 1.0,
                "engine/current/waiting_requests": 0.0}
            # the trainer's own path (Trainer._engine_metrics over its pools) reads the same
            from types import SimpleNamespace

            from agentrl_core.jobs.training import Trainer

            async with EnginePool("current", [url], token="k") as pool:
                trainer = SimpleNamespace(engine_pools={"current": pool}, _engine_busy={},
                                          config=SimpleNamespace(engine=SimpleNamespace(health_timeout=10)))
                metrics = await Trainer._engine_metrics(trainer)
            assert metrics["engine/current/busy_fraction"] == 1.0 and metrics["engine/current/requests"] == 1.0
            with anyio.fail_after(30):
                await done.wait()
            assert (await client.busy()).requests == 0
            assert (await client.server_info())["internal_states"][0]["last_gen_throughput"] > 0  # 400 tokens logged
            async with httpx.AsyncClient() as http:  # /get_load is behind the API key, as in SGLang
                assert (await http.get(url + "/get_load")).status_code == 401
        stop.set()


# -- colocated: release and resume memory around the learner step --------------------------------


def test_a_colocated_sglang_engine_starts_with_its_memory_saver(tmp_path):
    driver = SGLangDriver(sglang_config(), log_dir=str(tmp_path / "logs"))
    assert "--enable-memory-saver" not in driver.command("/m", 30000, 1, "current-0", 0)
    driver.release_memory = True  # what the engine host sets when its pool shares the learner's GPU
    assert "--enable-memory-saver" in driver.command("/m", 30000, 1, "current-0", 0)


@pytest.mark.processes
async def test_sglang_releases_around_a_learner_step_and_holds_requests_until_the_sync(tmp_path, monkeypatch,
                                                                                        tiny_model_dir):
    from safetensors.torch import load_file

    from agentrl_core.train.engine_memory import EngineMemory
    from agentrl_core.train.weight_sync import CollectiveTransport

    shim = install_shim(tmp_path / "shim")
    monkeypatch.setenv("PYTHONPATH", str(shim))
    monkeypatch.setenv("SGLANG_DOUBLE_STARTUP_S", "0")
    driver = SGLangDriver(sglang_config(python=sys.executable, startup_timeout=60), log_dir=str(tmp_path / "logs"))
    driver.release_memory = True
    weights = list(load_file(str(tiny_model_dir / "model.safetensors")).items())
    with driver:
        [url] = await anyio.to_thread.run_sync(driver.launch, "current", str(tiny_model_dir), [[0]])
        transport = CollectiveTransport(None, backend="gloo", bucket_mb=0.5, dtype="bfloat16", timeout_s=60)
        await anyio.to_thread.run_sync(transport.connect, "127.0.0.1", [url])
        answers = {}
        async with EnginePool("current", [url]) as pool, httpx.AsyncClient(base_url=url, timeout=30) as http:
            memory = EngineMemory({"current": pool})

            async def generate(key, n):
                answers[key] = await pool.generate(key, [1, 2, 3], {"max_new_tokens": n})

            async with anyio.create_task_group() as tg:
                tg.start_soon(generate, "cut", 2000)  # 10 s: the release's pause aborts it
                await wait_until_received([url], "/generate", [1])
                metrics = await memory.release(["current"])  # the learner step is due a sync
                assert metrics["time/engine_release_s"] >= 0.0
                state = (await http.get("/double/state")).json()
                assert state["paused"] and state["released"] == ["kv_cache", "weights"]
                assert (await http.get("/double/requests")).json()["/release_memory_occupation"] == [
                    {"tags": ["kv_cache", "weights"]}]
                tg.start_soon(generate, "held", 4)  # arrives while released: SGLang holds it (paused)
                await wait_until_received([url], "/generate", [2])
                await memory.resume()
                assert (await http.get("/double/state")).json()["stale_weights"] == len(weights)
                assert "held" not in answers  # still held: the resumed weights have no values yet
                stats = await anyio.to_thread.run_sync(transport.send, iter(weights), 1)  # continues the pool
                await memory.continue_unsynced(["current"])
            await anyio.to_thread.run_sync(transport.close)
            assert answers["cut"].finish_reason == "abort"
            assert answers["held"].output_ids == [6, 7, 8, 9] and answers["held"].weight_version == 1
            state = (await http.get("/double/state")).json()
            assert state["stale_weights"] == 0 and state["offload_tags"] == [] and stats["tensors"] == len(weights)
            assert [r for r in state["order"] if "memory" in r or "generation" in r] == [
                "/pause_generation", "/release_memory_occupation", "/resume_memory_occupation",
                "/pause_generation", "/continue_generation"]
        assert driver.procs.processes[0][1].poll() is None  # alive throughout


@pytest.mark.processes
async def test_the_double_dies_as_sglang_does_when_memory_is_released_under_a_running_request(
        tmp_path, monkeypatch, tiny_model_dir):
    shim = install_shim(tmp_path / "shim")
    monkeypatch.setenv("PYTHONPATH", str(shim))
    monkeypatch.setenv("SGLANG_DOUBLE_STARTUP_S", "0")
    driver = SGLangDriver(sglang_config(python=sys.executable, startup_timeout=60), log_dir=str(tmp_path / "logs"))
    driver.release_memory = True
    with driver:
        urls = await anyio.to_thread.run_sync(driver.launch, "current", str(tiny_model_dir), [[0], [1]])
        running, resumed_early = urls
        async with EngineClient(running) as client, EngineClient(resumed_early) as other:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_generate_ignoring_errors, client)
                await wait_until_received([running], "/generate", [1])
                with pytest.raises(EngineError):  # the scheduler's assertion takes the server down: no answer
                    await client.release_memory_occupation(["kv_cache"])
            # paused and released, then continued before the memory was resumed: the next request dies
            await other.pause_generation("abort")
            await other.release_memory_occupation(None)
            await other.continue_generation()
            with pytest.raises(EngineError):
                await other.generate([1, 2, 3], {"max_new_tokens": 2})
        procs = [proc for _, proc, _ in driver.procs.processes]
        await anyio.to_thread.run_sync(lambda: [p.wait(10) for p in procs])
        assert [p.returncode for p in procs] == [70, 70]
        logs = [path.read_text() for _, _, path in driver.procs.processes]
        assert "should be called only when no ongoing request" in logs[0]
        assert "illegal memory access" in logs[1]


async def _generate_ignoring_errors(client):
    with pytest.raises(EngineError):
        await client.generate([1, 2, 3], {"max_new_tokens": 2000})
