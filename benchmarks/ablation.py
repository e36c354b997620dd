"""Ablation of the two algorithm plugins (issue 7): cross-policy sampling and task normalization.

The learning setup of ``benchmarks/learning.py`` (the tiny model warmed up by SFT on a mix of
right and wrong calc demonstrations, then ``agentrl train`` on 2 CPU cores), trained on two
tasks at once that differ in turn length and reward variance:

* ``calc-short``: calc problems with one operation (2 turns: calculate, submit_answer);
* ``calc-long``: problems with ``max_ops`` operations (``max_ops + 1`` turns), which the
  SFT model solves less often, so its rewards have another mean and variance.

Both are index subsets of calc's ``train`` split (``tasks[].indices``; held-out: the same
subsets of ``test``), so they are distinct ``data_source``s for task normalization. Arms:

* ``baseline``: the ``current`` sampler, GRPO only;
* ``cross``: ``sampler: cross`` with ``stale_step`` 5 (a CPU-sized run; paper: 25) and the
  paper's ``stale_ratio`` 0.25;
* ``task_norm``: ``advantage.normalizers: [task]``;
* ``cross+task_norm``: both (the paper's full system).

Each arm runs with several seeds (``run.seed``: task order, sampling, cross-sampling draws;
the SFT model is shared). Written: per-step training reward of each task, mean and std over
seeds, and held-out success per task at the end, to ``benchmarks/results/ablation.json`` and
a PNG beside it. There is no target (issue 7): the JSON and the README report what was seen.

    python benchmarks/ablation.py            # 3 arms x 3 seeds x 15 steps (~45 min on 2 cores, with its SFT)
    python benchmarks/ablation.py --arms baseline,cross,task_norm,cross+task_norm   # + both plugins together
    python benchmarks/ablation.py --quick    # 1 seed x 2 steps per arm: the plumbing
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning import (  # the learning benchmark's helpers
    FULL,
    QUICK,
    RESULTS,
    ROOT,
    agentrl,
    evaluate,
    machine,
    prepare_model,
    read_metrics,
    require_plotting,
    trained_model,
)

CONFIG = ROOT / "examples" / "learning" / "calc_two_lengths.yaml"

ARMS: dict[str, dict[str, Any]] = {
    "baseline": {},
    "cross": {"sampler": {"name": "cross", "cross": {"stale_ratio": 0.25, "stale_step": 5}}},
    "task_norm": {"advantage": {"estimator": "grpo", "normalizers": ["task"]}},
    "cross+task_norm": {"sampler": {"name": "cross", "cross": {"stale_ratio": 0.25, "stale_step": 5}},
                        "advantage": {"estimator": "grpo", "normalizers": ["task"]}},
}
SIZES = {
    "full": {"seeds": 3, "total_steps": 15, "eval": True, "run_timeout_s": 1800.0},
    "quick": {"seeds": 1, "total_steps": 2, "eval": True, "run_timeout_s": 900.0},
}


def split_by_ops(base: dict[str, Any], split: str, size: int) -> dict[int, list[int]]:
    """Indices of ``split`` grouped by the number of operations of their problem."""
    from agentrl_plugin_example.env import CalcConfig, make_problem

    config = CalcConfig(**base.get("environments", {}).get("calc", {}))
    groups: dict[int, list[int]] = {}
    for index in range(size):
        groups.setdefault(len(make_problem(split, index, config).steps), []).append(index)
    return groups


def task_sets(base: dict[str, Any], train_limit: int, test_limit: int) -> tuple[list[dict], list[dict]]:
    env = base.get("environments", {}).get("calc", {})
    long_ops = int(env.get("max_ops", 3))
    train = split_by_ops(base, "train", int(env.get("train_size", 5000)))
    test = split_by_ops(base, "test", int(env.get("test_size", 200)))
    if long_ops < 2 or 1 not in train or long_ops not in train:
        raise SystemExit(f"{CONFIG}: environments.calc needs min_ops 1 and max_ops >= 2 for two task lengths")
    tasks = [
        {"env": "calc", "split": "train", "name": "calc-short", "indices": train[1][:train_limit]},
        {"env": "calc", "split": "train", "name": "calc-long", "indices": train[long_ops][:train_limit]},
    ]
    eval_tasks = [
        {"env": "calc", "split": "test", "name": "calc-short-test", "indices": test[1][:test_limit]},
        {"env": "calc", "split": "test", "name": "calc-long-test", "indices": test[long_ops][:test_limit]},
    ]
    return tasks, eval_tasks


def run_config(base: dict[str, Any], arm: str, seed: int, sft_model: str, run_dir: Path, tasks: list[dict],
               total_steps: int) -> dict[str, Any]:
    config = json.loads(json.dumps(base))  # a deep copy
    config["run"] = {**config.get("run", {}), "name": f"ablation-{arm}-{seed}", "output_dir": str(run_dir), "seed": seed}
    config["model"] = {**config.get("model", {}), "path": sft_model}
    config["tasks"] = tasks
    config["sampler"] = {"name": "current"}
    config["advantage"] = {"estimator": "grpo", "normalizers": []}
    for section, value in ARMS[arm].items():
        config[section] = value
    config["train"] = {**config.get("train", {}), "total_steps": total_steps, "checkpoint_every": 0,
                       "save_hf_model": True}
    return config


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def aggregate(runs: list[dict[str, Any]], task_names: list[str], eval_names: list[str]) -> dict[str, Any]:
    """Curves (reward per step, per task and overall) and final held-out success: mean and std over seeds."""
    steps = min(len(r["metrics"]) for r in runs)
    curves: dict[str, dict[str, list[float]]] = {}
    for key in ["reward", *[f"task/{t}/reward" for t in task_names]]:
        per_step = [[r["metrics"][i].get(key) for r in runs] for i in range(steps)]
        per_step = [[v for v in vals if v is not None] for vals in per_step]
        curves[key] = {"mean": [mean_std(v)[0] if v else None for v in per_step],
                       "std": [mean_std(v)[1] if v else None for v in per_step]}
    heldout = {}
    for name in eval_names:
        values = [r["heldout"][name] for r in runs if r.get("heldout")]
        if values:
            m, s = mean_std(values)
            heldout[name] = {"mean": m, "std": s, "per_seed": values}
    last = max(1, steps // 4)  # the last quarter of training, per seed, then over seeds
    late = {key: mean_std([statistics.fmean(v for v in (r["metrics"][i].get(key) for i in range(steps - last, steps))
                                            if v is not None) for r in runs])
            for key in ["reward", *[f"task/{t}/reward" for t in task_names]]}
    return {"steps": steps, "curves": curves, "heldout_success": heldout,
            "late_training_reward": {k: {"mean": m, "std": s} for k, (m, s) in late.items()},
            "train_seconds": mean_std([r["train_command_s"] for r in runs])}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = result["params"]["task_names"]
    fig, axes = plt.subplots(1, len(tasks) + 1, figsize=(5 * (len(tasks) + 1), 4.2), sharey=True)
    keys = ["reward", *[f"task/{t}/reward" for t in tasks]]
    titles = ["both tasks", *tasks]
    for ax, key, title in zip(axes, keys, titles):
        for arm, agg in result["arms"].items():
            mean = agg["curves"][key]["mean"]
            std = agg["curves"][key]["std"]
            xs = [i + 1 for i, m in enumerate(mean) if m is not None]
            m = [v for v in mean if v is not None]
            s = [std[i] for i, v in enumerate(mean) if v is not None]
            ax.plot(xs, m, label=arm)
            ax.fill_between(xs, [a - b for a, b in zip(m, s)], [a + b for a, b in zip(m, s)], alpha=0.15)
        ax.set_title(f"training reward: {title}")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"reward (mean ± std over {result['params']['seeds']} seeds)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 seed, 2 steps per arm: the plumbing")
    parser.add_argument("--work", default=None, help="work folder (default runs/ablation[_quick])")
    parser.add_argument("--out", default=None, help="result JSON (default benchmarks/results/ablation[_quick].json)")
    parser.add_argument("--sft-model", default=None,
                        help="warmed-up model (default: runs/learning_bench/sft_model if present, else SFT here)")
    parser.add_argument("--arms", default="baseline,cross,task_norm",
                        help="comma-separated subset of " + ", ".join(ARMS) + " (default: each plugin on and off)")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="training steps per run")
    args = parser.parse_args()
    require_plotting()
    size = dict(SIZES["quick" if args.quick else "full"])
    params = dict(QUICK if args.quick else FULL)
    size["seeds"] = args.seeds or size["seeds"]
    size["total_steps"] = args.steps or size["total_steps"]
    work = Path(args.work) if args.work else ROOT / "runs" / ("ablation_quick" if args.quick else "ablation")
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) if args.out else RESULTS / ("ablation_quick.json" if args.quick else "ablation.json")
    load_before = os.getloadavg()
    started = time.monotonic()

    base = yaml.safe_load(CONFIG.read_text())
    tasks, eval_tasks = task_sets(base, train_limit=2500, test_limit=8 if args.quick else 100)
    sft_model = args.sft_model
    prepared = None
    if sft_model is None:  # SFT on this config's problems (one and two additions)
        prepared = prepare_model(work, params, config=CONFIG)
        sft_model = prepared["model"]
    print(f"SFT model: {sft_model}", flush=True)

    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise SystemExit(f"unknown arm(s) {unknown}; choose from {', '.join(ARMS)}")
    task_names = [t["name"] for t in tasks]
    eval_names = [t["name"] for t in eval_tasks]
    results: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    for seed in range(size["seeds"]):  # seeds outermost: an interrupted run still has every arm at seed 0
        for arm in arms:
            name = f"{arm.replace('+', '_')}_s{seed}"
            run_dir = work / name
            config = run_config(base, arm, seed, sft_model, run_dir, tasks, size["total_steps"])
            config_path = work / f"{name}.yaml"
            config_path.write_text(yaml.safe_dump(config, sort_keys=False))
            r = agentrl(["train", str(config_path)], work / "logs" / f"train_{name}.log", timeout=size["run_timeout_s"])
            metrics = read_metrics(run_dir)
            record: dict[str, Any] = {"seed": seed, "train_command_s": r["seconds"], "steps": len(metrics),
                                      "metrics": [{k: v for k, v in m.items()
                                                   if k in ("step", "reward", "success", "trajectories", "time/step_s")
                                                   or k.startswith(("task/", "cross/stale_turn_share",
                                                                    "version_lag/mean"))}
                                                  for m in metrics]}
            if size["eval"]:
                model, _ = trained_model(run_dir)
                ev = evaluate(model, work / f"eval_{name}", params, config=config_path, tasks=eval_tasks)
                record["heldout"] = {t: s["success_mean"] for t, s in ev["tasks"].items()}
                record["eval_s"] = ev["seconds"]
            results[arm].append(record)
            late = statistics.fmean(m["reward"] for m in metrics[-max(1, len(metrics) // 4):]) if metrics else float("nan")
            print(f"{arm} seed {seed}: {len(metrics)} steps in {r['seconds']:.0f} s, late training reward {late:.3f}, "
                  f"held-out {record.get('heldout')}", flush=True)

    result = {
        "benchmark": "ablation",
        "quick": args.quick,
        "params": {**size, "arms": {a: ARMS[a] for a in arms}, "task_names": task_names, "eval_task_names": eval_names,
                   "tasks": {t["name"]: {"split": t["split"], "problems": len(t["indices"])} for t in tasks},
                   "eval_tasks": {t["name"]: {"split": t["split"], "problems": len(t["indices"])} for t in eval_tasks},
                   "config": str(CONFIG.relative_to(ROOT)), "sft_model": sft_model, "sft": prepared and {
                       k: v for k, v in prepared.items() if k != "model"}},
        "arms": {arm: aggregate(runs, task_names, eval_names) for arm, runs in results.items()},
        "runs": results,
        "machine": machine(load_before),
        "wall_s": round(time.monotonic() - started, 1),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out.with_suffix(".png"))
    print(f"\nwrote {out} and {out.with_suffix('.png')}")
    for arm, agg in result["arms"].items():
        late = agg["late_training_reward"]
        held = ", ".join(f"{t} {v['mean']:.3f}±{v['std']:.3f}" for t, v in agg["heldout_success"].items())
        print(f"  {arm:>16}: late training reward {late['reward']['mean']:.3f}±{late['reward']['std']:.3f}; held-out {held}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
