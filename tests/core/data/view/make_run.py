"""Regenerate the viewer's fixture run: a real (tiny) ``agentrl train`` run, its store and metrics kept.

    .nox/core/bin/python tests/core/data/view/make_run.py [--model runs/quickstart/sft_model]

As the README's main job does, at a smaller scale: a warm-started tiny model (``--model``:
the main job's ``runs/quickstart/sft_model``; without it, the tiny model of ``agentrl model
init --size tiny`` warmed up here by ``agentrl sft`` on ``agentrl demos`` of ``calc``, 10
minutes or more on 2 cores), so that episodes call tools and some succeed; then ``agentrl
train`` for 4 steps on the CPU, on three tasks so that each comes back in several steps
(the compare view), with a validation round every 2 steps. Keeps ``trajectories.sqlite``,
``metrics.jsonl``, ``config.yaml`` and ``summary.json`` in ``tests/core/data/view/calc-run/``,
and the model's tokenizer files in its ``tokenizer/`` (tests decode the stored ids with it);
then ``agentrl eval`` of the same model on the validation tasks, its store and summary in
``tests/core/data/view/calc-eval/``.

Runs with core's venv alone: the ``calc`` plugin (plugins/agentrl-plugin-example) is put on
the path with an entry-point record, as an installed plugin would be.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
KEEP = ("trajectories.sqlite", "metrics.jsonl", "config.yaml", "summary.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a warm-started tiny model that calls calc's tools (default: make one)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="agentrl-view-fixture-"))
    try:
        plugin_path = work / "plugin_path"
        info = plugin_path / "agentrl_plugin_example-0.0.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: agentrl-plugin-example\nVersion: 0.0.0\n")
        (info / "entry_points.txt").write_text("[agentrl]\nplugin_example = agentrl_plugin_example.plugin\n")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(plugin_path), str(ROOT / "plugins" / "agentrl-plugin-example" / "src"), os.environ.get("PYTHONPATH", "")])}

        def agentrl(*args: str) -> None:
            subprocess.run([sys.executable, "-m", "agentrl_core.cli.main", *args], env=env, check=True)

        # the README's main job's calc (examples/quickstart.yaml): small enough for the tiny model
        calc = {"max_ops": 1, "ops": ["+"], "max_operand": 9, "compact_prompt": True}
        warm_model = Path(args.model).resolve() if args.model else warm_start(work, agentrl, calc)
        config = {
            "run": {"name": "calc-run", "output_dir": str(work / "calc-run"), "seed": 3},
            "model": {"path": str(warm_model), "tool_parser": "qwen25"},
            "tasks": [{"env": "calc", "split": "train", "limit": 3}], "environments": {"calc": calc},
            "rollout": {"n_samples": 4, "batch_size": 2, "concurrency": 8, "max_turns": 6, "max_total_len": 2048,
                        "max_new_tokens": 64, "temperature": 1.0},
            "loss": {"kl_coef": 0.0},
            "optim": {"lr": 1.0e-4},
            "train": {"mode": "sync", "total_steps": 4, "device": "cpu", "checkpoint_every": 0, "final_model": False,
                      "eval_every": 2, "eval_tasks": [{"env": "calc", "split": "train", "limit": 2}]},
            "logging": {"loggers": ["jsonl"], "sample_rollouts": 0},
        }
        path = work / "calc-run.yaml"
        path.write_text(yaml.safe_dump(config))
        agentrl("train", str(path))
        # `agentrl eval` writes the same store (kind eval): the policy before RL, twice per task
        agentrl("eval", str(path), "--set", "eval.repeats=2", "--out", str(work / "calc-eval"))
        for run in ("calc-run", "calc-eval"):
            shutil.rmtree(HERE / run, ignore_errors=True)
            (HERE / run).mkdir()
            for name in KEEP:
                if (work / run / name).exists():
                    shutil.copy(work / run / name, HERE / run / name)
        out = HERE / "calc-run"
        (out / "tokenizer").mkdir()
        for name in TOKENIZER_FILES:
            if (warm_model / name).exists():
                shutil.copy(warm_model / name, out / "tokenizer" / name)
        print(f"wrote {out}: {sorted(p.name for p in out.iterdir())}, and {HERE / 'calc-eval'}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def warm_start(work: Path, agentrl, calc: dict) -> Path:
    """The tiny model after a supervised warm start on calc's oracle demonstrations (as the main job makes it)."""
    from agentrl_core.tinymodel import init_model

    model = init_model(work / "tiny_model", "tiny", seed=0)
    warm = work / "sft.yaml"
    warm.write_text(yaml.safe_dump({
        "run": {"name": "sft", "output_dir": str(work), "seed": 0},
        "model": {"path": str(model), "tool_parser": "qwen25"},
        "tasks": [{"env": "calc", "split": "train"}], "environments": {"calc": calc},
        "sft": {"data": [str(work / "demos.jsonl")], "epochs": 2, "batch_size": 16, "lr": 3.0e-3,
                "output_dir": str(work / "sft_model")}}))
    agentrl("demos", "--env", "calc", "--split", "train", "--limit", "2500", "--error-rate", "0.3",
            "--config", str(warm), "--out", str(work / "demos.jsonl"))
    agentrl("sft", str(warm))
    return work / "sft_model"


if __name__ == "__main__":
    main()
