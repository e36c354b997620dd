"""A training run's folder: refuse to mix two runs in one, or clear the first run's outputs.

A run folder often holds more than a training run (the main job keeps its model, demonstrations
and SFT model there too), so ``--overwrite`` deletes only what ``agentrl train`` itself writes,
never the folder, and never the model the new run starts from.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from agentrl_core.errors import AgentrlError

# What a training run writes into its folder; the first group says a run happened there.
RUN_OUTPUTS = ("checkpoints", "final_model", "metrics.jsonl", "trained_groups.jsonl", "samples.jsonl",
               "summary.json", "tensorboard", "learning_curve.png")
SET_UP_OUTPUTS = ("config.yaml", "logs")


class RunFolderError(AgentrlError):
    """The run folder holds a previous run and neither --resume nor --overwrite was given."""


def previous_run(run_dir: Path) -> list[str]:
    """The outputs of an earlier training run present in ``run_dir`` (empty: none)."""
    return [name for name in RUN_OUTPUTS if (run_dir / name).exists()]


def prepare_run_folder(run_dir: Path, *, resume: bool, overwrite: bool, model_path: str | None = None,
                       echo=print) -> None:
    """Check that ``run_dir`` may take a new run; with ``overwrite``, delete the previous run's outputs."""
    if resume and overwrite:
        raise RunFolderError("--resume and --overwrite contradict each other: --resume continues the previous run, "
                             "--overwrite deletes it; give one of them")
    found = previous_run(run_dir)
    if resume or not found:
        return
    if not overwrite:
        raise RunFolderError(
            f"{run_dir} holds a previous training run ({', '.join(found)}): continue it with --resume, delete its "
            "outputs and start over with --overwrite, or choose another folder with --set run.output_dir=DIR")
    doomed = [run_dir / name for name in (*RUN_OUTPUTS, *SET_UP_OUTPUTS) if (run_dir / name).exists()]
    if model_path:
        model = Path(model_path).resolve()
        for path in doomed:
            if model == path.resolve() or path.resolve() in model.parents:
                raise RunFolderError(f"--overwrite would delete {path}, which holds model.path ({model_path}): "
                                     "copy that model elsewhere first, or train into another folder")
    for path in doomed:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    echo(f"--overwrite: deleted the previous run's {', '.join(p.name for p in doomed)} in {run_dir}")


def trained_policy(run_dir: Path) -> tuple[Path, Path]:
    """The config and the final model of a finished run in ``run_dir`` (for ``agentrl eval RUN_DIR``)."""
    import json

    config = run_dir / "config.yaml"
    if not config.is_file():
        raise RunFolderError(f"{run_dir} is not the folder of an `agentrl train` run (it has no config.yaml); "
                             "give a run folder or a config file")
    summary = run_dir / "summary.json"
    recorded = json.loads(summary.read_text()).get("final_model") if summary.is_file() else None
    model = Path(recorded) if recorded else run_dir / "final_model"
    if not (model / "config.json").is_file():
        raise RunFolderError(
            f"{run_dir} holds no final model ({model} is missing): the run has not finished, or it ran with "
            "train.final_model=false; evaluate a model folder with --set model.path=DIR instead")
    return config, model
