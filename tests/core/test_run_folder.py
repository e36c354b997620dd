"""A run folder holds one training run: a second one is refused, or clears the first with --overwrite."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agentrl_core.jobs.run_folder import RunFolderError, prepare_run_folder, previous_run


def agentrl(*args, env=None):
    return subprocess.run([sys.executable, "-m", "agentrl_core.cli.main", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def toy_env_plugin(root):
    """A distribution providing environment 'toy' (core alone has no environment)."""
    info = root / "agentrl_env_toy-0.0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: agentrl-env-toy\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[agentrl]\nenv_toy = toy_plugin\n")
    (root / "toy_plugin.py").write_text(
        "from agentrl_core import hookimpl\nfrom agentrl_core.types import EnvironmentSpec\n\n"
        "@hookimpl\ndef agentrl_environments():\n    yield EnvironmentSpec(name='toy', factory='toy_plugin:Toy')\n")
    return {"PYTHONPATH": str(root)}


def previous(run_dir):
    """A run folder as the main job leaves it: set-up outputs beside a finished training run."""
    (run_dir / "sft_model").mkdir(parents=True)
    (run_dir / "sft_model" / "config.json").write_text("{}")
    (run_dir / "demos.jsonl").write_text("{}\n")
    (run_dir / "checkpoints" / "step_000006").mkdir(parents=True)
    (run_dir / "final_model").mkdir()
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "controller.log").write_text("old\n")
    for name in ("metrics.jsonl", "trained_groups.jsonl", "summary.json", "config.yaml"):
        (run_dir / name).write_text("{}\n")
    return run_dir


def test_an_empty_or_set_up_only_folder_takes_a_run(tmp_path):
    prepare_run_folder(tmp_path / "new", resume=False, overwrite=False)
    run_dir = tmp_path / "setup"
    (run_dir / "sft_model").mkdir(parents=True)
    (run_dir / "sft_metrics.jsonl").write_text("{}\n")
    assert previous_run(run_dir) == []
    prepare_run_folder(run_dir, resume=False, overwrite=False)


def test_a_previous_run_is_refused_naming_resume_and_overwrite(tmp_path):
    run_dir = previous(tmp_path / "run")
    with pytest.raises(RunFolderError) as err:
        prepare_run_folder(run_dir, resume=False, overwrite=False)
    message = str(err.value)
    assert "--resume" in message and "--overwrite" in message and str(run_dir) in message
    assert "checkpoints, final_model, metrics.jsonl, trained_groups.jsonl, summary.json" in message
    assert (run_dir / "metrics.jsonl").exists()  # nothing touched
    prepare_run_folder(run_dir, resume=True, overwrite=False)  # --resume continues it


def test_overwrite_deletes_only_what_training_wrote(tmp_path):
    run_dir = previous(tmp_path / "run")
    said = []
    prepare_run_folder(run_dir, resume=False, overwrite=True, model_path=str(run_dir / "sft_model"), echo=said.append)
    assert sorted(p.name for p in run_dir.iterdir()) == ["demos.jsonl", "sft_model"]
    assert (run_dir / "sft_model" / "config.json").exists()
    assert said and "--overwrite: deleted" in said[0]
    assert previous_run(run_dir) == []


def test_overwrite_never_deletes_the_model_it_starts_from(tmp_path):
    run_dir = previous(tmp_path / "run")
    with pytest.raises(RunFolderError, match="holds model.path"):
        prepare_run_folder(run_dir, resume=False, overwrite=True, model_path=str(run_dir / "final_model"))
    assert (run_dir / "final_model").exists() and (run_dir / "metrics.jsonl").exists()


def test_resume_and_overwrite_together_are_one_sentence(tmp_path):
    with pytest.raises(RunFolderError, match="contradict"):
        prepare_run_folder(tmp_path, resume=True, overwrite=True)


def test_agentrl_train_refuses_a_folder_with_a_previous_run(tmp_path):
    run_dir = previous(tmp_path / "run")
    config = tmp_path / "run.yaml"
    config.write_text(f"run:\n  output_dir: {run_dir}\nmodel:\n  path: {run_dir / 'sft_model'}\n"
                      "tasks: [{env: toy, split: train}]\n")
    out = agentrl("train", str(config), env=toy_env_plugin(tmp_path / "plugin"))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"agentrl: error: {run_dir} holds a previous training run"), lines
    assert "--resume" in lines[0] and "--overwrite" in lines[0]


def test_trained_policy_is_the_summarys_final_model(tmp_path):
    from agentrl_core.jobs.run_folder import trained_policy

    run_dir = tmp_path / "run"
    (run_dir / "elsewhere").mkdir(parents=True)
    (run_dir / "elsewhere" / "config.json").write_text("{}")
    (run_dir / "config.yaml").write_text("run: {}\n")
    with pytest.raises(RunFolderError, match="holds no final model"):
        trained_policy(run_dir)
    (run_dir / "summary.json").write_text(json.dumps({"final_model": str(run_dir / "elsewhere")}))
    assert trained_policy(run_dir) == (run_dir / "config.yaml", run_dir / "elsewhere")
    with pytest.raises(RunFolderError, match="not the folder of an `agentrl train` run"):
        trained_policy(tmp_path)


def test_grpo_with_one_sample_a_group_is_one_sentence(tmp_path):
    run_dir = previous(tmp_path / "run")
    config = tmp_path / "run.yaml"
    config.write_text(f"run:\n  output_dir: {run_dir}\nmodel:\n  path: {run_dir / 'sft_model'}\n"
                      "tasks: [{env: toy, split: train}]\nrollout:\n  n_samples: 1\n")
    out = agentrl("train", str(config), "--overwrite", env=toy_env_plugin(tmp_path / "plugin"))
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentrl: error: rollout.n_samples is 1 with advantage.estimator "
                                                   "grpo"), lines
    assert "2 or more" in lines[0]
    assert (run_dir / "metrics.jsonl").exists()  # a config error is found before --overwrite deletes anything
