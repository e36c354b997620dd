"""The wandb logger in offline mode: what it wrote is read back from W&B's own run files."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from agentrl_logger_wandb.logger import RUN_FILE, WandbLogger, WandbLoggerConfig
from wandb_files import read_run

from agentrl_core.config import config_from_dict, config_to_dict
from agentrl_core.errors import ConfigError
from agentrl_core.registry import Registry
from agentrl_core.train.loggers import JsonlLogger
from agentrl_core.types import LoggerSpec

WANDB_KEYS = {"_step", "_runtime", "_timestamp"}  # W&B's own history keys


def _write_config(run_dir: Path, **overrides) -> dict:
    data = {"run": {"name": "wandb-test", "output_dir": str(run_dir)},
            "rollout": {"n_samples": overrides.get("n_samples", 4)},
            "logging": {"loggers": ["jsonl", "wandb"]}}
    config = config_to_dict(config_from_dict(data))
    if "extra" in overrides:
        config["run"]["extra_key"] = overrides["extra"]  # a key a resumed config might add
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return config


def _step_metrics(step: int) -> dict:
    return {"task": {"db-std": {"reward": 0.25 * step, "success": step % 2}},
            "version_lag/mean": 0.5, "grad_norm": 1.0 + step, "odd:key": float(step), "done": step == 3}


def _run_steps(run_dir: Path, logger: WandbLogger, steps: range) -> None:
    """What Trainer._log does: samples.jsonl first, then every logger."""
    with JsonlLogger(run_dir=run_dir) as jsonl:
        for step in steps:
            with open(run_dir / "samples.jsonl", "a", encoding="utf-8") as f:
                for uid in range(2):
                    f.write(json.dumps({"step": step, "uid": f"u{step}-{uid}", "task": "db-std", "index": uid,
                                        "reward": float(uid), "status": "completed", "text": f"turn text {step}"}) + "\n")
            metrics = _step_metrics(step)
            jsonl.log(step, metrics)
            logger.log(step, metrics)


def _jsonl_keys(run_dir: Path) -> set[str]:
    keys: set[str] = set()
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        keys |= set(json.loads(line)) - {"time"}
    return keys


def _offline_runs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*"))


def _check_segment(run_dir: Path, folder: Path, steps: range, config: dict) -> None:
    """One offline folder: the run id, config, metrics at each step and the step's sample table."""
    run = read_run(folder)
    assert run["run_id"] == json.loads((run_dir / RUN_FILE).read_text())["run_id"]
    assert run["config"] == config  # the run's config.yaml, nested as in the file
    history = run["history"]
    assert [h["step"] for h in history] == list(steps)
    for h in history:
        s = h["step"]
        metric_keys = {k for k in h if k not in WANDB_KEYS and not k.startswith("samples/")}
        assert metric_keys == _jsonl_keys(run_dir)  # metrics.jsonl's keys, ":" included, plus step
        assert h["task/db-std/reward"] == 0.25 * s
        assert h["done"] == (1 if s == 3 else 0)
        assert h["grad_norm"] == 1.0 + s
        # the step's samples.jsonl rows, as a table W&B wrote next to the run
        table = run["tables"][Path(h["samples/path"]).name]
        assert table["columns"] == ["step", "uid", "task", "index", "reward", "status", "text"]
        assert [row[1] for row in table["data"]] == [f"u{s}-0", f"u{s}-1"]
        assert table["data"][0][6] == f"turn text {s}"
        assert h["samples/nrows"] == 2


def test_offline_run_and_resume_continue_the_same_run(tmp_path: Path):
    run_dir = tmp_path / "run"
    config = _write_config(run_dir)
    registry = Registry()
    logger = registry.build(LoggerSpec, "wandb", {"project": "offline-test", "tags": ["a"]}, run_dir=run_dir)
    assert not logger.resumed and logger.url is None and logger.mode == "offline"
    first_id = logger.run_id
    _run_steps(run_dir, logger, range(1, 4))
    logger.close()
    (first,) = _offline_runs(run_dir)
    assert logger.offline_dir == first and first.name.endswith(f"-{first_id}")
    _check_segment(run_dir, first, range(1, 4), config)
    assert read_run(first)["name"] == "wandb-test"

    # resume: the same run folder, a config that changed one value and added one key
    resumed_config = _write_config(run_dir, n_samples=16, extra="new")
    logger = registry.build(LoggerSpec, "wandb", {"project": "offline-test", "tags": ["a"]}, run_dir=run_dir)
    assert logger.resumed and logger.run_id == first_id
    _run_steps(run_dir, logger, range(4, 6))
    logger.close()
    first_again, second = _offline_runs(run_dir)
    # `wandb sync` uploads both, in order; W&B adds "-1" to the folder name when both runs started in
    # the same second (seen on an idle machine)
    assert first_again == first and re.fullmatch(rf"offline-run-\d{{8}}_\d{{6}}-{first_id}(-\d+)?", second.name)
    _check_segment(run_dir, second, range(4, 6), resumed_config)
    assert resumed_config["rollout"]["n_samples"] == 16 and resumed_config["run"]["extra_key"] == "new"


