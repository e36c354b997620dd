"""LoRA against full fine-tuning: learner step time, peak memory, optimizer state, sync bytes.

    python benchmarks/lora.py [--quick] [--sizes tiny,small] [--out benchmarks/results/lora.json]

For each model size (``agentrl model init --size``) and each arm (``full``: every weight
trained, a frozen reference copy; ``lora``: ``model.lora`` rank 16 on the seven linear
layers of every decoder layer, the reference being the base model with the adapters off),
one learner process (an FSDP2 world of one over gloo, CPU) trains full steps (reference
log-probs, forward and backward, AdamW) on the same synthetic batch of multi-turn
trajectories, with ``loss.kl_coef`` 0.05 so both arms compute their reference. Each arm runs in
its own process, so its peak resident memory (``ru_maxrss``) is its own. Reported per arm:
median step time over the measured steps (and the CPU time of the step, which the shared
machine's load moves less), the stage times, peak RSS, trained parameters, AdamW state
bytes, and the bytes one weight sync sends (merged full weights today; the adapter alone for
reference, what adapter-only sync would send). The arms alternate step by step is not
possible across processes, so they run one after the other and the load average is recorded
around each.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


def arm(model_dir: str, lora: bool, steps: int, batch: int, out: str) -> None:
    """One arm, in this process: build the learner, train ``steps`` (+1 warm-up), write JSON."""
    import torch
    from learner_throughput import synthetic_batch

    from agentrl_core.config import LoraConfig, LossConfig, OptimConfig, TrainConfig
    from agentrl_core.train.learner import Learner, init_distributed

    torch.manual_seed(0)
    init_distributed("cpu")
    config = LoraConfig(enabled=lora, rank=16, alpha=32.0)
    t0 = time.perf_counter()
    learner = Learner(model_dir, train=TrainConfig(device="cpu", max_tokens_per_micro_batch=4096, reference=True),
                      optim=OptimConfig(lr=1e-5), loss=LossConfig(kl_coef=0.05), lora=config)
    load_s = time.perf_counter() - t0
    samples = synthetic_batch(batch, learner.config.vocab_size, seed=1)
    walls, cpus, stages = [], [], []
    for step in range(steps + 1):
        c0, w0 = time.process_time(), time.perf_counter()
        metrics = learner.train_step(samples)
        if step:  # the first step warms up (allocator, lazy FSDP init, AdamW state)
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
            stages.append({k: metrics[k] for k in ("time/ref_s", "time/actor_s", "time/optim_s")})
    params = list(learner.model.parameters())
    trained = sum(p.numel() for p in params if p.requires_grad)
    total = sum(p.numel() for p in params)
    optim_bytes = sum(t.numel() * t.element_size() for s in learner.optimizer.state.values()
                      for t in s.values() if torch.is_tensor(t))
    sync_full = sum(t.numel() * 2 for _, t in learner.named_full_tensors())  # bf16 on the wire
    sync_adapter = sum(t.numel() * 2 for _, t in learner.adapter_tensors()) if lora else None
    result = {
        "arm": "lora" if lora else "full",
        "load_s": round(load_s, 2),
        "step_s_median": round(statistics.median(walls), 3),
        "step_cpu_s_median": round(statistics.median(cpus), 3),
        "stages_s_median": {k: round(statistics.median(s[k] for s in stages), 3) for k in stages[0]},
        "tokens_per_step": sum(len(s) for s in samples),
        "trained_params": trained,
        "total_params": total,
        "trained_share": round(trained / total, 5),
        "adamw_state_bytes": optim_bytes,
        "reference_copy": learner.ref_model is not None,
        "sync_bytes_merged_bf16": sync_full,
        "sync_bytes_adapter_bf16": sync_adapter,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    Path(out).write_text(json.dumps(result))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny model, 2 steps of 4 trajectories: the plumbing")
    parser.add_argument("--sizes", default=None, help="model sizes (default tiny,small; quick tiny)")
    parser.add_argument("--steps", type=int, default=None, help="measured steps per arm (default 4; quick 2)")
    parser.add_argument("--batch", type=int, default=None, help="trajectories per step (default 16; quick 4)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--arm", nargs=4, metavar=("MODEL", "LORA", "STEPS", "BATCH"), help=argparse.SUPPRESS)
    parser.add_argument("--arm-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        model_dir, lora, steps, batch = args.arm
        arm(model_dir, lora == "1", int(steps), int(batch), args.arm_out)
        return 0
    sizes = (args.sizes or ("tiny" if args.quick else "tiny,small")).split(",")
    steps = args.steps or (2 if args.quick else 4)
    batch = args.batch or (4 if args.quick else 16)
    out = args.out or ROOT / "benchmarks" / "results" / ("lora_quick.json" if args.quick else "lora.json")
    from agentrl_core.tinymodel import init_model

    results: dict[str, dict] = {}
    env = dict(os.environ, OMP_NUM_THREADS=str(os.cpu_count() or 1))
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            model_dir = init_model(Path(tmp) / size, size, seed=0)
            results[size] = {}
            for lora in (False, True):
                name = "lora" if lora else "full"
                arm_out = Path(tmp) / f"{size}-{name}.json"
                load_before = os.getloadavg()
                subprocess.run([sys.executable, __file__, "--arm", str(model_dir), "1" if lora else "0", str(steps),
                                str(batch), "--arm-out", str(arm_out)], check=True, env=env)
                r = json.loads(arm_out.read_text())
                r["load_before"], r["load_after"] = [round(x, 2) for x in load_before], \
                    [round(x, 2) for x in os.getloadavg()]
                results[size][name] = r
                print(f"{size:5s} {name:4s} step {r['step_s_median']:.2f} s (cpu {r['step_cpu_s_median']:.2f} s)  "
                      f"peak RSS {r['peak_rss_mib']:.0f} MiB  trained {r['trained_share']:.2%}  "
                      f"AdamW {r['adamw_state_bytes'] / 2**20:.1f} MiB  load {r['load_before'][0]:.1f}", flush=True)
            full, lora_r = results[size]["full"], results[size]["lora"]
            results[size]["lora_over_full"] = {
                "step_time": round(lora_r["step_s_median"] / full["step_s_median"], 3),
                "step_cpu_time": round(lora_r["step_cpu_s_median"] / full["step_cpu_s_median"], 3),
                "peak_rss": round(lora_r["peak_rss_mib"] / full["peak_rss_mib"], 3),
                "adamw_state": round(lora_r["adamw_state_bytes"] / max(full["adamw_state_bytes"], 1), 4),
                "adapter_sync_bytes_over_merged": round(lora_r["sync_bytes_adapter_bf16"]
                                                        / lora_r["sync_bytes_merged_bf16"], 4),
            }
    report = {
        "benchmark": "lora",
        "parameters": {"sizes": sizes, "steps": steps, "batch": batch, "lora": {"rank": 16, "alpha": 32},
                       "kl_coef": 0.05, "quick": args.quick},
        "results": results,
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "date": datetime.now(timezone.utc).isoformat(timespec="seconds")},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
