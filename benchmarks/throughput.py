"""Throughput: asynchronous against synchronous training across regimes, against the bound.

    python benchmarks/throughput.py [--quick] [--points recorded,longtail:64,...] [--rounds R]

For every sweep point it runs ``agentrl train`` once per mode (``--rounds`` times, each round
rotating the order of the modes) on this machine's cores:

* ``async_interrupt`` (the paper's design with interruptible generation): engines and learner
  on disjoint cores (``engine.rollout_ratio`` 0.5: one core generates, one trains), rollout
  never stops, a weight sync pauses in-flight turns and continues them under the new weights
  (``rollout.partial_rollouts: true``);
* ``async_abort``: the same, but a weight sync aborts in-flight turns and they are generated
  again (``rollout.partial_rollouts: false``; the tokens thrown away are counted);
* ``sync`` (the baseline): everything colocated on all cores; generate the whole batch,
  then train, then sync weights.

The points: ``recorded`` is the recorded workload of the real environments
(``benchmarks/workloads/oracle_workload.json``: per-episode turn counts, per-step environment
latencies and observation lengths from oracle runs of db, kg, webshop, alfworld and os),
served by the ``replay`` environment (``benchmarks/workloads/agentrl_bench_replay``, a real
plugin made visible to the run's processes through a generated entry point) through the real
task workers and controller, with ``max_new_tokens`` = the median oracle action in this
tokenizer's tokens. ``longtail:<m>`` is the same episodes with the ``longtail`` agent loop:
every turn's length is drawn from a log-normal distribution of median ``m`` tokens
(``--tail-sigma`` 1: p99/p50 = 10.2; capped at ``--tail-cap`` medians) and the model writes
exactly that many (``ignore_eos``, no stop tokens). Raising ``m`` moves the balance from
training to generation; the default points sweep it up to the long-tail reasoning workload
(median 256).

Measured per run over the steps after the first (``--skip``): trained tokens/s, the learner's
phases, the engine's time (forward, paused, idle and why; a monitor polls the engines and
the controller every 0.25 s), the version-lag histogram, turns aborted, interrupted and
tokens discarded, the CPU seconds of each role and the load average (the machine is shared).
Per point (``benchmarks/workloads/regimes.py``): the ratio of each async mode over sync, the
analytic bound from the same point's measured phases, ``bound = S / max(A_L, A_G)`` (S: sync's
wall seconds per trained token, its generation phase including the wait for the slowest
trajectory; A_L: async's learner busy seconds per token; A_G: async's engine busy (forward + sampling) seconds
per token), and the generation share of a sync step. Writes
``benchmarks/results/throughput_sweep.json`` and ``.png`` (ratio and bound against the
generation share); ``throughput_sweep_quick.*`` with ``--quick`` (the db episodes only, two small points, 3 steps
of 2 groups x 2 samples: the plumbing, not the targets).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import re
import secrets
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ROOT / "benchmarks" / "workloads"
sys.path.insert(0, str(WORKLOADS))

from monitor import RunMonitor, engine_breakdown, learner_phases  # noqa: E402
from regimes import plot, summarize_point  # noqa: E402

GROUP_ID = re.compile(r"^\d+-replay-(\w+)-e\d+-(\d+)$")  # agentrl_core.train.task_stream's group ids
SETUP_LINE = re.compile(r"set-up done in [\d.]+ s \(controller (\S+), engines (\{[^}]*\})")


def make_replay_visible(dist_root: Path) -> str:
    """An installed-distribution record for the replay plugin; returns the PYTHONPATH to use.

    The run's processes (task workers, Ray actors) find plugins through entry points, so the
    plugin is given a ``.dist-info`` with an ``agentrl`` entry point instead of being installed.
    """
    info = dist_root / "agentrl_bench_replay-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: agentrl-bench-replay\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[agentrl]\nbench_replay = agentrl_bench_replay.plugin\n")
    return os.pathsep.join([str(dist_root), str(WORKLOADS), *filter(None, [os.environ.get("PYTHONPATH")])])


def agentrl(*args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run([sys.executable, "-m", "agentrl_core.cli.main", *args], check=True, cwd=ROOT, env=env)


def median_action_tokens(workload: dict[str, Any], tokenizer_dir: Path) -> int:
    """Median oracle action length, converted to tokens with this tokenizer's chars/token ratio."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    chars, tokens = 0, 0
    for env in workload["environments"].values():
        for text in env["text_sample"]:
            chars += len(text)
            tokens += len(tok(text)["input_ids"])
    ratio = chars / max(tokens, 1)
    lengths = [c for env in workload["environments"].values() for ep in env["episodes"] for c in ep["action_chars"]]
    return max(8, round(statistics.median(lengths) / ratio))


