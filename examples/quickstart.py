"""The README's main job: build a tiny model, warm it up with SFT, train it with RL on CPU.

    python examples/quickstart.py            # (nox -s quickstart runs this after installing)

Steps, each through the real `agentrl` command line:
  1. agentrl model init    a tiny Qwen2-architecture model and tokenizer, built locally
  2. agentrl demos         oracle demonstrations of the calc example environment (some with mistakes)
  3. agentrl sft           supervised cold start on them
  4. agentrl eval          held-out success of the SFT model on 100 of calc's test problems (3 repeats)
  5. agentrl train         asynchronous RL on calc + db (SQLite) + kg (embedded) + webshop + alfworld,
                           ending with the per-task table and the trained policy in <out>/final_model
  6. agentrl eval <out>    the same held-out problems with the trained policy: before/after with spread,
                           and <out>/learning_curve.png
Set-up (1-3) and training (5) are timed separately.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def agentrl(*args: str) -> None:
    cmd = [sys.executable, "-m", "agentrl_core.cli.main", *args]
    print("+ agentrl " + " ".join(args), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)


# The held-out problems evaluated before and after RL: calc's test split, which training never sees.
# 100 of its 200 problems x 3 repeats: the spread across repeats is about 0.05 at success 0.5.
HELD_OUT = "[{env: calc, split: test, limit: 100}]"


def held_out(command: list[str], out_dir: Path, repeats: int) -> dict:
    """Success of one model on the held-out problems, ``repeats`` times: mean, spread, per repeat."""
    agentrl(*command, "--set", f"eval.tasks={HELD_OUT}", "--set", f"eval.repeats={repeats}", "--out", str(out_dir))
    task = json.loads((out_dir / "summary.json").read_text())["models"]["default"]["calc-test"]
    return {"success_mean": task["success_mean"], "success_std": task["success_std"],
            "per_repeat_success": task["per_repeat_success"], "episodes": task["episodes"]}


def before_after(before: dict, after: dict, repeats: int) -> str:
    delta = 100 * (after["success_mean"] - before["success_mean"])
    return (f"held-out calc success ({before['episodes'] // repeats} test problems x {repeats} repeats, mean ± std "
            f"over repeats): before RL {before['success_mean']:.3f} ± {before['success_std']:.3f}, after RL "
            f"{after['success_mean']:.3f} ± {after['success_std']:.3f} ({delta:+.1f} points)")


def learning_curve(out: Path, before: dict, after: dict) -> Path | None:
    """``learning_curve.png``: calc's training success per step, and held-out success before and after RL."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [(r["step"], r["task/calc-train/success"]) for r in rows if "task/calc-train/success" in r]
    last = max((step for step, _ in train), default=1)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    if train:
        ax.plot(*zip(*train), "-o", ms=3, label="calc, training batches (success)")
    ax.errorbar([0, last], [before["success_mean"], after["success_mean"]],
                yerr=[before["success_std"], after["success_std"]], fmt="s--", capsize=4, color="black",
                label="calc, held-out test: before and after RL (± std over repeats)")
    ax.set(xlabel="training step", ylabel="success", ylim=(-0.03, 1.03), title="agentrl quickstart")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path = out / "learning_curve.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "examples" / "quickstart.yaml"))
    parser.add_argument("--out", default="runs/quickstart", help="run folder (relative to the repository)")
    parser.add_argument("--steps", type=int, default=None, help="override train.total_steps")
    parser.add_argument("--demos", type=int, default=2500, help="calc demonstrations for SFT")
    parser.add_argument("--heldout-repeats", type=int, default=3,
                        help="repeats of the held-out evaluation before and after RL (the spread is across them)")
    args = parser.parse_args()
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    common = ["--set", f"run.output_dir={out}"]

    load_start = os.getloadavg()
    t0 = time.monotonic()
    if not (out / "model" / "config.json").exists():
        agentrl("model", "init", "--out", str(out / "model"), "--size", "tiny")
    agentrl("demos", "--env", "calc", "--split", "train", "--limit", str(args.demos), "--error-rate", "0.3",
            "--config", args.config, "--out", str(out / "demos.jsonl"))
    t_sft = time.monotonic()
    agentrl("sft", args.config, *common, "--set", f"model.path={out / 'model'}",
            "--set", f"sft.data=[{out / 'demos.jsonl'}]", "--set", f"sft.output_dir={out / 'sft_model'}")
    sft_s = time.monotonic() - t_sft
    load_after_sft = os.getloadavg()
    setup_s = time.monotonic() - t0

    # held-out success before RL: the SFT model on the test problems that are evaluated again after RL
    before = held_out(["eval", args.config, *common, "--set", f"model.path={out / 'sft_model'}"],
                      out / "heldout_before", args.heldout_repeats)

    t1 = time.monotonic()
    # --overwrite: running the main job again replaces its previous training run (model, demos and SFT model stay)
    train = ["train", args.config, *common, "--set", f"model.path={out / 'sft_model'}", "--overwrite"]
    if args.steps is not None:
        train += ["--set", f"train.total_steps={args.steps}"]
    agentrl(*train)
    train_s = time.monotonic() - t1
    after = held_out(["eval", str(out)], out / "heldout_after", args.heldout_repeats)  # the run's final policy
    report = before_after(before, after, args.heldout_repeats)
    (out / "heldout.json").write_text(json.dumps({"before_rl": before, "after_rl": after}, indent=2))
    plot = learning_curve(out, before, after)
    # the load average (1, 5, 15 min) with the timings: on a shared machine they depend on it
    timings = {"setup_seconds": round(setup_s, 1), "sft_seconds": round(sft_s, 1), "train_seconds": round(train_s, 1),
               "total_seconds": round(time.monotonic() - t0, 1), "loadavg_start": [round(x, 2) for x in load_start],
               "loadavg_after_sft": [round(x, 2) for x in load_after_sft],
               "loadavg_end": [round(x, 2) for x in os.getloadavg()]}
    (out / "quickstart_timings.json").write_text(json.dumps(timings, indent=2))
    print(f"\nquickstart: set-up (model, demonstrations, SFT {sft_s:.0f} s) {setup_s:.0f} s; training run "
          f"{train_s:.0f} s; {timings['total_seconds']:.0f} s in all, install not counted (load average {timings['loadavg_end'][1]:.1f} "
          f"over the last 5 min); outputs in {out}")
    print(report)
    print(f"learning curve: {plot}" if plot else "learning curve: not drawn (pip install matplotlib to get one)")
    command = Path(sys.executable).parent / "agentrl"
    if command.exists():  # nox's venv is not on PATH: say where the command is
        print(f"the agentrl command of this environment: {command} (or `. {command.parent / 'activate'}`, then "
              f"`agentrl ...`); e.g. {command} eval {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
