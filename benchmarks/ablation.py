"""Ablation of the two algorithm plugins (issue 7): cross-policy sampling and task normalization.

The learning setup of ``benchmarks/learning.py`` (the tiny model warmed up by SFT on a mix of
right and wrong calc demonstrations, then ``agentrl train`` on 2 CPU cores), trained on two
tasks at once that differ in turn length and reward variance. The SFT has two stages: first
learning.py's one-addition demonstrations (where the model learns to copy numbers from the
context), then this config's mix of one and two additions. The tasks:

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

``--study task_scale`` (issue 31) is the ablation designed to need task normalization. The same
two tasks, but calc-short's rewards count a tenth (``tasks[].reward_scale: 0.1``, a task scored
on another scale) and the estimator is ``rloo``, which keeps reward scales (GRPO's division by
the group std would cancel the scale, and with it what this study tests). Arms ``rloo`` and
``rloo+task_norm``, and ``rloo_unscaled`` (no scale: the reference gain), 3 seeds, held-out success of the SFT model and of each trained model, so the
measure is each task's *gain* and the weakest task's gain. Expected direction, stated before
running: without task normalization calc-short's gradient is ten times smaller and it gains
little; with it both tasks enter with unit spread and calc-short gains as it does unscaled.

    python benchmarks/ablation.py --study task_scale           # ~45 min: two SFT stages, 9 runs, 10 evaluations
    python benchmarks/ablation.py --study task_scale --quick   # the plumbing

``--study cross_passk`` (issue 31) measures what cross-policy sampling is for: the diversity of
what the trained policy solves. RL sharpens a policy (pass@1 rises) and can lose problems the
SFT model solved in some of its tries; the turns a stale policy contributes keep those in the
training data. Arms ``baseline``, ``cross`` (stale pool <= 5 steps behind) and ``cross_frozen``
(the stale pool keeps the SFT model's weights all run: the most distinct pair of policies this
setup can make), 3 seeds; every model, the SFT model included, is evaluated with 8 repeats per
held-out problem, for pass@1..8 and for the problems each trained model lost and gained against
the SFT model (solved in at least one of 8 tries). The expected direction is in ``STUDIES``.

    python benchmarks/ablation.py --study cross_passk          # ~45 min (~35 with --sft-model)
    python benchmarks/ablation.py --study cross_passk --quick  # the plumbing (2 repeats)
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
from learning import CONFIG as ONE_OP_CONFIG  # one-addition calc: the first SFT stage
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
    write_result,
)

CONFIG = ROOT / "examples" / "learning" / "calc_two_lengths.yaml"

ARMS: dict[str, dict[str, Any]] = {
    "baseline": {},
    "cross": {"sampler": {"name": "cross", "cross": {"stale_ratio": 0.25, "stale_step": 5}}},
    "task_norm": {"advantage": {"estimator": "grpo", "normalizers": ["task"]}},
    "cross+task_norm": {"sampler": {"name": "cross", "cross": {"stale_ratio": 0.25, "stale_step": 5}},
                        "advantage": {"estimator": "grpo", "normalizers": ["task"]}},
    "rloo": {"advantage": {"estimator": "rloo", "normalizers": []}},
    "rloo+task_norm": {"advantage": {"estimator": "rloo", "normalizers": ["task"]}},
    # the reference of the task_scale study: rloo with every task's rewards unscaled
    "rloo_unscaled": {"advantage": {"estimator": "rloo", "normalizers": []}},
    # cross_passk: the stale pool never refreshed after the start, so it plays the SFT model all run
    "cross_frozen": {"sampler": {"name": "cross", "cross": {"stale_ratio": 0.25, "stale_step": 1000}}},
}
UNSCALED_ARMS = {"rloo_unscaled"}  # arms whose tasks ignore --reward-scale
# study -> default arms, reward scales per task, result file stem, and the expected direction
STUDIES: dict[str, dict[str, Any]] = {
    "plugins": {"arms": "baseline,cross,task_norm", "reward_scale": {}, "stem": "ablation", "expected": None},
    "task_scale": {"arms": "rloo,rloo+task_norm,rloo_unscaled", "reward_scale": {"calc-short": 0.1}, "stem": "ablation_task_scale",
                   "expected": "with task_norm, calc-short (rewards x 0.1) gains more held-out success, and so "
                               "does the weakest task; without it calc-short's gradient is ten times smaller. rloo_unscaled "
                               "(no scale, no task_norm) is the reference for calc-short's unhindered gain"},
    "cross_passk": {"arms": "baseline,cross,cross_frozen", "reward_scale": {}, "stem": "ablation_cross_passk",
                    "eval_repeats": 8,
                    "expected": "RL sharpens the policy: pass@1 rises, and problems the SFT model solved in some of its "
                                "8 tries are lost. With cross sampling a share of every trajectory's turns comes from a "
                                "stale policy (cross: <= 5 steps behind; cross_frozen: the SFT model all run), whose "
                                "solved set differs from the current one's, so the trained policy keeps more of them: "
                                "higher pass@8 and fewer lost problems than baseline, most visibly on calc-long, with "
                                "pass@1 about the same"},
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
    # with their reward_scale, if any (not in the unscaled reference arms)
    config["tasks"] = [{k: v for k, v in t.items() if k != "reward_scale"} for t in tasks] if arm in UNSCALED_ARMS else tasks
    config["sampler"] = {"name": "current"}
    config["advantage"] = {"estimator": "grpo", "normalizers": []}
    for section, value in ARMS[arm].items():
        config[section] = value
    config["train"] = {**config.get("train", {}), "total_steps": total_steps, "checkpoint_every": 0,
                       "save_hf_model": True}
    return config


def parse_scales(items: list[str]) -> dict[str, float]:
    scales = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            scales[name] = float(value)
        except ValueError:
            raise SystemExit(f"--reward-scale {item!r}: expected TASK=SCALE, e.g. calc-short=0.1") from None
        if scales[name] <= 0:
            raise SystemExit(f"--reward-scale {item!r}: a scale must be above 0")
    return scales


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def aggregate(runs: list[dict[str, Any]], task_names: list[str], eval_names: list[str],
              sft: dict[str, Any] | None = None) -> dict[str, Any]:
    """Curves (reward per step, per task and overall) and final held-out success: mean and std over seeds
    (with several evaluation repeats also pass@k, and the problems lost and gained against ``sft``)."""
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
            "train_seconds": mean_std([r["train_command_s"] for r in runs]), **gains(runs, eval_names),
            **pass_k(runs, sft, eval_names)}


def gains(runs: list[dict[str, Any]], eval_names: list[str]) -> dict[str, Any]:
    """Held-out gain over the SFT model per task, and the weakest task's gain, per seed then mean and std."""
    with_before = [r for r in runs if r.get("heldout") and r.get("before")]
    if not with_before:
        return {}
    per_task = {name: [r["heldout"][name] - r["before"][name] for r in with_before] for name in eval_names}
    weakest = [min(per_task[name][i] for name in eval_names) for i in range(len(with_before))]
    return {"heldout_gain": {name: spread(v) for name, v in per_task.items()}, "weakest_gain": spread(weakest)}


