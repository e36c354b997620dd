"""A failed weight sync on two learner ranks (gloo on CPU): every rank leaves it together.

Rank 0 sends, rank 1 only gathers (the FSDP2 learner's ``named_full_tensors``: one
all-gather per parameter). When rank 0's transport fails on a pool, rank 1 must not go on
gathering (for the rest of the pool, or for the next pool) without a partner until the
group's timeout, and the next sync must pair every collective with the same one on the
other rank. The default group's timeout here is 60 s; each failure must be over in seconds.

The transport that fails mid-stream is a labelled TEST DOUBLE (it takes a few tensors, then
fails as an engine refusing a bucket would); the one that fails after the stream is the real
disk transport with an engine that does not answer.
"""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta

import pytest
import torch
import torch.multiprocessing as mp

GROUP_TIMEOUT_S = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Recorder:
    """TEST DOUBLE of a transport: takes every tensor (or fails after ``fail_after`` of them)."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.fail_after = fail_after
        self.received: list[tuple[str, torch.Tensor]] = []

    def send(self, tensors, version):
        from agentrl_core.train.weight_sync import WeightSyncError, drain, release

        tensors = iter(tensors)
        try:
            for name, tensor in tensors:
                if self.fail_after is not None and len(self.received) >= self.fail_after:
                    raise WeightSyncError(f"engine refused bucket {len(self.received)} of version {version}")
                self.received.append((name, tensor.clone()))
        except BaseException:
            release(tensors)
            raise
        drain(tensors)
        return {"tensors": len(self.received)}


def _timed(fn):
    start = time.monotonic()
    try:
        return {"result": fn(), "seconds": time.monotonic() - start}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "seconds": time.monotonic() - start}


def rank_worker(rank, world_size, port, model_dir, out_dir, dead_url, disk_dir):
    import torch.distributed as dist

    from agentrl_core.config import OptimConfig, TrainConfig
    from agentrl_core.train.learner import Learner
    from agentrl_core.train.weight_sync import DiskTransport, push_weights

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    try:
        learner = Learner(model_dir, train=TrainConfig(device="cpu", reference=False), optim=OptimConfig(lr=1e-3))
        gathered: list[int] = []

        def counted():  # how far this rank gathered in each sync
            gathered.append(0)
            for item in learner.named_full_tensors():
                gathered[-1] += 1
                yield item

        transports = {}
        if rank == 0:
            disk = DiskTransport(None, disk_path=disk_dir, timeout_s=5)
            disk.connect(None, [dead_url])  # no HTTP at connect without partial rollouts
            transports = {"current": Recorder(), "stale": Recorder(fail_after=3), "unreachable": disk}
        out = {"tensors": len(list(learner.model.named_parameters()))}
        # 1. the second pool fails mid-stream on rank 0
        out["mid_stream"] = _timed(lambda: push_weights(counted, transports, ["current", "stale"], 1, rank=rank))
        # 2. the first pool fails after the whole stream (the engine does not answer the pause); the
        #    second is not synced
        out["after_stream"] = _timed(lambda: push_weights(counted, transports, ["unreachable", "current"], 2,
                                                         rank=rank))
        # 3. the retry: every collective pairs with the same one on the other rank
        if rank == 0:
            transports["stale"] = Recorder()
            transports["current"].received.clear()
        out["retry"] = _timed(lambda: push_weights(counted, transports, ["current", "stale"], 3, rank=rank))
        out["gathered"] = gathered
        if rank == 0:
            expected = dict(learner.named_full_tensors())
            out["retry_exact"] = all(torch.equal(expected[n], t) for n, t in transports["stale"].received) and \
                [n for n, _ in transports["stale"].received] == list(expected)
        else:
            drain_all = list(learner.named_full_tensors())  # rank 0 gathers `expected` above
            del drain_all
        torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.processes
def test_every_rank_leaves_a_failed_sync_together_and_a_retry_starts_clean(tiny_model_dir, tmp_path):
    dead_url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    mp.start_processes(
        rank_worker, args=(2, _free_port(), str(tiny_model_dir), str(tmp_path), dead_url, str(tmp_path / "disk")),
        nprocs=2, start_method="spawn",
    )
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    n = r0["tensors"]

    # 1. rank 0 reports its transport's error, rank 1 that the sync was stopped; both within seconds
    assert "engine refused bucket 3 of version 1" in r0["mid_stream"]["error"]
    assert "SyncStopped" in r1["mid_stream"]["error"] and "'stale'" in r1["mid_stream"]["error"]
    # 2. the disk transport fails after every tensor was written; rank 1 hears it and does not
    #    start gathering for "current"
    assert "WeightSyncError" in r0["after_stream"]["error"] and "pause_generation" in r0["after_stream"]["error"]
    assert "SyncStopped" in r1["after_stream"]["error"] and "'unreachable'" in r1["after_stream"]["error"]
    for r in (r0, r1):
        for case in ("mid_stream", "after_stream"):
            assert r[case]["seconds"] < GROUP_TIMEOUT_S / 4, (case, r[case])  # not a collective timeout
        # both ranks gathered the same tensors in every sync: current (all), stale (stopped after
        # the 4th: the double failed before taking it), unreachable (all), the retry (all, twice)
        assert r["gathered"] == [n, 4, n, n, n], r["gathered"]
    # 3. the retry succeeds on both ranks and sends the learner's weights bit for bit
    assert r0["retry"]["result"]["weight_sync/stale/tensors"] == n
    assert set(r1["retry"]["result"]) == {"weight_sync/current/seconds", "weight_sync/stale/seconds"}
    assert r0["retry_exact"]
