"""The cost of the weight sync's lockstep flag: gathering every full tensor with and without it.

    python benchmarks/weight_sync_lockstep.py [--rounds 7]

Two learner ranks (FSDP2 over gloo on CPU, one torch thread each) hold the tiny Qwen2 model
(``agentrl model init --size tiny``, 50 parameter tensors). Each round gathers every full
tensor (``Learner.named_full_tensors``: one all-gather per tensor) plainly, then through
:class:`agentrl_core.train.weight_sync.Lockstep` (one more 4-byte all-reduce per tensor, the
flag every rank agrees on before each gather), after a barrier. Printed: the median over the
rounds of each, measured on rank 0, and the load average before and after (the machine may be
shared; read the difference, not the absolute numbers).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank: int, port: int, model_dir: str, rounds: int) -> None:
    from agentrl_core.config import OptimConfig, TrainConfig
    from agentrl_core.train.learner import Learner
    from agentrl_core.train.weight_sync import Lockstep, drain

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=120))
    try:
        learner = Learner(model_dir, train=TrainConfig(device="cpu", reference=False), optim=OptimConfig(lr=1e-3))
        seconds: dict[str, list[float]] = {"plain": [], "lockstep": []}
        for _ in range(rounds):
            for kind in seconds:
                dist.barrier()
                start = time.perf_counter()
                tensors = learner.named_full_tensors()
                if kind == "lockstep":
                    stream = Lockstep(tensors)
                    drain(stream)
                    stream.settle(failed=False)
                else:
                    drain(tensors)
                seconds[kind].append(time.perf_counter() - start)
        if rank == 0:
            n = len(list(learner.model.named_parameters()))
            medians = {k: round(statistics.median(v) * 1000, 1) for k, v in seconds.items()}
            print(f"{n} tensors, median of {rounds} rounds: plain {medians['plain']} ms, "
                  f"lockstep {medians['lockstep']} ms", flush=True)
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    from agentrl_core.tinymodel import init_model

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "no_data").mkdir()
        model_dir = init_model(Path(tmp) / "tiny", "tiny", seed=0, data_dir=Path(tmp) / "no_data")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        print(f"load average before: {os.getloadavg()[0]:.1f}")
        mp.start_processes(worker, args=(port, str(model_dir), args.rounds), nprocs=2, start_method="spawn")
        print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