def solved_sets(eval_dir: Path) -> dict[str, list]:
    """Per held-out task, the problems solved in at least one of the evaluation's repeats."""
    solved: dict[str, set] = {}
    for line in (eval_dir / "trajectories.jsonl").read_text().splitlines():
        if line.strip():
            episode = json.loads(line)
            tried = solved.setdefault(episode["task"], set())
            if episode["reward"] >= 1.0:
                tried.add(episode["index"])
    return {task: sorted(indices) for task, indices in solved.items()}


def lost_gained(before: list, after: list) -> tuple[int, int]:
    """Problems solved ``before`` and not ``after``, and the other way round."""
    return len(set(before) - set(after)), len(set(after) - set(before))


def spread(values: list[float]) -> dict[str, Any]:
    """Mean, std and the values themselves (per seed)."""
    mean, std = mean_std(values)
    return {"mean": mean, "std": std, "per_seed": values}


def resample_floor(first: dict[str, list], second: dict[str, list], pass_at_k: dict[str, Any]) -> dict[str, Any]:
    """Problems one evaluation of a model solved and another did not, both ways, and the second's pass@k."""
    floor = {}
    for task in first:
        lost, gained = lost_gained(first[task], second.get(task, []))
        floor[task] = {"lost": lost, "gained": gained, "pass_at_k": pass_at_k.get(task)}
    return floor


