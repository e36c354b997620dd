"""Learner throughput: trained tokens/s and padding waste, packed vs padded micro-batches.

    python benchmarks/learner_throughput.py [--quick] [--out benchmarks/results/learner_throughput.json]

The tiny Qwen2 model (``agentrl model init --size tiny``) trains full learner steps
(reference log-probs, forward and backward of every micro-batch, AdamW) on one CPU process
(an FSDP2 world of one over gloo) with a step batch of synthetic multi-turn trajectories:
heavy-tailed lengths (log-normal, median 600 tokens, 64..2048) with about a third of the
tokens being model tokens (loss tokens). Both layouts train the same batches under the same
``max_tokens_per_micro_batch`` budget, alternating step by step so machine noise hits both:

* ``packed``: sequences concatenated into one row under the budget (no padding);
* ``padded``: one row per sequence, right-padded, rows x longest <= budget.

Reported per layout: trained tokens/s (all tokens of the batch / step time), loss tokens/s,
padding waste (share of computed token slots that are padding), micro-batches per step and
stage times (median over the measured steps). The machine is shared, so each step's CPU
time (``time.process_time``, all threads of this process) is measured too: tokens per CPU
second compare the layouts' work even when other jobs take the cores, while wall-clock
tokens/s move with the load average (recorded before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def synthetic_batch(n: int, vocab: int, seed: int) -> list:
    from agentrl_core.train.batching import TrainSample

    rng = random.Random(seed)
    samples = []
    for i in range(n):
        length = int(min(2048, max(64, rng.lognormvariate(6.4, 0.7))))  # median e^6.4 ~ 600
        mask = [0] * length
        pos = min(length // 4, 200)  # system prompt + task, then turns: observation (0) / action (1)
        while pos < length:
            action = rng.randint(20, 80)
            for p in range(pos, min(length, pos + action)):
                mask[p] = 1
            pos += action + rng.randint(30, 150)
        ids = [rng.randrange(vocab) for _ in range(length)]
        old = [-rng.uniform(5.0, 9.0) if m else 0.0 for m in mask]
        adv = [rng.choice([-1.0, 1.0]) * m for m in mask]
        samples.append(TrainSample(ids, mask, old, adv, group_id=f"g{i // 8}"))
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller batch and fewer steps (about a minute)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--budget", type=int, default=4096, help="max_tokens_per_micro_batch")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    args = parser.parse_args()

    import torch

    from agentrl_core.config import OptimConfig, TrainConfig
    from agentrl_core.tinymodel import init_model
    from agentrl_core.train.learner import Learner, init_distributed

    if args.threads:
        torch.set_num_threads(args.threads)
    batch_size, steps = (16, 2) if args.quick else (48, 4)
    load_before = os.getloadavg()
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = init_model(Path(tmp) / "tiny", "tiny", seed=0)
        init_distributed("cpu")
        learners = {
            layout: Learner(model_dir, train=TrainConfig(device="cpu", max_tokens_per_micro_batch=args.budget),
                            optim=OptimConfig(lr=1e-6), temperature=0.8, layout=layout)
            for layout in ("packed", "padded")
        }
        vocab = learners["packed"].config.vocab_size
        runs: dict[str, list[dict]] = {layout: [] for layout in learners}
        for step in range(steps + 1):  # step 0 warms up (allocator, kernels) and is not reported
            batch = synthetic_batch(batch_size, vocab, seed=step)
            order = list(learners) if step % 2 == 0 else list(reversed(learners))
            for layout in order:
                cpu = time.process_time()
                metrics = learners[layout].train_step(batch)
                metrics["cpu_s"] = time.process_time() - cpu
                if step:
                    runs[layout].append(metrics)
                print(f"step {step} {layout:>6}: {metrics['tokens_per_s']:8.0f} tok/s, "
                      f"waste {metrics['padding_waste']:.1%}, {int(metrics['micro_batches'])} micro-batches, "
                      f"{metrics['time/step_s']:.2f} s wall, {metrics['cpu_s']:.2f} s CPU", flush=True)

    def summary(records: list[dict]) -> dict:
        med = lambda key: statistics.median(r[key] for r in records)  # noqa: E731
        step_s = med("time/step_s")
        return {
            "trained_tokens_per_s": med("num_tokens") / step_s,
            "trained_tokens_per_cpu_s": statistics.median(r["num_tokens"] / r["cpu_s"] for r in records),
            "cpu_s": med("cpu_s"),
            "loss_tokens_per_s": med("num_loss_tokens") / step_s,
            "padding_waste": med("padding_waste"),
            "micro_batches_per_step": med("micro_batches"),
            "step_s": step_s,
            "ref_s": med("time/ref_s"),
            "actor_s": med("time/actor_s"),
            "optim_s": med("time/optim_s"),
            "tokens_per_step": med("num_tokens"),
            "per_step_tokens_per_s": [r["tokens_per_s"] for r in records],
        }

    results = {layout: summary(records) for layout, records in runs.items()}
    speedup = results["packed"]["trained_tokens_per_s"] / results["padded"]["trained_tokens_per_s"]
    cpu_speedup = results["packed"]["trained_tokens_per_cpu_s"] / results["padded"]["trained_tokens_per_cpu_s"]
    out = {
        "benchmark": "learner_throughput",
        "quick": args.quick,
        "params": {
            "model": "agentrl model init --size tiny (Qwen2, 4 layers, hidden 128, vocab 4120)",
            "batch_sequences": batch_size, "measured_steps": steps, "max_tokens_per_micro_batch": args.budget,
            "lengths": "log-normal median 600, clipped 64..2048", "world_size": 1, "device": "cpu",
            "torch_threads": torch.get_num_threads(), "kl_coef": 1e-4, "reference_model": True,
        },
        "results": results,
        "packed_over_padded_tokens_per_s": speedup,
        "packed_over_padded_tokens_per_cpu_s": cpu_speedup,
        "machine": {
            "platform": platform.platform(), "python": sys.version.split()[0], "cpu_count": os.cpu_count(),
            "torch": torch.__version__, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        },
        "wall_s": time.time() - started,
    }
    path = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / (
        "learner_throughput_quick.json" if args.quick else "learner_throughput.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    for layout, r in results.items():
        print(f"{layout:>6}: {r['trained_tokens_per_s']:8.0f} trained tok/s ({r['trained_tokens_per_cpu_s']:.0f} per CPU s), "
              f"{r['loss_tokens_per_s']:7.0f} loss tok/s, "
              f"padding waste {r['padding_waste']:.1%}, {r['micro_batches_per_step']:.0f} micro-batches/step")
    print(f"packed / padded: {speedup:.2f}x wall, {cpu_speedup:.2f}x per CPU second  (load {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}); wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