# the modes of every sweep point: name -> --set overrides of the run's config
MODES = {
    "async_interrupt": ["train.mode=async", "rollout.partial_rollouts=true"],
    "async_abort": ["train.mode=async", "rollout.partial_rollouts=false"],
    "sync": ["train.mode=sync"],
}


def parse_point(point: str) -> dict[str, Any]:
    """``recorded`` (today's workload) or ``longtail:<median tokens>`` (heavy-tailed action lengths)."""
    if point == "recorded":
        return {"name": point}
    kind, _, median = point.partition(":")
    if kind != "longtail" or not median.isdigit() or int(median) < 1:
        raise SystemExit(f"--points: {point!r} is neither 'recorded' nor 'longtail:<median tokens>'")
    return {"name": point, "median": int(median)}


def build_config(workload: dict[str, Any], args: argparse.Namespace, model: Path, max_new: int,
                 point: dict[str, Any]) -> dict[str, Any]:
    splits = sorted(workload["environments"])
    max_turns = max(ep["turns"] for env in workload["environments"].values() for ep in env["episodes"])
    batch_trajectories = args.batch_groups * args.n_samples
    rollout: dict[str, Any] = {
        "n_samples": args.n_samples, "batch_size": args.batch_groups,
        "concurrency": batch_trajectories,  # the paper: concurrency = one batch of trajectories
        "max_turns": max_turns, "max_total_len": args.max_total_len, "max_new_tokens": max_new,
        "temperature": 1.0, "warmup_factor": 1.7,
    }
    if "median" in point:  # every turn exactly as long as drawn (agentrl_bench_replay.longtail)
        cap = args.tail_cap * point["median"]
        rollout.update(max_new_tokens=cap, agent_loop="longtail",
                       agent_loop_options={"median": point["median"], "sigma": args.tail_sigma, "max_tokens": cap})
    return {
        "run": {"name": "throughput", "seed": 0},
        "model": {"path": str(model), "tool_parser": "qwen25"},
        "tasks": [{"env": "replay", "split": s} for s in splits],
        "environments": {"replay": {"workload": str(args.workload), "latency_scale": args.latency_scale}},
        "rollout": rollout,
        "engine": {"driver": "hf", "rollout_ratio": 0.5},
        "sampler": "current",
        "train": {"total_steps": args.steps, "device": "cpu", "checkpoint_every": 0,
                  "max_tokens_per_micro_batch": args.max_total_len},
        "logging": {"loggers": ["jsonl"], "sample_rollouts": 0},
    }


def run_mode(mode: str, config_path: Path, run_dir: Path, env: dict[str, str], log_path: Path) -> dict[str, Any]:
    """One ``agentrl train`` with a monitor attached; returns the metrics and the samples."""
    cmd = [sys.executable, "-m", "agentrl_core.cli.main", "train", str(config_path),
           *[x for o in MODES[mode] for x in ("--set", o)], "--set", f"run.output_dir={run_dir}"]
    load_before = os.getloadavg()
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        monitor = RunMonitor(proc.pid, token=env.get("AGENTRL_TOKEN")).start()

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                log.flush()
                print(f"[{mode}] {line}", end="", flush=True)
                found = SETUP_LINE.search(line)
                if found:
                    monitor.attach(found.group(1), ast.literal_eval(found.group(2)))

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        code = proc.wait()
        reader.join(timeout=10)
        monitor.stop()
    if code != 0:
        raise SystemExit(f"agentrl train ({mode}) exited with {code}; see {log_path}")
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {"mode": mode, "steps": steps, "samples": monitor.samples, "wall_s": time.time() - t0,
            "load_before": load_before, "load_after": os.getloadavg()}


def _lag_tokens(steps: list[dict[str, Any]]) -> dict[str, float]:
    """Action tokens per version lag (learner version - sampling version), summed over the steps."""
    total: dict[int, float] = {}
    for m in steps:
        for k, v in m.items():
            if k.startswith("version_lag/tokens/"):
                lag = int(k.rsplit("/", 1)[1])
                total[lag] = total.get(lag, 0.0) + v
    return {str(k): v for k, v in sorted(total.items())}


