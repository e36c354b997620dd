"""The README's main job: build a tiny model, warm it up with SFT, train it with RL on CPU.

    python examples/quickstart.py            # (nox -s quickstart runs this after installing)

Steps, each through the real `agentrl` command line:
  1. agentrl model init    a tiny Qwen2-architecture model and tokenizer, built locally
  2. agentrl demos         oracle demonstrations of the calc example environment (some with mistakes)
  3. agentrl sft           supervised cold start on them
  4. agentrl train         asynchronous RL on calc + db (SQLite) + kg (embedded) + webshop + alfworld,
                           ending with the per-task table
Set-up (1-3) and training (4) are timed separately.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def agentrl(*args: str) -> None:
    cmd = [sys.executable, "-m", "agentrl_core.cli.main", *args]
    print("+ agentrl " + " ".join(args), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "examples" / "quickstart.yaml"))
    parser.add_argument("--out", default="runs/quickstart", help="run folder (relative to the repository)")
    parser.add_argument("--steps", type=int, default=None, help="override train.total_steps")
    parser.add_argument("--demos", type=int, default=2500, help="calc demonstrations for SFT")
    args = parser.parse_args()
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    common = ["--set", f"run.output_dir={out}"]

    t0 = time.monotonic()
    if not (out / "model" / "config.json").exists():
        agentrl("model", "init", "--out", str(out / "model"), "--size", "tiny")
    agentrl("demos", "--env", "calc", "--split", "train", "--limit", str(args.demos), "--error-rate", "0.3",
            "--config", args.config, "--out", str(out / "demos.jsonl"))
    agentrl("sft", args.config, *common, "--set", f"model.path={out / 'model'}",
            "--set", f"sft.data=[{out / 'demos.jsonl'}]", "--set", f"sft.output_dir={out / 'sft_model'}")
    setup_s = time.monotonic() - t0

    t1 = time.monotonic()
    # --overwrite: running the main job again replaces its previous training run (model, demos and SFT model stay)
    train = ["train", args.config, *common, "--set", f"model.path={out / 'sft_model'}", "--overwrite"]
    if args.steps is not None:
        train += ["--set", f"train.total_steps={args.steps}"]
    agentrl(*train)
    train_s = time.monotonic() - t1
    timings = {"setup_seconds": round(setup_s, 1), "train_seconds": round(train_s, 1)}
    (out / "quickstart_timings.json").write_text(json.dumps(timings, indent=2))
    print(f"\nquickstart: set-up (model, demonstrations, SFT) {setup_s:.0f} s; training run {train_s:.0f} s; "
          f"outputs in {out}")
    command = Path(sys.executable).parent / "agentrl"
    if command.exists():  # nox's venv is not on PATH: say where the command is
        print(f"the agentrl command of this environment: {command} (or `. {command.parent / 'activate'}`, then "
              f"`agentrl ...`); e.g. {command} eval {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
