"""Throughput: asynchronous against synchronous training, same model, same cores, same workload.

    python benchmarks/throughput.py [--quick] [--steps N] [--rounds R] [--size tiny|small]

Runs ``agentrl train`` twice (or ``--rounds`` times each, alternating) on this machine's cores:

* ``async`` (the paper's design): engines and learner on disjoint cores
  (``engine.rollout_ratio`` 0.5: one core generates, one trains), rollout never stops;
* ``sync`` (the baseline): everything colocated on all cores; generate the whole batch,
  then train, then sync weights.

The workload is the recorded one of the real environments: ``benchmarks/workloads/
oracle_workload.json`` holds per-episode turn counts, per-step environment latencies and
observation lengths from oracle runs of db (SQLite), kg (embedded), webshop (bundled),
alfworld and os (Docker) (``benchmarks/workloads/record.py``). The ``replay`` environment
(``benchmarks/workloads/agentrl_bench_replay``, registered as a real plugin through an entry
point that this script makes visible to the run's processes) serves those episodes through
the real task workers and controller, so both modes face the same turns and latencies
whatever the (untrained) model writes. The model is a fresh tiny Qwen2 (``agentrl model
init``); ``max_new_tokens`` is the median oracle action length in this tokenizer's tokens.

Measured per mode over the steps after the first (``--skip``): trained tokens/s (all tokens
of the trained trajectories / wall time between step ends), the engine busy fraction
(forward time / wall time), the version-lag distribution of action tokens, and where each
resource idles: the learner (waiting for rollout, training, weight sync) and the engines
(forward, paused for weight sync, no request because every trajectory is in an environment
call or the learner is training, requests present but no forward pass). Sync mode's long
tail: the share of each generation phase during which at most a quarter of the batch's
trajectories were still running. A monitor polls the engines and the controller every 0.25 s
from outside the run; the CPU seconds of each run's process tree and the load average are
recorded because the machine is shared. Writes ``benchmarks/results/throughput.json``
(``throughput_quick.json`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import re
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

SETUP_LINE = re.compile(r"set-up done in [\d.]+ s \(controller (\S+), engines (\{.*\})\)")


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


def build_config(workload: dict[str, Any], args: argparse.Namespace, model: Path, max_new: int) -> dict[str, Any]:
    splits = sorted(workload["environments"])
    max_turns = max(ep["turns"] for env in workload["environments"].values() for ep in env["episodes"])
    batch_trajectories = args.batch_groups * args.n_samples
    return {
        "run": {"name": "throughput", "seed": 0},
        "model": {"path": str(model), "tool_parser": "qwen25"},
        "tasks": [{"env": "replay", "split": s} for s in splits],
        "environments": {"replay": {"workload": str(args.workload), "latency_scale": args.latency_scale}},
        "rollout": {
            "n_samples": args.n_samples, "batch_size": args.batch_groups,
            "concurrency": batch_trajectories,  # the paper: concurrency = one batch of trajectories
            "max_turns": max_turns, "max_total_len": args.max_total_len, "max_new_tokens": max_new,
            "temperature": 1.0, "warmup_factor": 1.7,
        },
        "engine": {"driver": "hf", "rollout_ratio": 0.5},
        "sampler": "current",
        "train": {"total_steps": args.steps, "device": "cpu", "checkpoint_every": 0,
                  "max_tokens_per_micro_batch": 8192},
        "logging": {"loggers": ["jsonl"], "sample_rollouts": 0},
    }


def run_mode(mode: str, config_path: Path, run_dir: Path, env: dict[str, str], log_path: Path) -> dict[str, Any]:
    """One ``agentrl train`` with a monitor attached; returns the metrics and the samples."""
    cmd = [sys.executable, "-m", "agentrl_core.cli.main", "train", str(config_path),
           "--set", f"train.mode={mode}", "--set", f"run.output_dir={run_dir}"]
    load_before = os.getloadavg()
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        monitor = RunMonitor(proc.pid).start()

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


def _hist(steps: list[dict[str, Any]]) -> dict[str, float]:
    total: dict[int, float] = {}
    for m in steps:
        for k, v in m.items():
            if k.startswith("version_lag/tokens/"):
                lag = int(k.rsplit("/", 1)[1])
                total[lag] = total.get(lag, 0.0) + v
    n = sum(total.values())
    return {str(k): round(v / n, 4) for k, v in sorted(total.items())} if n else {}


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
            tail_fwd += tail[-1][engine_key]["forward_s"] - tail[0][engine_key]["forward_s"]
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
        "engine_busy_fraction": {k: e["fractions"].get("forward", 0.0) for k, e in engines.items()},
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


def combine(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode: the round results and the ratio of the summed tokens over the summed wall time."""
    by_mode: dict[str, list[dict[str, Any]]] = {}
    for r in rounds:
        by_mode.setdefault(r["mode"], []).append(r["analysis"])
    summary = {}
    for mode, results in by_mode.items():
        tokens = sum(a["trained_tokens"] for a in results)
        wall = sum(a["wall_s"] for a in results)
        summary[mode] = {"trained_tokens_per_s": round(tokens / wall, 2) if wall else 0.0,
                         "per_round_tokens_per_s": [a["trained_tokens_per_s"] for a in results]}
    if "async" in summary and "sync" in summary and summary["sync"]["trained_tokens_per_s"]:
        summary["ratio_async_over_sync"] = round(
            summary["async"]["trained_tokens_per_s"] / summary["sync"]["trained_tokens_per_s"], 3)
        summary["ratio_decomposition"] = decompose(by_mode["async"], by_mode["sync"])
    return summary