def _hist(steps: list[dict[str, Any]]) -> dict[str, float]:
    total = _lag_tokens(steps)
    n = sum(total.values())
    return {k: round(v / n, 4) for k, v in total.items()} if n else {}


def _sync_tail(samples: list[dict[str, Any]], phases: list[tuple[float, float, str]], batch: int,
               engine_key: str) -> dict[str, float]:
    """Sync mode: time of each generation phase with <= 25 % of the batch still running, and its busy share."""
    phase_s = tail_s = tail_fwd = 0.0
    for start, end, phase in phases:
        if phase != "wait_rollout":
            continue
        inside = [s for s in samples if start <= s["t"] <= end and "sessions" in s and engine_key in s]
        if len(inside) < 2:
            continue
        phase_s += end - start
        tail_from = next((s["t"] for s in inside if s["sessions"] <= batch / 4 and s["t"] > start + 1.0), end)
        tail_s += end - tail_from
        tail = [s for s in inside if s["t"] >= tail_from]
        if len(tail) >= 2:
            tail_fwd += sum(tail[-1][engine_key].get(k, 0.0) - tail[0][engine_key].get(k, 0.0)
                            for k in ("forward_s", "sampling_s"))
    return {"generation_phase_s": round(phase_s, 2), "tail_s": round(tail_s, 2),
            "tail_share_of_generation": round(tail_s / phase_s, 4) if phase_s else 0.0,
            "engine_busy_in_tail": round(tail_fwd / tail_s, 4) if tail_s else 0.0}


def _summarize_engine(breakdown: dict[str, Any]) -> dict[str, float]:
    """Fractions of an engine's time in the five top-level states (see monitor.engine_breakdown)."""
    out: dict[str, float] = {}
    for key, fraction in breakdown["fractions"].items():
        top = "/".join(key.split("/")[:2]) if key.startswith("no_requests/") else key
        out[top] = round(out.get(top, 0.0) + fraction, 4)
    return out