def test_another_project_starts_a_new_run(tmp_path: Path):
    run_dir = tmp_path / "run"
    _write_config(run_dir)
    with WandbLogger(WandbLoggerConfig(project="one"), run_dir=run_dir) as first:
        pass
    with WandbLogger(WandbLoggerConfig(project="two"), run_dir=run_dir) as second:
        assert not second.resumed and second.run_id != first.run_id
    assert json.loads((run_dir / RUN_FILE).read_text()) == {"run_id": second.run_id, "project": "two",
                                                            "entity": None, "mode": "offline"}


def test_log_config_and_log_samples_off(tmp_path: Path):
    run_dir = tmp_path / "run"
    _write_config(run_dir)
    logger = WandbLogger(WandbLoggerConfig(project="quiet", log_config=False, log_samples=False, run_name="named"),
                         run_dir=run_dir)
    _run_steps(run_dir, logger, range(1, 3))
    logger.close()
    (folder,) = _offline_runs(run_dir)
    run = read_run(folder)
    assert run["config"] == {} and run["tables"] == {} and run["name"] == "named"
    assert [h["step"] for h in run["history"]] == [1, 2]
    assert not any(k.startswith("samples/") for h in run["history"] for k in h)


def test_config_section_reaches_the_logger_through_the_trainer(tmp_path: Path):
    from agentrl_core.jobs.training import Trainer

    config = config_from_dict({"run": {"name": "job", "output_dir": str(tmp_path / "run")},
                               "logging": {"loggers": ["jsonl", "wandb"],
                                           "wandb": {"project": "job-project", "mode": "offline",
                                                     "dir": str(tmp_path / "elsewhere"), "group": "g1"}}})
    assert config.logging.options["wandb"] == WandbLoggerConfig(project="job-project", mode="offline",
                                                                dir=str(tmp_path / "elsewhere"), group="g1")
    assert config_from_dict(config_to_dict(config)).logging.options == config.logging.options
    job = SimpleNamespace(registry=Registry(), config=config, run_dir=tmp_path / "run")
    jsonl, logger = Trainer._loggers(job)
    try:
        assert logger.project == "job-project"
        assert logger.offline_dir is not None and logger.offline_dir.parent == tmp_path / "elsewhere" / "wandb"
    finally:
        logger.close()
        jsonl.close()


def test_unknown_option_is_a_config_error():
    with pytest.raises(ConfigError, match="logging.wandb"):
        config_from_dict({"logging": {"loggers": ["wandb"], "wandb": {"projekt": "x"}}})


def test_a_bad_mode_from_the_environment_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("WANDB_MODE", "sometimes")
    with pytest.raises(ValueError, match="must be online, offline or disabled"):
        WandbLogger(run_dir=tmp_path / "run")


def test_a_column_of_mixed_types_is_written_as_text(tmp_path: Path):
    run_dir = tmp_path / "run"
    logger = WandbLogger(WandbLoggerConfig(project="mixed"), run_dir=run_dir)
    with open(run_dir / "samples.jsonl", "w", encoding="utf-8") as f:
        for index, reward in ((3, 1), ("a-7", 0.5)):
            f.write(json.dumps({"step": 1, "index": index, "reward": reward, "messages": [{"role": "user"}]}) + "\n")
    logger.log(1, {"x": 1.0})
    logger.close()
    (folder,) = _offline_runs(run_dir)
    (table,) = read_run(folder)["tables"].values()
    assert table["columns"] == ["step", "index", "reward", "messages"]
    assert [row[1:] for row in table["data"]] == [["3", 1, '[{"role": "user"}]'], ["a-7", 0.5, '[{"role": "user"}]']]