def decompose(async_runs: list[dict[str, Any]], sync_runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The ratio as a sum: each stage of a sync step, per trained token, over async's wall time per token.

    ``ratio = sync_generation + sync_training + sync_other`` (each term: sync seconds per token of
    that stage / async seconds per token). The ratio reaches 2 only if the sync baseline spends
    at least twice async's time per token, e.g. a generation phase that idles on the long tail.
    """
    def per_token(runs: list[dict[str, Any]], key: str | None) -> float:
        tokens = sum(a["trained_tokens"] for a in runs)
        seconds = sum(a["wall_s"] if key is None else a["learner_seconds"][key] for a in runs)
        return seconds / tokens if tokens else 0.0

    async_s = per_token(async_runs, None)
    gen, train, total = per_token(sync_runs, "wait_rollout"), per_token(sync_runs, "train"), per_token(sync_runs, None)
    async_wait = sum(a["learner_seconds"]["wait_rollout"] for a in async_runs) / max(sum(a["wall_s"] for a in async_runs), 1e-9)

    def tokens_per_train_s(runs: list[dict[str, Any]]) -> float:
        return sum(a["trained_tokens"] for a in runs) / max(sum(a["learner_seconds"]["train"] for a in runs), 1e-9)

    return {
        "sync_generation": round(gen / async_s, 3) if async_s else None,
        "sync_training": round(train / async_s, 3) if async_s else None,
        "sync_other": round((total - gen - train) / async_s, 3) if async_s else None,
        "async_bottleneck": "learner" if async_wait < 0.05 else "rollout",
        "async_learner_wait_fraction": round(async_wait, 4),
        "learner_tokens_per_train_s_sync_all_cores": round(tokens_per_train_s(sync_runs), 1),
        "learner_tokens_per_train_s_async_learner_cores": round(tokens_per_train_s(async_runs), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer, smaller steps (a smoke run)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (default 10; quick 4)")
    parser.add_argument("--skip", type=int, default=1, help="leading steps left out of the measurement")
    parser.add_argument("--rounds", type=int, default=1, help="runs per mode, alternating async and sync")
    parser.add_argument("--modes", default="async,sync")
    parser.add_argument("--size", choices=["tiny", "small"], default="tiny")
    parser.add_argument("--n-samples", type=int, default=4)
    parser.add_argument("--batch-groups", type=int, default=None, help="groups per step (default 6; quick 3)")
    parser.add_argument("--max-total-len", type=int, default=8192)
    parser.add_argument("--latency-scale", type=float, default=1.0, help="multiply recorded latencies (1: as recorded)")
    parser.add_argument("--workload", type=Path, default=WORKLOADS / "oracle_workload.json")
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "throughput")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--reanalyse", action="store_true",
                        help="no runs: analyse the runs saved in --work-dir again (same other flags)")
    args = parser.parse_args()
    args.steps = args.steps or (4 if args.quick else 10)
    args.batch_groups = args.batch_groups or (3 if args.quick else 6)
    args.workload = args.workload.resolve()
    out = args.out or ROOT / "benchmarks" / "results" / ("throughput_quick.json" if args.quick else "throughput.json")
    if not args.workload.is_file():
        raise SystemExit(f"{args.workload} is missing; record it with python benchmarks/workloads/record.py")
    workload = json.loads(args.workload.read_text())
    work = args.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": make_replay_visible(work / "replay_plugin"), "PYTHONUNBUFFERED": "1",
           # a shared, overloaded machine delays the raylet's health checks; Ray's defaults (3 s period,
           # 5 misses) then declare the only node dead in the middle of a run
           "RAY_health_check_period_ms": "10000", "RAY_health_check_timeout_ms": "60000",
           "RAY_health_check_failure_threshold": "30"}
    model = work / f"model-{args.size}"
    if not (model / "config.json").exists():
        agentrl("model", "init", "--out", str(model), "--size", args.size, env=env)
    max_new = median_action_tokens(workload, model)
    config = build_config(workload, args, model, max_new)
    config_path = work / "config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    batch = args.batch_groups * args.n_samples
    rounds = []
    for r in range(args.rounds):
        for mode in (modes if r % 2 == 0 else modes[::-1]):
            run_dir = work / f"{mode}-{r}"
            if args.reanalyse:  # the runs' saved metrics and monitor samples, analysed again
                result = {**json.loads((work / f"{mode}-{r}.run.json").read_text()),
                          "samples": json.loads((work / f"{mode}-{r}.samples.json").read_text()),
                          "steps": [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]}
            else:
                for stale in ("metrics.jsonl", "trained_groups.jsonl"):
                    (run_dir / stale).unlink(missing_ok=True)
                result = run_mode(mode, config_path, run_dir, env, work / f"{mode}-{r}.log")
                (work / f"{mode}-{r}.samples.json").write_text(json.dumps(result["samples"]))
                (work / f"{mode}-{r}.run.json").write_text(json.dumps(
                    {k: result[k] for k in ("mode", "wall_s", "load_before", "load_after")}))
            rounds.append({"mode": mode, "round": r, "analysis": analyse(result, args.skip, batch)})
    summary = combine(rounds)
    report = {
        "benchmark": "throughput",
        "summary": summary,
        "targets": {"ratio_async_over_sync": 2.0, "async_engine_busy_fraction": 0.90},
        "rounds": rounds,
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
                       "max_new_tokens": max_new, "config": config},
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "cpus": os.cpu_count(),
                    "date": datetime.now(timezone.utc).isoformat(timespec="seconds")},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    for r in rounds:
        a = r["analysis"]
        print(f"{r['mode']}#{r['round']}: {a['trained_tokens_per_s']} tok/s, learner {a['learner_fractions']}, "
              f"engine busy {a['engine_busy_fraction']}, load {a['load1_during']}, cpu share {a['cpu_share_of_2_cores']}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
