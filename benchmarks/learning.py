"""Learning benchmark (issue 6): does ``agentrl train`` really learn, and can this benchmark fail?

Everything runs through the real ``agentrl`` command line, on this machine's CPU cores:

1. ``agentrl model init --size tiny``: a 1.3M-parameter Qwen2 model with its own tokenizer;
2. ``agentrl demos``: oracle demonstrations of the example environment ``calc``, with
   ``--error-rate`` so that a good share of them are wrong (operands perturbed on purpose);
3. ``agentrl sft``: a supervised warm-up on that mix, so the model imitates the mistakes too
   and succeeds only sometimes;
4. ``agentrl eval`` on the held-out ``test`` split: success before RL;
5. ``agentrl train`` (Ray, embedded controller and workers, hf engine, FSDP2 learner, async
   mode on disjoint cores) for at most ``--budget-s`` seconds (600: the issue's 10 minutes);
6. ``agentrl eval`` again: success after RL;
7. the same training run with ``advantage.estimator: grpo_negated`` (GRPO with the sign
   flipped): the control, which must not improve.

Targets (issue 6): held-out success improves by at least 25 percentage points within the
budget; the control does not improve (its change stays below +5 points, the noise level of
a 200-episode evaluation). The budget is enforced: training checkpoints a Hugging Face model
every few steps, and a run still going at the deadline is interrupted (SIGINT) and its last
checkpoint is evaluated; the steps it reached are reported.

    python benchmarks/learning.py            # ~35-45 min on 2 idle cores (set-up, 2 x 10 min training, evals)
    python benchmarks/learning.py --quick    # a few minutes: the plumbing, no targets checked

Writes ``benchmarks/results/learning.json`` (or ``learning_quick.json``) and a PNG plot
beside it: per-step training reward of both runs, and held-out success before and after.
The configuration is ``examples/learning/calc.yaml``; this script only sets paths and sizes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "learning" / "calc.yaml"
RESULTS = ROOT / "benchmarks" / "results"

# Sizes of the full benchmark and of --quick (the plumbing only).
FULL = {
    "demos": 5000, "error_rate": 0.3, "sft_epochs": 2, "eval_limit": 200, "eval_repeats": 1,
    "total_steps": 200, "checkpoint_every": 5, "budget_s": 600.0, "n_samples": 8, "batch_size": 8,
}
QUICK = {
    "demos": 64, "error_rate": 0.3, "sft_epochs": 1, "eval_limit": 16, "eval_repeats": 1,
    "total_steps": 2, "checkpoint_every": 1, "budget_s": 600.0, "n_samples": 4, "batch_size": 2,
}
TARGET_IMPROVEMENT = 0.25  # issue 6: at least +25 percentage points of held-out success
CONTROL_MAX_CHANGE = 0.05  # the sign-flipped control must not improve beyond noise


# the LoRA arm (core/docs/lora.md): adapters on every linear layer; LoRA takes a larger learning
# rate than full fine-tuning (the config's 2e-4): on calc 5e-4 and 1e-3 learn, 2e-3 collapses
LORA_ARM: dict[str, Any] = {"model__lora__enabled": True, "model__lora__rank": 16, "model__lora__alpha": 32.0,
                            "optim__lr": 5.0e-4}


def lora_arm(arm: str) -> tuple[str, dict[str, Any] | None]:
    """``grpo`` -> (grpo, None); ``grpo_lora`` -> (grpo, LORA_ARM); ``grpo_lora@1e-3`` -> LORA_ARM at lr 1e-3."""
    name, _, lr = arm.partition("@")
    if not name.endswith("_lora"):
        if lr:
            raise SystemExit(f"arm {arm!r}: a learning rate (@LR) is only for LoRA arms (<estimator>_lora@LR)")
        return name, None
    try:
        return name.removesuffix("_lora"), {**LORA_ARM, **({"optim__lr": float(lr)} if lr else {})}
    except ValueError:
        raise SystemExit(f"arm {arm!r}: {lr!r} is not a learning rate (e.g. grpo_lora@1e-3)") from None


def subprocess_env() -> dict[str, str]:
    # One intra-op thread per process: on 2 shared cores, torch's default (one thread per
    # core) makes SFT and evaluation 5-10x slower under load. Training pins its own threads.
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _interrupt(proc: subprocess.Popen, *, grace: float) -> None:
    """SIGINT to ``proc``; SIGKILL to its process group if it has not exited ``grace`` s later."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit(143) here (in the main thread), so cleanup code runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def agentrl(args: list[str], log_path: Path, *, timeout: float | None = None, interrupt_after: float | None = None) -> dict[str, Any]:
    """Run ``agentrl ARGS`` with its output in ``log_path``; returns rc, seconds and whether it was interrupted.

    ``interrupt_after``: send SIGINT when the command is still running after this many
    seconds (``agentrl train`` then shuts its processes down), and SIGKILL its process
    group if it has not exited 120 s later.

    The command runs in a session of its own (a budget's SIGKILL reaches all it started), so
    a Ctrl-C or SIGTERM meant for the benchmark would not reach it: both are passed on as
    SIGINT (the same shutdown), with SIGKILL to its group if it has not exited 60 s later,
    and the benchmark then stops.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "agentrl_core.cli.main", *args]
    print(f"+ agentrl {' '.join(args)}", flush=True)
    t0 = time.monotonic()
    interrupted = False
    with open(log_path, "w") as log, _terminate_as_exit():
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=subprocess_env(),
                                start_new_session=True)
        try:
            proc.wait(timeout=interrupt_after if interrupt_after is not None else timeout)
        except subprocess.TimeoutExpired:
            if interrupt_after is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise RuntimeError(f"agentrl {args[0]} did not finish within {timeout} s; see {log_path}") from None
            interrupted = True
            print(f"  budget reached after {time.monotonic() - t0:.0f} s: interrupting", flush=True)
            _interrupt(proc, grace=120)
        except BaseException:  # Ctrl-C, or SIGTERM via _terminate_as_exit: stop the command too
            print(f"  stopping: interrupting agentrl {args[0]}", flush=True)
            _interrupt(proc, grace=60)
            raise
    seconds = time.monotonic() - t0
    if proc.returncode != 0 and not interrupted:
        tail = log_path.read_text()[-3000:]
        raise RuntimeError(f"agentrl {args[0]} failed with exit code {proc.returncode} (log {log_path}):\n{tail}")
    return {"rc": proc.returncode, "seconds": round(seconds, 1), "interrupted": interrupted}


def sets(**values: Any) -> list[str]:
    out = []
    for key, value in values.items():
        out += ["--set", f"{key.replace('__', '.')}={json.dumps(value) if not isinstance(value, str) else value}"]
    return out


def prepare_model(work: Path, params: dict[str, Any], *, config: Path = CONFIG, seed: int = 0,
                  model: Path | None = None) -> dict[str, Any]:
    """Model init (unless ``model`` is given), demonstrations and SFT; returns the SFT model, stats, timings."""
    timings: dict[str, float] = {}
    if model is None:
        model = work / "model"
        timings["model_init_s"] = agentrl(["model", "init", "--out", str(model), "--size", "tiny", "--seed", str(seed)],
                                          work / "logs" / "model_init.log")["seconds"]
    demos = work / "demos.jsonl"
    r = agentrl(["demos", "--env", "calc", "--split", "train", "--limit", str(params["demos"]), "--error-rate",
                 str(params["error_rate"]), "--seed", str(seed), "--config", str(config), "--out", str(demos)],
                work / "logs" / "demos.log")
    timings["demos_s"] = r["seconds"]
    records = [json.loads(line) for line in demos.read_text().splitlines() if line.strip()]
    demo_success = sum(1 for d in records if d["reward"] >= 1.0) / max(len(records), 1)
    sft_model = work / "sft_model"
    timings["sft_s"] = agentrl(["sft", str(config), *sets(model__path=str(model), run__output_dir=str(work / "sft"),
                                                          sft__data=[str(demos)], sft__output_dir=str(sft_model),
                                                          sft__epochs=params["sft_epochs"], run__seed=seed)],
                               work / "logs" / "sft.log")["seconds"]
    sft_metrics = [json.loads(line) for line in (work / "sft" / "sft_metrics.jsonl").read_text().splitlines() if line.strip()]
    return {"model": str(sft_model), "demos": len(records), "demo_success": demo_success,
            "sft_steps": len(sft_metrics), "sft_final_nll": sft_metrics[-1]["nll"] if sft_metrics else None,
            "timings": timings}


def evaluate(model: str, out: Path, params: dict[str, Any], *, config: Path = CONFIG,
             tasks: list[dict[str, Any]] | None = None, seed: int | None = None) -> dict[str, Any]:
    """``agentrl eval`` of ``model`` on the held-out tasks; returns {task: summary} and the seconds.
    ``seed``: the sampling seed (``run.seed``; default the config's)."""
    tasks = tasks or [{"env": "calc", "split": "test", "limit": params["eval_limit"]}]
    seeded = {"run__seed": seed} if seed is not None else {}
    r = agentrl(["eval", str(config), "--out", str(out), *sets(model__path=model, eval__tasks=tasks,
                                                                 eval__repeats=params["eval_repeats"], **seeded)],
                out.parent / "logs" / f"eval_{out.name}.log")
    summary = json.loads((out / "summary.json").read_text())["models"]["default"]
    return {"tasks": summary, "seconds": r["seconds"]}


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    by_step: dict[int, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            if "reward" in record:  # training steps (validation lines carry val/* only)
                by_step[int(record["step"])] = record
    return [by_step[s] for s in sorted(by_step)]


def trained_model(run_dir: Path) -> tuple[str, int]:
    """The final model of a finished run, else the newest checkpoint's; with its step."""
    final = run_dir / "final_model"
    summary = run_dir / "summary.json"
    if (final / "config.json").exists() and summary.exists():
        return str(final), int(json.loads(summary.read_text())["steps"])
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*/hf/config.json"))
    if not checkpoints:
        raise RuntimeError(f"{run_dir}: training produced no model (no final_model, no checkpoint with hf/)")
    hf = checkpoints[-1].parent
    return str(hf), int(hf.parent.name.removeprefix("step_"))


def train(sft_model: str, run_dir: Path, params: dict[str, Any], *, config: Path = CONFIG,
          extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One ``agentrl train`` run within the time budget; returns its curve, model and timings."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    overrides = {"model__path": sft_model, "run__output_dir": str(run_dir), "train__total_steps": params["total_steps"],
                 "rollout__n_samples": params["n_samples"], "rollout__batch_size": params["batch_size"],
                 "train__checkpoint_every": params["checkpoint_every"], "train__keep_checkpoints": 2,
                 "train__save_hf_model": True, "logging__progress": True, **(extra or {})}
    r = agentrl(["train", str(config), *sets(**overrides)], run_dir.parent / "logs" / f"train_{run_dir.name}.log",
                interrupt_after=params["budget_s"])
    model, step = trained_model(run_dir)
    metrics = read_metrics(run_dir)
    first_step_at = metrics[0]["time"] - metrics[0]["time/step_s"] if metrics else None
    loop_s = (metrics[-1]["time"] - first_step_at) if metrics else 0.0
    return {
        "model": model, "model_step": step, "steps": len(metrics), "interrupted": r["interrupted"],
        "train_command_s": r["seconds"], "train_loop_s": round(loop_s, 1),
        "curve": [{"step": m["step"], "reward": m["reward"], "success": m["success"],
                   "seconds": round(m["time"] - first_step_at, 1), "trajectories": m.get("trajectories"),
                   "version_lag": m.get("version_lag/mean"), "step_s": m.get("time/step_s")} for m in metrics],
    }


def repeat_summary(task: dict[str, Any]) -> dict[str, Any]:
    """One task of an ``agentrl eval`` summary.json as the benchmarks report it: success as the mean
    and standard deviation over the repeats (each repeat's success rate), with the episode counts."""
    per_repeat = task.get("per_repeat_success") or [task["success_mean"]]
    return {"success": statistics.fmean(per_repeat),
            "spread": statistics.stdev(per_repeat) if len(per_repeat) > 1 else 0.0,
            "per_repeat": per_repeat, "episodes": task["episodes"], "infra_failures": task["infra_failures"],
            "turns_mean": task.get("turns_mean"), "statuses": task.get("statuses")}


def success_of(evaluation: dict[str, Any]) -> float:
    summaries = list(evaluation["tasks"].values())
    episodes = sum(s["episodes"] - s["infra_failures"] for s in summaries)
    return sum(s["success_mean"] * (s["episodes"] - s["infra_failures"]) for s in summaries) / max(episodes, 1)


def machine(load_before: tuple[float, ...]) -> dict[str, Any]:
    return {"platform": platform.platform(), "python": sys.version.split()[0], "cpu_count": os.cpu_count(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "loadavg_before": list(load_before), "loadavg_after": list(os.getloadavg())}


def write_result(result: dict[str, Any], out: Path, plot: Callable[[dict[str, Any], Path], None] | None = None) -> str:
    """Write a benchmark's ``result`` as JSON to ``out`` and, given ``plot``, its PNG beside it; returns
    what was written ("OUT" or "OUT and PNG"), for the closing line."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    if plot is None:
        return str(out)
    plot(result, out.with_suffix(".png"))
    return f"{out} and {out.with_suffix('.png')}"


def warm_up(work: Path, params: dict[str, Any], *, seed: int, model: Path | None, config: Path, demos: list[str],
            describe_sft: Callable[[Path, Path], dict[str, Any]]) -> dict[str, Any]:
    """An environment's warm-up (issue 31): ``agentrl model init`` unless ``model`` is given, ``agentrl demos``
    with the arguments ``demos`` (``--env``, ``--split``, ``--indices``, ...; ``--limit``, ``--error-rate``,
    ``--seed``, ``--config`` and ``--out`` are added from ``params``), then ``agentrl sft`` with ``config``
    on the won ones (``sft.min_reward: 1.0``); the result is ``describe_sft(demos, sft run folder)`` with the
    SFT model's path and the timings."""
    timings: dict[str, float] = {}
    if model is None:
        model = work / "model"
        timings["model_init_s"] = agentrl(["model", "init", "--out", str(model), "--size", params["size"],
                                           "--seed", str(seed)], work / "logs" / "model_init.log")["seconds"]
    out = work / "demos.jsonl"
    limit = ["--limit", str(params["demo_limit"])] if params["demo_limit"] else []
    timings["demos_s"] = agentrl(["demos", *demos, *limit, "--error-rate", str(params["error_rate"]), "--seed", str(seed),
                                  "--config", str(config), "--out", str(out)], work / "logs" / "demos.log")["seconds"]
    sft_model = work / "sft_model"
    lr = {"sft__lr": params["sft_lr"]} if params["sft_lr"] else {}
    timings["sft_s"] = agentrl(["sft", str(config), *sets(model__path=str(model), run__output_dir=str(work / "sft"),
                                                          sft__data=[str(out)], sft__output_dir=str(sft_model),
                                                          sft__epochs=params["sft_epochs"], run__seed=seed,
                                                          sft__min_reward=1.0, **lr)],
                               work / "logs" / "sft.log")["seconds"]
    prepared = {"model": str(sft_model), **describe_sft(out, work / "sft"), "timings": timings}
    print(f"SFT model ready: {prepared['demos']} demonstrations ({prepared['demos_trained']} won and trained on), "
          f"{prepared['sft_steps']} SFT steps, nll of the last 20 steps {prepared['sft_final_nll']:.3f}", flush=True)
    return prepared


def add_warmup_rl_arguments(parser: argparse.ArgumentParser, name: str, *, eval_temperature: str) -> None:
    """The options every environment's learning benchmark (issue 31) shares: where results go, the
    model and its warm-up, the evaluations' sampling and RL's settings. ``name``: the benchmark's
    file stem (``learning_webshop``); ``eval_temperature``: the default the help text names."""
    parser.add_argument("--quick", action="store_true", help="tiny sizes: check the plumbing, not the target")
    parser.add_argument("--work", default=None, help=f"work folder (default runs/{name}_bench[_quick])")
    parser.add_argument("--out", default=None, help=f"result JSON (default benchmarks/results/{name}[_quick].json)")
    parser.add_argument("--budget-s", type=float, default=None, help="training time budget (default 1800)")
    parser.add_argument("--size", default=None, help="agentrl model init size (default tiny)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="start from this `agentrl model init` model (default: build one)")
    parser.add_argument("--sft-model", default=None,
                        help="skip model init, demonstrations and SFT: start RL from this SFT model")
    parser.add_argument("--sft-run", nargs=2, metavar=("DEMOS", "RUN_DIR"), default=None,
                        help="with --sft-model: the demonstrations it was trained on and its SFT run folder "
                             "(sft_metrics.jsonl), described in the result")
    parser.add_argument("--error-rate", type=float, default=None,
                        help="probability of a deliberate mistake or detour per demonstrated step (default 0.3)")
    parser.add_argument("--sft-epochs", type=int, default=None, help="SFT epochs over the demonstrations (default 1)")
    parser.add_argument("--sft-lr", type=float, default=None,
                        help="SFT learning rate (default: the config's sft.lr, 3e-3, tuned on tiny)")
    parser.add_argument("--eval-repeats", type=int, default=None, help="times each held-out index is played (default 2)")
    parser.add_argument("--eval-temperature", type=float, default=None,
                        help=f"sampling temperature of the evaluations (default {eval_temperature}; 0 is greedy)")
    parser.add_argument("--rollout-temperature", type=float, default=None,
                        help="sampling temperature of RL's rollouts (default: the config's, 1.0)")
    parser.add_argument("--rl-lr", type=float, default=None, help="RL learning rate (default: the config's optim.lr)")
    parser.add_argument("--sft-only", action="store_true", help="stop after evaluating the SFT model")


def apply_warmup_rl_arguments(args: argparse.Namespace, params: dict[str, Any], name: str) -> tuple[Path, Path]:
    """Check the shared options (one sentence and exit for a bad value) and set them in ``params``
    (the RL ones in ``params["train_overrides"]``, which reach the training run only); returns the
    work folder (created) and the result path."""

    def checked(option: str, value: float | None, *, at_least: float | None = None) -> float | None:
        if value is not None and (value < at_least if at_least is not None else value <= 0):
            raise SystemExit(f"{option} {value}: must be " + (f"at least {at_least:g}" if at_least is not None
                                                                else "positive"))
        return value

    if args.error_rate is not None and not 0.0 <= args.error_rate < 1.0:
        raise SystemExit(f"--error-rate {args.error_rate}: must be at least 0 and below 1")
    params["train_overrides"] = dict(params["train_overrides"])  # params is a shallow copy of FULL or QUICK
    for key, value in (("budget_s", checked("--budget-s", args.budget_s)), ("size", args.size),
                       ("error_rate", args.error_rate),
                       ("sft_epochs", checked("--sft-epochs", args.sft_epochs, at_least=1)),
                       ("sft_lr", checked("--sft-lr", args.sft_lr)),
                       ("eval_repeats", checked("--eval-repeats", args.eval_repeats, at_least=1)),
                       ("eval_temperature", checked("--eval-temperature", args.eval_temperature, at_least=0))):
        if value is not None:
            params[key] = value
    if checked("--rollout-temperature", args.rollout_temperature) is not None:
        params["train_overrides"]["rollout__temperature"] = args.rollout_temperature
    if checked("--rl-lr", args.rl_lr) is not None:
        params["train_overrides"]["optim__lr"] = args.rl_lr
    if args.sft_model and not (Path(args.sft_model) / "config.json").is_file():
        raise SystemExit(f"--sft-model {args.sft_model}: not a model folder (no config.json)")
    work = Path(args.work) if args.work else ROOT / "runs" / f"{name}_bench{'_quick' if args.quick else ''}"
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) if args.out else RESULTS / f"{name}{'_quick' if args.quick else ''}.json"
    return work, out


def warmup_then_rl(benchmark: str, args: Any, params: dict[str, Any], *, work: Path, out: Path, config: Path,
                   train_task: dict[str, Any], prepare: Callable[[], dict[str, Any]],
                   describe_sft: Callable[[Path, Path], dict[str, Any]],
                   evaluate: Callable[[str, Path, dict[str, Any]], dict[str, Any]],
                   report: Callable[[dict[str, Any]], str], plot: Callable[[dict[str, Any], Path], None],
                   recorded: dict[str, Any] | None = None, target: float = 0.15) -> int:
    """The rest of an environment's learning benchmark (issue 31) once its options are read: the warm-up
    (``--sft-model``, described from ``--sft-run``, or ``prepare()``), its evaluation, and unless
    ``--sft-only`` RL within the budget on ``train_task``, the same evaluation after it, the checks
    (``target`` points of held-out success on ``params["eval_split"]``, 30 minutes) and the result file.
    ``recorded``: more entries for the result (e.g. reference scores). Returns the exit status."""
    load_before = os.getloadavg()
    started = time.monotonic()
    if args.sft_model:
        prepared: dict[str, Any] = {"model": args.sft_model, "given": args.sft_model}
        if args.sft_run:  # the given model's SFT run, for the record
            demos, run_dir = args.sft_run
            prepared.update(describe_sft(Path(demos), Path(run_dir)))
    else:
        prepared = prepare()
    before = evaluate(prepared["model"], work / "eval_sft", params)
    print(f"after SFT: {report(before)}", flush=True)
    common = {"params": {**params, "seed": args.seed, "config": str(config.relative_to(ROOT))},
              "sft": {k: v for k, v in prepared.items() if k != "model"}, **(recorded or {}), "before": before}
    if args.sft_only:
        out = out.with_name(out.stem + "_sft.json") if not args.out else out
        result = {"benchmark": benchmark, "sft_only": True, "quick": args.quick, **common,
                  "machine": machine(load_before), "wall_s": round(time.monotonic() - started, 1)}
        print(f"\nwrote {write_result(result, out)} (--sft-only: no RL)")
        return 0

    run = train(prepared["model"], work / "grpo", params, config=config,
                extra={**params["overrides"], **params["train_overrides"], "run__seed": args.seed,
                       "tasks": [train_task]})
    after = evaluate(run["model"], work / "eval_grpo", params)
    print(f"after RL: {report(after)}", flush=True)
    change = {n: after["tasks"][n]["success"] - before["tasks"][n]["success"] for n in before["tasks"]}
    print(f"RL: {run['steps']} steps in {run['train_command_s']:.0f} s"
          f"{' (interrupted at the budget)' if run['interrupted'] else ''}; "
          + ", ".join(f"{n} {before['tasks'][n]['success']:.3f} -> {after['tasks'][n]['success']:.3f} ({change[n]:+.3f})"
                      for n in change), flush=True)
    checks = {f"{params['eval_split']}_improves_{round(target * 100)}pp": change[params["eval_split"]] >= target,
              "within_30_min": run["train_command_s"] <= 1800 + 150}
    result = {"benchmark": benchmark, "quick": args.quick, **common,
              "params": {**common["params"], "targets": {"improvement_at_least": target}},
              "train": run, "after": after, "change": change, "checks": checks,
              "passed": all(checks.values()) if not args.quick else None,
              "machine": machine(load_before), "wall_s": round(time.monotonic() - started, 1)}
    print(f"\nwrote {write_result(result, out, plot)}; checks: {checks}"
          f"{' (quick: not the target)' if args.quick else ''}; load {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    return 0 if args.quick or result["passed"] else 1


def require_plotting() -> None:
    """Fail at the start, not after the runs, when the PNG cannot be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit("this benchmark draws a PNG with matplotlib: pip install -c constraints.txt "
                         "-r benchmarks/requirements.txt") from None


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    palette = iter(["tab:orange", "tab:green", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"])
    colors = {"grpo": "tab:blue", "grpo_negated": "tab:red", "grpo_lora": "tab:purple"}
    colors.update({arm: next(palette, "tab:gray") for arm in result["runs"] if arm not in colors})
    for arm, run in result["runs"].items():
        xs = [p["step"] for p in run["train"]["curve"]]
        ax1.plot(xs, [p["reward"] for p in run["train"]["curve"]], "-o", ms=3, color=colors.get(arm), label=arm)
    ax1.set_xlabel("training step")
    ax1.set_ylabel("training reward (batch mean)")
    ax1.set_ylim(-0.02, 1.02)
    ax1.grid(alpha=0.3)
    ax1.legend()
    ax1.set_title("reward per step (metrics.jsonl)")
    labels, values, bar_colors = ["SFT"], [result["before"]["success"]], ["tab:gray"]
    for arm, run in result["runs"].items():
        labels.append(f"after\n{arm}")
        values.append(run["after"]["success"])
        bar_colors.append(colors.get(arm, "tab:green"))
    ax2.bar(labels, values, color=bar_colors)
    for i, v in enumerate(values):
        ax2.text(i, v + 0.01, f"{v:.2f}", ha="center")
    ax2.set_ylim(0, 1)
    ax2.tick_params(axis="x", labelsize=8)  # arm names such as grpo_lora@5e-4 side by side
    ax2.set_ylabel("held-out success (calc test)")
    ax2.set_title("held-out success")
    fig.suptitle(f"learning benchmark: tiny model on calc, {result['params']['budget_s']:.0f} s training budget per run")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: check the plumbing, not the targets")
    parser.add_argument("--work", default=None, help="work folder (default runs/learning_bench[_quick])")
    parser.add_argument("--out", default=None, help="result JSON (default benchmarks/results/learning[_quick].json)")
    parser.add_argument("--budget-s", type=float, default=None, help="training time budget per run (default 600)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="start from this `agentrl model init` model (default: build one)")
    parser.add_argument("--arms", default="grpo,grpo_negated",
                        help="advantage estimators to train with; <estimator>_lora trains LoRA adapters "
                             f"(model.lora: rank {LORA_ARM['model__lora__rank']}, lr {LORA_ARM['optim__lr']}); "
                             "<estimator>_lora@LR sets its learning rate (grpo_lora@5e-4,grpo_lora@1e-3)")
    args = parser.parse_args()
    require_plotting()
    params = dict(QUICK if args.quick else FULL)
    if args.budget_s is not None:
        params["budget_s"] = args.budget_s
    work = Path(args.work) if args.work else ROOT / "runs" / ("learning_bench_quick" if args.quick else "learning_bench")
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) if args.out else RESULTS / ("learning_quick.json" if args.quick else "learning.json")
    load_before = os.getloadavg()
    started = time.monotonic()

    prepared = prepare_model(work, params, seed=args.seed, model=Path(args.model) if args.model else None)
    print(f"SFT model ready: {prepared['demos']} demonstrations ({prepared['demo_success']:.0%} correct), "
          f"{prepared['sft_steps']} SFT steps, final nll {prepared['sft_final_nll']:.3f}", flush=True)
    before = evaluate(prepared["model"], work / "eval_sft", params)
    before_success = success_of(before)
    print(f"held-out success after SFT: {before_success:.3f}", flush=True)

    runs: dict[str, Any] = {}
    for arm in args.arms.split(","):
        estimator, lora = lora_arm(arm)
        run = train(prepared["model"], work / arm, params,
                    extra={"advantage__estimator": estimator, "run__seed": args.seed, **(lora or {})})
        after = evaluate(run["model"], work / f"eval_{arm}", params)
        runs[arm] = {"train": run, "after": {"success": success_of(after), **after},
                     "improvement": success_of(after) - before_success}
        print(f"{arm}: {run['steps']} steps in {run['train_command_s']:.0f} s"
              f"{' (interrupted at the budget)' if run['interrupted'] else ''}; held-out success "
              f"{before_success:.3f} -> {runs[arm]['after']['success']:.3f} "
              f"({runs[arm]['improvement']:+.3f})", flush=True)

    checks = {}
    if "grpo" in runs:
        checks["grpo_improves_25pp"] = runs["grpo"]["improvement"] >= TARGET_IMPROVEMENT
        checks["grpo_within_budget"] = runs["grpo"]["train"]["train_command_s"] <= params["budget_s"] + 150
    for arm in (a for a in runs if lora_arm(a)[1]):
        checks[f"{arm.replace('grpo_', '')}_improves_25pp"] = runs[arm]["improvement"] >= TARGET_IMPROVEMENT
    if "grpo_negated" in runs:
        checks["control_does_not_improve"] = runs["grpo_negated"]["improvement"] < CONTROL_MAX_CHANGE
    result = {
        "benchmark": "learning",
        "quick": args.quick,
        "params": {**params, "seed": args.seed, "config": str(CONFIG.relative_to(ROOT)),
                   "model": "agentrl model init --size tiny (Qwen2, 4 layers, hidden 128, 1.3M parameters)",
                   "targets": {"improvement_at_least": TARGET_IMPROVEMENT, "control_change_below": CONTROL_MAX_CHANGE}},
        "sft": {k: v for k, v in prepared.items() if k != "model"},
        "before": {"success": before_success, **before},
        "runs": runs,
        "checks": checks,  # computed in --quick too, but only the full sizes can meet the targets
        "passed": all(checks.values()) if checks and not args.quick else None,
        "machine": machine(load_before),
        "wall_s": round(time.monotonic() - started, 1),
    }
    print(f"\nwrote {write_result(result, out, plot)}; checks: {checks}"
          f"{' (quick: not targets)' if args.quick else ''}; load {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    return 0 if args.quick or result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
