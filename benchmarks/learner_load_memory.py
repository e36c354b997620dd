"""Peak host memory per learner rank while the actor and the reference are loaded and sharded.

    python benchmarks/learner_load_memory.py [--size small] [--ranks 2]

``--ranks`` processes (FSDP2 over gloo on CPU) load the ``agentrl model init`` model of
``--size`` twice in fp32 (the actor and the frozen reference, as ``Learner`` does) and shard
it, in two ways, each in fresh processes:

* ``every rank reads``: each rank reads the whole checkpoint, then shards (before issue 24);
* ``rank 0 reads``: :func:`agentrl_core.train.learner.load_sharded_causal_lm`, rank 0 reads,
  the others build on the meta device and receive their shards.

Printed per way and rank: the peak resident set (``ru_maxrss``) after loading, and the same
for a process that only imported torch and transformers and joined the group (the baseline).
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank: int, ranks: int, port: int, model_dir: str, way: str, out: str) -> None:
    from agentrl_core.train.learner import load_causal_lm, load_sharded_causal_lm, shard_model

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(ranks))
    dist.init_process_group("gloo", rank=rank, world_size=ranks, timeout=timedelta(seconds=300))
    try:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (ranks,), mesh_dim_names=("dp",))
        device = torch.device("cpu")
        models = []
        for _ in ("actor", "reference"):
            if way == "every rank reads":
                models.append(shard_model(load_causal_lm(model_dir, torch.float32), mesh).to(device))
            elif way == "rank 0 reads":
                models.append(load_sharded_causal_lm(model_dir, torch.float32, "sdpa", False, mesh, device))
        dist.barrier()
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        with open(f"{out}.{rank}", "w") as f:
            f.write(f"{peak_mb:.0f}")
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="small")
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    from agentrl_core.tinymodel import init_model

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "no_data").mkdir()
        model_dir = init_model(Path(tmp) / "model", args.size, seed=0, data_dir=Path(tmp) / "no_data")
        size_mb = (Path(model_dir) / "model.safetensors").stat().st_size / 2**20
        print(f"model {args.size}: {size_mb:.0f} MiB of fp32 weights on disk; load average {os.getloadavg()[0]:.1f}")
        for way in ("baseline", "every rank reads", "rank 0 reads"):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            out = str(Path(tmp) / way.replace(" ", "_"))
            mp.start_processes(worker, args=(args.ranks, port, str(model_dir), way, out), nprocs=args.ranks,
                               start_method="spawn")
            peaks = [Path(f"{out}.{r}").read_text() for r in range(args.ranks)]
            print(f"{way:>17}: peak RSS per rank {', '.join(p + ' MiB' for p in peaks)}")
        print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
