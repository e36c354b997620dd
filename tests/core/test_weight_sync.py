"""Weight sync: every parameter arrives bit-exact in three real engine servers.

The engines are the rollout issue's HF engine server (``agentrl_core.engine.server``)
in three subprocesses. The harness at the bottom of this file runs one and adds a single
test-only route, ``/test/dump_weights``, that writes the engine model's parameters to a
safetensors file, so the test can compare them with the learner's bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from agentrl_core.train.weight_sync import (
    CollectiveTransport,
    DiskTransport,
    WeightSyncError,
    iter_buckets,
    pools_due,
    push_weights,
)
from agentrl_core.types import PoolSpec

BUCKET_MB = 0.3  # the tiny model's embedding (4120 x 128 fp32, 2.0 MiB) is larger than a bucket


def test_buckets_keep_the_tensor_that_crosses_the_boundary():
    sizes = {"a": 1, "b": 1, "c": 1, "big": 3, "d": 1}  # float32 elements: 4 bytes each
    named = [(n, torch.zeros(k)) for n, k in sizes.items()]
    buckets = [[n for n, _ in b] for b in iter_buckets(named, bucket_bytes=8)]
    # a+b fill 8 bytes; c would cross the boundary and opens the next bucket (upstream skipped it);
    # big (12 bytes) is larger than a bucket and goes alone
    assert buckets == [["a", "b"], ["c"], ["big"], ["d"]]
    assert [n for b in buckets for n in b] == list(sizes)
    with pytest.raises(ValueError):
        list(iter_buckets(named, 0))


def test_pools_due_on_their_schedules():
    pools = [PoolSpec("current", 0.75, sync_every=1), PoolSpec("stale", 0.25, sync_every=25)]
    assert [p.name for p in pools_due(pools, 0, initial=True)] == ["current", "stale"]
    assert [p.name for p in pools_due(pools, 7)] == ["current"]
    assert [p.name for p in pools_due(pools, 50)] == ["current", "stale"]


def test_push_weights_sends_on_rank0_and_drains_elsewhere():
    sent, drained = [], []

    class Recorder:
        def send(self, tensors, version):
            sent.append((version, [n for n, _ in tensors]))
            return {"tensors": 1}

    def tensors():
        for name in ("x", "y"):
            drained.append(name)
            yield name, torch.zeros(1)

    metrics = push_weights(tensors, {"current": Recorder(), "stale": Recorder()}, ["current"], 3, rank=0)
    assert sent == [(3, ["x", "y"])] and metrics["weight_sync/current/tensors"] == 1.0
    push_weights(tensors, {}, [PoolSpec("stale")], 3, rank=1)  # no transport needed off rank 0
    assert drained == ["x", "y", "x", "y"]


def test_disk_transport_needs_a_path():
    with pytest.raises(WeightSyncError, match="disk_path"):
        DiskTransport(None)


# ---------------------------------------------------------------------------------------
# Two real engine servers


def _start_engine(model_dir: Path, workdir: Path, name: str) -> tuple[subprocess.Popen, Path]:
    port_file = workdir / f"{name}.port.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with open(workdir / f"{name}.log", "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen([sys.executable, __file__, str(model_dir), str(port_file)], stdout=log,
                                stderr=subprocess.STDOUT, env=env)
    return proc, port_file


def _wait_listening(proc: subprocess.Popen, port_file: Path, deadline: float) -> str:
    while not port_file.exists():  # readiness of a subprocess, with a deadline
        if proc.poll() is not None:
            raise RuntimeError(f"engine exited with {proc.returncode}; see {port_file.with_suffix('').with_suffix('.log')}")
        if time.monotonic() > deadline:
            raise TimeoutError("engine did not start")
        time.sleep(0.1)
    return json.loads(port_file.read_text())["url"]


@pytest.fixture(scope="module")
def engines(tiny_model_dir, tmp_path_factory):
    """Three engines: in a gloo broadcast to ranks 0-3, some receive through others."""
    workdir = tmp_path_factory.mktemp("engines")
    started = [_start_engine(tiny_model_dir, workdir, f"engine{i}") for i in range(3)]
    try:
        deadline = time.monotonic() + 180
        yield [_wait_listening(proc, pf, deadline) for proc, pf in started]
    finally:
        for proc, _ in started:
            proc.terminate()
        for proc, _ in started:
            proc.wait(30)


def _dump(url: str, path: Path) -> dict[str, torch.Tensor]:
    import httpx
    from safetensors.torch import load_file

    httpx.post(f"{url}/test/dump_weights", json={"path": str(path)}, timeout=120).raise_for_status()
    return load_file(str(path))


def _perturbed(model_dir: Path, seed: int) -> list[tuple[str, torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    return [(n, (p.detach() + 0.01 * torch.randn(p.shape, generator=gen)).contiguous()) for n, p in model.named_parameters()]


def _info(url: str) -> dict:
    import httpx

    return httpx.get(f"{url}/get_model_info", timeout=30).json()


@pytest.mark.processes
def test_collective_sync_is_bit_exact_in_engines(engines, tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    weights = _perturbed(tiny_model_dir, seed=1)
    bucket_bytes = int(BUCKET_MB * 2**20)
    buckets = list(iter_buckets(weights, bucket_bytes))
    size = {n: t.numel() * t.element_size() for n, t in weights}
    assert any(len(b) == 1 and size[b[0][0]] > bucket_bytes for b in buckets)  # one larger than a bucket
    # the first tensor of every later bucket is one that did not fit in the previous one
    crossers = [b[0][0] for prev, b in zip(buckets[:-1], buckets[1:], strict=True) if len(prev) > 1]
    assert len(crossers) >= 5
    # the engines start from the original weights, so arrival is visible
    original = load_file(str(tiny_model_dir / "model.safetensors"))
    assert not any(torch.equal(original[n], dict(weights)[n]) for n in crossers)

    transport = CollectiveTransport(None, backend="gloo", bucket_mb=BUCKET_MB)
    transport.connect("127.0.0.1", engines)
    try:
        stats = transport.send(iter(weights), version=7)
    finally:
        transport.close()
    assert stats["tensors"] == len(weights) and stats["buckets"] == len(buckets)
    for i, url in enumerate(engines):
        info = _info(url)
        assert info["weight_version"] == 7 and not info.get("paused", False)
        got = _dump(url, tmp_path / f"engine{i}.safetensors")
        assert set(got) == {n for n, _ in weights}
        for name, tensor in weights:
            assert torch.equal(got[name], tensor), f"engine {i}: {name} differs"


@pytest.mark.processes
def test_collective_sync_from_an_fsdp_learner(engines, tiny_model_dir, tmp_path):
    """The learner process has its own (FSDP) default process group beside the weight group,
    and its parameters are DTensor shards gathered one by one."""
    import torch.distributed as dist

    from agentrl_core.config import OptimConfig, TrainConfig
    from agentrl_core.train.learner import Learner, init_distributed

    created = not dist.is_initialized()
    init_distributed("cpu")
    try:
        learner = Learner(tiny_model_dir, train=TrainConfig(device="cpu", reference=False), optim=OptimConfig(lr=1e-2))
        with torch.no_grad():  # move away from the engines' weights
            for p in learner.model.parameters():
                p.add_(0.01)
        expected = {n: t.clone() for n, t in learner.named_full_tensors()}
        transport = CollectiveTransport(None, backend="gloo", bucket_mb=BUCKET_MB)
        transport.connect("127.0.0.1", engines)
        try:
            transport.send(learner.named_full_tensors(), version=21)
        finally:
            transport.close()
    finally:
        if created:
            dist.destroy_process_group()
    for i, url in enumerate(engines):
        got = _dump(url, tmp_path / f"fsdp{i}.safetensors")
        assert set(got) == set(expected)
        for name, tensor in expected.items():
            assert torch.equal(got[name], tensor), f"engine {i}: {name} differs"


@pytest.mark.processes
def test_failed_sync_leaves_the_pool_paused_until_a_full_sync(engines, tiny_model_dir):
    weights = _perturbed(tiny_model_dir, seed=4)
    bogus = weights[:3] + [("model.not_a_parameter", torch.zeros(2))] + weights[3:]
    transport = CollectiveTransport(None, backend="gloo", bucket_mb=BUCKET_MB)
    transport.connect("127.0.0.1", engines)
    consumed = []

    def tracked(named):
        for item in named:
            consumed.append(item[0])
            yield item

    try:
        with pytest.raises(WeightSyncError, match="not parameters of the model"):
            transport.send(tracked(bogus), version=11)
        assert consumed == [n for n, _ in bogus]  # drained: other learner ranks would be gathering
        assert all(_info(url)["paused"] for url in engines)  # no token is sampled from mixed weights
        transport.send(iter(weights), version=12)  # a complete sync un-pauses the pool
    finally:
        transport.close()
    assert all(not _info(url)["paused"] and _info(url)["weight_version"] == 12 for url in engines)


@pytest.mark.processes
def test_an_engine_refusing_a_bucket_does_not_leave_the_others_in_the_broadcast(engines, tiny_model_dir, tmp_path):
    """One engine refuses a bucket before its broadcast while the others accepted it and wait in
    it: the sync fails within seconds (not at the 120 s deadline), every engine answers again,
    the pool stays paused, and the next sync (in a new group) updates every engine."""
    import httpx

    weights = _perturbed(tiny_model_dir, seed=5)
    transport = CollectiveTransport(None, backend="gloo", bucket_mb=BUCKET_MB, timeout_s=120)
    transport.connect("127.0.0.1", engines)
    refuser = engines[-1]  # group rank 3: in gloo's broadcast tree an other engine receives through it
    try:
        httpx.post(f"{refuser}/test/refuse_next_update", timeout=30).raise_for_status()
        start = time.monotonic()
        with pytest.raises(WeightSyncError, match=r"bucket 0: .*needs generation paused first") as failed:
            transport.send(iter(weights), version=13)
        assert time.monotonic() - start < 30
        assert refuser in str(failed.value) and "the next sync forms a new one" in str(failed.value)
        assert transport.abandoned == 1 and transport.group is None
        assert all(_info(url)["paused"] for url in engines)  # answering, and no token from mixed weights
        stats = transport.send(iter(weights), version=14)
    finally:
        transport.close()
    assert stats["tensors"] == len(weights)
    for i, url in enumerate(engines):
        assert _info(url)["weight_version"] == 14 and not _info(url)["paused"]
        got = _dump(url, tmp_path / f"refused{i}.safetensors")
        for name, tensor in weights:
            assert torch.equal(got[name], tensor), f"engine {i}: {name} differs"


@pytest.mark.processes
def test_disk_sync_reloads_every_engine(engines, tiny_model_dir, tmp_path):
    weights = _perturbed(tiny_model_dir, seed=3)
    transport = DiskTransport(None, disk_path=str(tmp_path / "shared"), model_dir=str(tiny_model_dir), keep=1)
    transport.connect(None, engines)
    try:
        transport.send(iter(weights), version=8)
        transport.send(iter(weights), version=9)
    finally:
        transport.close()
    assert sorted(p.name for p in (tmp_path / "shared").iterdir()) == ["weights_v9"]  # keep=1
    for i, url in enumerate(engines):
        assert _info(url)["weight_version"] == 9
        got = _dump(url, tmp_path / f"disk{i}.safetensors")
        for name, tensor in weights:
            assert torch.equal(got[name], tensor), f"engine {i}: {name} differs"


# ---------------------------------------------------------------------------------------
# Harness: python test_weight_sync.py MODEL_DIR PORT_FILE


def _serve(model_dir: str, port_file: str) -> None:
    import asyncio
    import signal

    from safetensors.torch import save_file

    from agentrl_core.engine.scheduler import EngineConflict
    from agentrl_core.engine.server import EngineServer

    torch.set_num_threads(1)
    server = EngineServer(model_dir, device="cpu", max_running_requests=4)

    async def dump_weights(request):
        path = request.json_object()["path"]

        def write() -> None:
            tensors = {n: p.detach().clone().contiguous() for n, p in server.model.hf.named_parameters()}
            save_file(tensors, path)

        await asyncio.to_thread(write)
        return {"success": True}

    server.app.route("POST", "/test/dump_weights", dump_weights)
    scheduler = server.scheduler
    require_paused = scheduler.require_paused
    refusing = {"next": False}

    def refuse_once(what: str) -> None:
        if refusing["next"]:
            refusing["next"] = False
            raise EngineConflict(f"{what} needs generation paused first (a refusal the test asked for)")
        require_paused(what)

    async def refuse_next_update(request):
        """The next weight update is refused before its broadcast, as by an engine that is not paused."""
        refusing["next"] = True
        return {"success": True}

    scheduler.require_paused = refuse_once
    server.app.route("POST", "/test/refuse_next_update", refuse_next_update)

    async def main() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

        def listening(url: str) -> None:
            Path(port_file + ".tmp").write_text(json.dumps({"url": url}))
            os.replace(port_file + ".tmp", port_file)

        await server.serve("127.0.0.1", 0, stop=stop, on_listening=listening)

    asyncio.run(main())


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2])


def test_leaving_the_group_skips_an_engine_that_is_gone():
    # a restarted engine's predecessor, or an engine stopped first at the end of a run: no warning, no error
    import socket

    from agentrl_core.train.weight_sync import WeightSyncError, _Deadline, _Engines

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    engines = _Engines([dead], timeout_s=10.0)
    try:
        for client in engines.clients:
            client.connect_retries, client.retry_backoff = 1, 0.01
        assert engines.call("destroy_weights_update_group", _Deadline(10.0, "leaving"), gone_ok=True,
                            group_name="g") == [None]
        with pytest.raises(WeightSyncError, match="cannot connect to the engine"):
            engines.call("destroy_weights_update_group", _Deadline(10.0, "leaving"), group_name="g")
    finally:
        engines.close()