def analyse(result: dict[str, Any], skip: int, batch: int) -> dict[str, Any]:
    steps = result["steps"]
    if len(steps) <= skip:
        raise SystemExit(f"{result['mode']}: only {len(steps)} steps logged; need more than --skip={skip}")
    measured = steps[skip:]
    t_from, t_to = float(steps[skip - 1]["time"]) if skip else float(steps[0]["time"]) - steps[0]["time/step_s"], \
        float(steps[-1]["time"])
    wall = t_to - t_from
    tokens = sum(m.get("learner/num_tokens", 0.0) for m in measured)
    phases = learner_phases(steps)
    learner = {p: round(sum(m.get(f"time/{k}", 0.0) for m in measured), 2)
               for p, k in (("wait_rollout", "wait_rollout_s"), ("advantages", "advantages_s"), ("train", "train_s"),
                            ("weight_sync", "sync_s"))}
    samples = [s for s in result["samples"] if t_from <= s["t"] <= t_to]
    engine_keys = sorted({k for s in samples for k in s if k.startswith("engine/")})
    if not engine_keys:
        raise SystemExit(f"{result['mode']}: the monitor never polled an engine (did the run's 'set-up done' line, "
                         f"which names the engines, change? SETUP_LINE is {SETUP_LINE.pattern!r})")
    engines = {k: engine_breakdown(result["samples"], k, t_from, t_to, phases) for k in engine_keys}
    gen_tokens = {k: (samples[-1][k]["generated"] - samples[0][k]["generated"]) if samples else 0 for k in engine_keys}
    cpu_samples = [x["cpu_by_role"] for x in samples if "cpu_by_role" in x]
    cpu_roles = ({r: round(cpu_samples[-1].get(r, 0.0) - cpu_samples[0].get(r, 0.0), 1) for r in cpu_samples[-1]}
                 if len(cpu_samples) > 1 else {})
    cpu = sum(cpu_roles.values())
    out = {
        "steps_measured": len(measured),
        "wall_s": round(wall, 2),
        "trained_tokens": tokens,
        "trained_tokens_per_s": round(tokens / wall, 2) if wall > 0 else 0.0,
        "trajectories_per_s": round(sum(m.get("trajectories", 0.0) for m in measured) / wall, 3),
        "learner_seconds": learner,
        "learner_fractions": {k: round(v / wall, 4) for k, v in learner.items()},
        "learner_tokens_per_train_s": round(tokens / learner["train"], 1) if learner["train"] else 0.0,
        "engine_busy_fraction": {k: round(e["fractions"].get("forward", 0.0) + e["fractions"].get("sampling", 0.0), 4)
                                 for k, e in engines.items()},
        "engine_busy_fraction_pipeline_metric": round(
            sum(m.get("engine/current/busy_fraction", 0.0) * m["time/step_s"] for m in measured)
            / max(sum(m["time/step_s"] for m in measured), 1e-9), 4),
        "engines": engines,
        "engine_generated_tokens_per_forward_s": {
            k: round(gen_tokens[k] / e["seconds"]["forward"], 1) if e["seconds"].get("forward") else 0.0
            for k, e in engines.items()},
        "version_lag_token_distribution": _hist(measured),
        "version_lag_mean": round(statistics.fmean(m.get("version_lag/mean", 0.0) for m in measured), 3),
        "version_lag_max": max(m.get("version_lag/max", 0.0) for m in measured),
        "mean_trajectories_in_flight": round(statistics.fmean(s["sessions"] for s in samples if "sessions" in s), 2)
        if any("sessions" in s for s in samples) else None,
        "turns_per_trajectory": round(statistics.fmean(m.get("turns", 0.0) for m in measured), 2),
        "tokens_per_trajectory": round(sum(m.get("tokens", 0.0) for m in measured)
                                       / max(sum(m.get("trajectories", 0.0) for m in measured), 1), 1),
        "aborted_turns": sum(m.get("rollout/aborted_turns", 0.0) for m in measured),
        "discarded_tokens": sum(m.get("rollout/discarded_tokens", 0.0) for m in measured),
        "interrupted_turns": sum(m.get("rollout/interrupted_turns", 0.0) for m in measured),
        "mixed_version_tokens": sum(m.get("rollout/mixed_version_tokens", 0.0) for m in measured),
        "version_lag_tokens": _lag_tokens(measured),
        "engine_time_summary": {k: _summarize_engine(e) for k, e in engines.items()},
        "cpu_seconds": round(cpu, 1),
        "cpu_seconds_by_role": dict(sorted(cpu_roles.items(), key=lambda kv: -kv[1])),
        "cpu_share_of_2_cores": round(cpu / (wall * (os.cpu_count() or 1)), 3) if wall > 0 else 0.0,
        # the learner's efficiency apart from the load: tokens per CPU second it got, and cores it got while training
        "learner_tokens_per_cpu_s": round(tokens / cpu_roles["learner"], 1) if cpu_roles.get("learner") else None,
        "learner_cores_while_training": round(cpu_roles.get("learner", 0.0) / learner["train"], 3)
        if learner["train"] else None,
        "cpu_seconds_per_1k_tokens": round(1000 * cpu / tokens, 3) if tokens else None,
        "load1_during": round(statistics.fmean(s["load1"] for s in samples), 2) if samples else None,
        "load_before": [round(x, 2) for x in result["load_before"]],
        "load_after": [round(x, 2) for x in result["load_after"]],
    }
    if result["mode"] == "sync" and engine_keys:
        out["sync_long_tail"] = _sync_tail(result["samples"], [p for p in phases if t_from <= p[0] < t_to],
                                           batch, engine_keys[0])
    return out


def drawn_lengths(run_dir: Path, workload: dict[str, Any], point: dict[str, Any], args: argparse.Namespace,
                  max_turns: int) -> list[int]:
    """The lengths the longtail loop drew for the turns of the trained groups (before context clipping)."""
    from agentrl_bench_replay.longtail import LongTailConfig, draw_length

    config = LongTailConfig(median=point["median"], sigma=args.tail_sigma, max_tokens=args.tail_cap * point["median"])
    lengths = []
    path = run_dir / "trained_groups.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        for gid in json.loads(line)["groups"]:
            found = GROUP_ID.match(gid)
            if not found:
                continue
            turns = workload["environments"][found.group(1)]["episodes"][int(found.group(2))]["turns"]
            lengths += [draw_length(config, 0, gid, s, t) for s in range(args.n_samples)
                        for t in range(min(turns, max_turns))]
    return lengths