def pass_k(runs: list[dict[str, Any]], sft: dict[str, Any] | None, eval_names: list[str]) -> dict[str, Any]:
    """pass@k per task and k, and the problems lost and gained against the SFT model: mean and std over seeds."""
    with_k = [r for r in runs if r.get("pass_at_k")]
    if not with_k:
        return {}
    out: dict[str, Any] = {"pass_at_k": {name: {k: spread([r["pass_at_k"][name][k] for r in with_k])
                                                for k in with_k[0]["pass_at_k"][name]} for name in eval_names}}
    if sft and sft.get("solved"):
        out["problems_lost"], out["problems_gained"] = {}, {}
        for name in eval_names:
            counts = [lost_gained(sft["solved"].get(name, []), r["solved"].get(name, [])) for r in with_k]
            out["problems_lost"][name] = spread([lost for lost, _ in counts])
            out["problems_gained"][name] = spread([gained for _, gained in counts])
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = result["params"]["task_names"]
    with_gain = any("heldout_gain" in agg for agg in result["arms"].values())
    k_tasks = list(next((agg["pass_at_k"] for agg in result["arms"].values() if "pass_at_k" in agg), {}))
    panels = len(tasks) + 1 + with_gain + len(k_tasks)
    cols = min(panels, 4)
    rows = -(-panels // cols)
    fig, grid = plt.subplots(rows, cols, figsize=(5 * cols, 4.2 * rows), squeeze=False)
    axes = list(grid.flat)
    for ax in axes[panels:]:
        ax.set_visible(False)
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
    for ax in axes[1:len(keys)]:
        ax.sharey(axes[0])
    axes[0].set_ylabel(f"reward (mean ± std over {result['params']['seeds']} seeds)")
    axes[0].legend()
    for ax, task in zip(axes[len(keys):], k_tasks):  # pass@k of each trained policy, and of the SFT model
        for arm, agg in result["arms"].items():
            by_k = agg["pass_at_k"][task]
            ks = [int(k) for k in by_k]
            ax.errorbar(ks, [v["mean"] for v in by_k.values()], yerr=[v["std"] for v in by_k.values()], marker="o",
                        capsize=3, label=arm)
        sft = (result.get("sft_pass_at_k") or {}).get(task)
        if sft:
            ax.plot([int(k) for k in sft], list(sft.values()), "k--", marker="x", label="SFT model")
        again = ((result.get("sft_resample") or {}).get(task) or {}).get("pass_at_k")
        if again:
            ax.plot([int(k) for k in again], list(again.values()), ":", color="gray", marker="x",
                    label="SFT model, sampled again")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("k (held-out tries per problem)")
        ax.set_ylabel("pass@k (mean ± std over seeds)")
        ax.set_title(f"pass@k: {task}")
        ax.grid(alpha=0.3)
        ax.legend()
    if with_gain:
        ax = axes[len(keys) + len(k_tasks)]
        arms = [a for a, agg in result["arms"].items() if "heldout_gain" in agg]
        names = list(result["arms"][arms[0]]["heldout_gain"])
        width = 0.8 / len(arms)
        for k, arm in enumerate(arms):
            g = result["arms"][arm]["heldout_gain"]
            xs = [i + (k - (len(arms) - 1) / 2) * width for i in range(len(names))]
            ax.bar(xs, [g[n]["mean"] for n in names], width, yerr=[g[n]["std"] for n in names], capsize=3, label=arm)
        scales = result["params"].get("reward_scale") or {}
        ax.set_xticks(range(len(names)), [n + (f"\n(rewards x {scales[n.removesuffix('-test')]})"
                                                if n.removesuffix("-test") in scales else "") for n in names])
        ax.axhline(0, color="black", lw=0.8)
        ax.set_ylabel("held-out success gain over the SFT model")
        ax.set_title("held-out gain (mean ± std over seeds)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 seed, 2 steps per arm: the plumbing")
    parser.add_argument("--work", default=None, help="work folder (default runs/ablation[_quick])")
    parser.add_argument("--out", default=None, help="result JSON (default benchmarks/results/ablation[_quick].json)")
    parser.add_argument("--sft-model", default=None,
                        help="warmed-up model (default: SFT here, in two stages: one-addition problems, then this config's mix)")
    parser.add_argument("--study", choices=list(STUDIES), default="plugins",
                        help="plugins: each algorithm plugin on and off (GRPO); task_scale: tasks on different "
                             "reward scales with rloo, with and without task normalization")
    parser.add_argument("--arms", default=None,
                        help="comma-separated subset of " + ", ".join(ARMS) + " (default: the study's)")
    parser.add_argument("--reward-scale", action="append", default=None, metavar="TASK=SCALE",
                        help="tasks[].reward_scale of a task (calc-short or calc-long); default: the study's")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="training steps per run")
    parser.add_argument("--eval-repeats", type=int, default=None,
                        help="held-out repeats per problem, for pass@k (default: the study's, else 1; --quick: 2 at most)")
    args = parser.parse_args()
    require_plotting()
    size = dict(SIZES["quick" if args.quick else "full"])
    params = dict(QUICK if args.quick else FULL)
    size["seeds"] = args.seeds or size["seeds"]
    size["total_steps"] = args.steps or size["total_steps"]
    study = STUDIES[args.study]
    params["eval_repeats"] = args.eval_repeats or (min(2, study.get("eval_repeats", 1)) if args.quick
                                                   else study.get("eval_repeats", 1))
    stem = study["stem"] + ("_quick" if args.quick else "")
    work = Path(args.work) if args.work else ROOT / "runs" / stem
    out = Path(args.out) if args.out else RESULTS / f"{stem}.json"
    work.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    started = time.monotonic()

    base = yaml.safe_load(CONFIG.read_text())
    tasks, eval_tasks = task_sets(base, train_limit=2500, test_limit=8 if args.quick else 100)
    scales = parse_scales(args.reward_scale) if args.reward_scale is not None else dict(study["reward_scale"])
    unknown_tasks = sorted(set(scales) - {t["name"] for t in tasks})
    if unknown_tasks:
        raise SystemExit(f"--reward-scale names {unknown_tasks}; the tasks are {[t['name'] for t in tasks]}")
    tasks = [{**t, "reward_scale": scales[t["name"]]} if t["name"] in scales else t for t in tasks]
    sft_model = args.sft_model
    prepared = None
    if sft_model is None:
        # Two SFT stages. The tiny model first learns to copy numbers from the context on
        # one-addition problems (learning.py's SFT: nll ~0.065, held-out 0.45-0.55 in every run
        # so far); SFT on a mix of one and two additions from a fresh model often never forms
        # that copy (2026-12-05: nll stuck at 0.14-0.16 over three tries, held-out 0.06).
        stage1 = prepare_model(work / "sft_one_op", params, config=ONE_OP_CONFIG)
        print(f"stage 1 (one addition) SFT model: {stage1['model']}, final nll {stage1['sft_final_nll']:.3f}", flush=True)
        prepared = prepare_model(work, params, config=CONFIG, model=Path(stage1["model"]))  # then this config's mix
        prepared["stage1"] = {k: v for k, v in stage1.items() if k != "model"}
        sft_model = prepared["model"]
    print(f"SFT model: {sft_model}", flush=True)

    before = sft_k = None
    if size["eval"]:  # the SFT model's held-out success: each trained model's gain is measured from it
        ev = evaluate(sft_model, work / "eval_sft", params, config=CONFIG, tasks=eval_tasks)
        before = {t: s["success_mean"] for t, s in ev["tasks"].items()}
        if params["eval_repeats"] > 1:
            sft_k = {"pass_at_k": {t: s["pass_at_k"] for t, s in ev["tasks"].items()},
                     "solved": solved_sets(work / "eval_sft")}
            # the noise floor of "problems lost and gained": the SFT model against itself, sampled anew
            again = evaluate(sft_model, work / "eval_sft_again", params, config=CONFIG, tasks=eval_tasks, seed=1)
            sft_k["resample"] = resample_floor(sft_k["solved"], solved_sets(work / "eval_sft_again"),
                                               {t: s["pass_at_k"] for t, s in again["tasks"].items()})
            print(f"SFT model against itself (another sampling seed): {sft_k['resample']}", flush=True)
        print(f"SFT model held-out: {before}" + (f", pass@k {sft_k['pass_at_k']}" if sft_k else ""), flush=True)

    arms = [a for a in (args.arms or study["arms"]).split(",") if a]
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
                record["before"] = before
                record["eval_s"] = ev["seconds"]
                if params["eval_repeats"] > 1:
                    record["pass_at_k"] = {t: s["pass_at_k"] for t, s in ev["tasks"].items()}
                    record["solved"] = solved_sets(work / f"eval_{name}")
            results[arm].append(record)
            late = statistics.fmean(m["reward"] for m in metrics[-max(1, len(metrics) // 4):]) if metrics else float("nan")
            print(f"{arm} seed {seed}: {len(metrics)} steps in {r['seconds']:.0f} s, late training reward {late:.3f}, "
                  f"held-out {record.get('heldout')}" + (f", pass@k {record['pass_at_k']}" if "pass_at_k" in record else ""),
                  flush=True)

    result = {
        "benchmark": "ablation",
        "study": args.study,
        "expected": study["expected"],
        "quick": args.quick,
        "params": {**size, "eval_repeats": params["eval_repeats"], "arms": {a: ARMS[a] for a in arms}, "reward_scale": scales, "task_names": task_names, "eval_task_names": eval_names,
                   "tasks": {t["name"]: {"split": t["split"], "problems": len(t["indices"])} for t in tasks},
                   "eval_tasks": {t["name"]: {"split": t["split"], "problems": len(t["indices"])} for t in eval_tasks},
                   "config": str(CONFIG.relative_to(ROOT)), "sft_model": sft_model, "sft": prepared and {
                       k: v for k, v in prepared.items() if k != "model"}},
        "heldout_before": before,
        "sft_pass_at_k": sft_k and sft_k["pass_at_k"],
        "sft_solved": sft_k and {t: len(v) for t, v in sft_k["solved"].items()},
        "sft_resample": sft_k and sft_k["resample"],
        "arms": {arm: aggregate(runs, task_names, eval_names, sft_k) for arm, runs in results.items()},
        "runs": results,
        "machine": machine(load_before),
        "wall_s": round(time.monotonic() - started, 1),
    }
    print(f"\nwrote {write_result(result, out, plot)}")
    for arm, agg in result["arms"].items():
        late = agg["late_training_reward"]
        held = ", ".join(f"{t} {v['mean']:.3f}±{v['std']:.3f}" for t, v in agg["heldout_success"].items())
        gain = ", ".join(f"{t} {v['mean']:+.3f}±{v['std']:.3f}" for t, v in agg.get("heldout_gain", {}).items())
        weakest = agg.get("weakest_gain")
        print(f"  {arm:>16}: late training reward {late['reward']['mean']:.3f}±{late['reward']['std']:.3f}; held-out {held}"
              + (f"; gain {gain}; weakest {weakest['mean']:+.3f}±{weakest['std']:.3f}" if weakest else ""))
        for task, by_k in agg.get("pass_at_k", {}).items():
            lost, gained = agg.get("problems_lost", {}).get(task), agg.get("problems_gained", {}).get(task)
            print(f"  {'':>16}  {task}: " + ", ".join(f"pass@{k} {v['mean']:.3f}±{v['std']:.3f}" for k, v in by_k.items())
                  + (f"; problems lost {lost['mean']:.1f}±{lost['std']:.1f}, gained {gained['mean']:.1f}±{gained['std']:.1f}"
                     if lost else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