def length_stats(lengths: list[int]) -> dict[str, float]:
    if not lengths:
        return {}
    ordered = sorted(lengths)
    p50, p99 = ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"turns": len(ordered), "p50": p50, "p90": ordered[int(0.9 * len(ordered))], "p99": p99,
            "max": ordered[-1], "mean": round(statistics.fmean(ordered), 1), "p99_over_p50": round(p99 / p50, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run of the sweep's plumbing (a few minutes)")
    parser.add_argument("--points", default=None,
                        help="sweep points: recorded and/or longtail:<median tokens> "
                             "(default recorded,longtail:64,longtail:128,longtail:256; quick recorded,longtail:16)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (default 6; quick 3)")
    parser.add_argument("--skip", type=int, default=1, help="leading steps left out of the measurement")
    parser.add_argument("--rounds", type=int, default=1, help="runs per mode and point; each round rotates the modes")
    parser.add_argument("--size", choices=["tiny", "small"], default="tiny")
    parser.add_argument("--model", type=Path, default=None, help="an existing model folder (default: agentrl model init "
                                                                  "--size SIZE into the work dir)")
    parser.add_argument("--n-samples", type=int, default=None, help="samples per group (default 4; quick 2)")
    parser.add_argument("--batch-groups", type=int, default=None, help="groups per step (default 6; quick 2)")
    parser.add_argument("--max-total-len", type=int, default=8192)
    parser.add_argument("--tail-sigma", type=float, default=1.0, help="sigma of log(action length): p99/p50 = e^(2.33 sigma)")
    parser.add_argument("--tail-cap", type=int, default=16, help="longest action, in medians")
    parser.add_argument("--envs", default=None,
                        help="recorded environments to replay (default all five; quick db: short episodes)")
    parser.add_argument("--latency-scale", type=float, default=1.0, help="multiply recorded latencies (1: as recorded)")
    parser.add_argument("--workload", type=Path, default=WORKLOADS / "oracle_workload.json")
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "throughput")
    parser.add_argument("--out", type=Path, default=None, help="the JSON (the plot: same name, .png)")
    parser.add_argument("--reanalyse", action="store_true",
                        help="no runs: analyse the runs saved in --work-dir again (same other flags)")
    args = parser.parse_args()
    args.points = args.points or ("recorded,longtail:16" if args.quick else
                                  "recorded,longtail:64,longtail:128,longtail:256")
    args.steps = args.steps or (3 if args.quick else 6)
    args.n_samples = args.n_samples or (2 if args.quick else 4)
    args.batch_groups = args.batch_groups or (2 if args.quick else 6)
    args.workload = args.workload.resolve()
    out = args.out or ROOT / "benchmarks" / "results" / ("throughput_sweep_quick.json" if args.quick
                                                         else "throughput_sweep.json")
    points = [parse_point(p.strip()) for p in args.points.split(",") if p.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise SystemExit(f"--modes: unknown {unknown}; choose from {', '.join(MODES)}")
    if not args.workload.is_file():
        raise SystemExit(f"{args.workload} is missing; record it with python benchmarks/workloads/record.py")
    workload = json.loads(args.workload.read_text())
    args.envs = args.envs or ("db" if args.quick else ",".join(sorted(workload["environments"])))
    envs = [e.strip() for e in args.envs.split(",") if e.strip()]
    missing = sorted(set(envs) - set(workload["environments"]))
    if missing:
        raise SystemExit(f"--envs: {missing} not in the workload (it has {', '.join(sorted(workload['environments']))})")
    workload = {**workload, "environments": {e: workload["environments"][e] for e in envs}}
    max_turns = max(ep["turns"] for env in workload["environments"].values() for ep in env["episodes"])
    work = args.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": make_replay_visible(work / "replay_plugin"), "PYTHONUNBUFFERED": "1",
           # a shared, overloaded machine delays the raylet's health checks; Ray's defaults (3 s period,
           # 5 misses) then declare the only node dead in the middle of a run
           "RAY_health_check_period_ms": "10000", "RAY_health_check_timeout_ms": "60000",
           "RAY_health_check_failure_threshold": "30",
           # the run's token (every engine and controller route asks for it), known here so the monitor can poll
           "AGENTRL_TOKEN": os.environ.get("AGENTRL_TOKEN") or secrets.token_hex(16)}
    model = args.model.resolve() if args.model else work / f"model-{args.size}"
    if not args.model and not (model / "config.json").exists():
        agentrl("model", "init", "--out", str(model), "--size", args.size, env=env)
    max_new = median_action_tokens(workload, model)
    batch = args.batch_groups * args.n_samples
    report_points: dict[str, Any] = {}
    for point in points:
        point_dir = work / point["name"].replace(":", "-")
        point_dir.mkdir(parents=True, exist_ok=True)
        config = build_config(workload, args, model, max_new, point)
        config_path = point_dir / "config.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        rounds = []
        for r in range(args.rounds):
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:  # each round rotates the order
                run_dir = point_dir / f"{mode}-{r}"
                if args.reanalyse:  # the runs' saved metrics and monitor samples, analysed again
                    result = {**json.loads((point_dir / f"{mode}-{r}.run.json").read_text()),
                              "samples": json.loads((point_dir / f"{mode}-{r}.samples.json").read_text()),
                              "steps": [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()
                                        if x]}
                else:
                    for stale in ("metrics.jsonl", "trained_groups.jsonl"):
                        (run_dir / stale).unlink(missing_ok=True)
                    print(f"== {point['name']} {mode} round {r}", flush=True)
                    result = run_mode(mode, config_path, run_dir, env, point_dir / f"{mode}-{r}.log")
                    (point_dir / f"{mode}-{r}.samples.json").write_text(json.dumps(result["samples"]))
                    (point_dir / f"{mode}-{r}.run.json").write_text(json.dumps(
                        {k: result[k] for k in ("mode", "wall_s", "load_before", "load_after")}))
                rounds.append({"mode": mode, "round": r, "analysis": analyse(result, args.skip, batch)})
        by_mode: dict[str, list[dict[str, Any]]] = {}
        for r in rounds:
            by_mode.setdefault(r["mode"], []).append(r["analysis"])
        summary = summarize_point(by_mode)
        if "median" in point:
            summary["action_lengths_drawn"] = length_stats(
                [n for r in rounds for n in drawn_lengths(point_dir / f"{r['mode']}-{r['round']}", workload, point,
                                                          args, max_turns)])
        summary["load1_during"] = {f"{r['mode']}#{r['round']}": r["analysis"]["load1_during"] for r in rounds}
        report_points[point["name"]] = {**summary, "config": config, "rounds": rounds}
    report = {
        "benchmark": "throughput_sweep",
        "formula": "bound = S / max(A_L, A_G); S = sync wall s per trained token = generation (its long tail "
                   "included) + training + other; A_L = async learner busy s per token; A_G = async engine busy "
                   "(forward + sampling) s per token (benchmarks/workloads/regimes.py)",
        "targets": {"ratio_on_longtail": 2.0, "ratio_over_bound": 0.9, "engine_busy_where_generation_dominates": 0.9,
                    "discarded_tokens_with_interruption": 0},
        "checks_targets": not args.quick,  # --quick checks the plumbing, not the targets
        "points": report_points,
        "workload": {
            "source": str(args.workload.relative_to(ROOT)) if args.workload.is_relative_to(ROOT) else str(args.workload),
            "recorded": workload.get("machine"), "record_parameters": workload.get("parameters"),
            "environments": {
                name: {"episodes": len(e["episodes"]),
                       "turns_median": statistics.median(ep["turns"] for ep in e["episodes"]),
                       "turns_max": max(ep["turns"] for ep in e["episodes"]),
                       "step_latency_median_s": round(statistics.median(s for ep in e["episodes"] for s in ep["step_s"]), 5),
                       "start_latency_median_s": round(statistics.median(ep["start_s"] for ep in e["episodes"]), 5)}
                for name, e in workload["environments"].items()},
        },
        "parameters": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                       "recorded_max_new_tokens": max_new},
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "cpus": os.cpu_count(),
                    "date": datetime.now(timezone.utc).isoformat(timespec="seconds")},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    plot(report_points, out.with_suffix(".png"),
         f"async/sync and its bound, {args.size} model, {batch} trajectories/step, {os.cpu_count()} cores")
    for name, p in report_points.items():
        print(f"{name}: generation share {p.get('generation_share')}")
        for mode, m in p["modes"].items():
            print(f"  {mode}: {m['trained_tokens_per_s']} tok/s, ratio {m.get('ratio', '-')}, bound {m.get('bound', '-')}, "
                  f"engine busy {m['engine_busy_fraction']}, learner idle {m['learner_idle_fraction']}, "
                  f"discarded {m['discarded_tokens']}, lag {m['version_lag_histogram']}")
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
