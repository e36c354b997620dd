"""The trackio logger against Trackio's local storage: what it stored is read back through Trackio."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from agentrl_logger_trackio.logger import RUN_FILE, TrackioLogger, TrackioLoggerConfig
from trackio.sqlite_storage import SQLiteStorage

from agentrl_core.config import config_from_dict, config_to_dict
from agentrl_core.errors import ConfigError
from agentrl_core.registry import Registry
from agentrl_core.train.loggers import JsonlLogger
from agentrl_core.types import LoggerSpec

QUIET = {"system_metrics": False}  # no CPU sampling thread in the tests


def _write_config(run_dir: Path, **overrides) -> dict:
    data = {"run": {"name": overrides.get("name", "trackio-test"), "output_dir": str(run_dir)},
            "rollout": {"n_samples": overrides.get("n_samples", 4)},
            "logging": {"loggers": ["jsonl", "trackio"]}}
    config = config_to_dict(config_from_dict(data))
    if "extra" in overrides:
        config["run"]["extra_key"] = overrides["extra"]  # a key a resumed config might add
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return config


def _step_metrics(step: int) -> dict:
    return {"task": {"db-std": {"reward": 0.25 * step, "success": step % 2}}, "step": step,
            "version_lag/mean": 0.5, "grad_norm": 1.0 + step, "odd:key": float(step), "done": step == 3}


def _run_steps(run_dir: Path, logger: TrackioLogger, steps: range) -> None:
    """What Trainer._log does: samples.jsonl first, then every logger."""
    with JsonlLogger(run_dir=run_dir) as jsonl:
        for step in steps:
            with open(run_dir / "samples.jsonl", "a", encoding="utf-8") as f:
                for uid in range(2):
                    f.write(json.dumps({"step": step, "uid": f"u{step}-{uid}", "task": "db-std", "index": uid,
                                        "reward": float(uid), "status": "completed", "text": f"turn text {step}",
                                        "tools": ["a", "b"]}) + "\n")
            metrics = _step_metrics(step)
            jsonl.log(step, metrics)
            logger.log(step, metrics)


def _jsonl_keys(run_dir: Path) -> set[str]:
    keys: set[str] = set()
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        keys |= set(json.loads(line)) - {"time"}
    return keys


def _check_run(project: str, run: str, run_dir: Path, steps: list[int], config: dict) -> None:
    logs = SQLiteStorage.get_logs(project, run)
    assert [entry["step"] for entry in logs] == steps
    for entry in logs:
        s = entry["step"]
        # metrics.jsonl's keys ("step" is Trackio's own column), ":" included, and the step's table
        assert set(entry) - {"timestamp", "samples"} == _jsonl_keys(run_dir)
        assert entry["task/db-std/reward"] == 0.25 * s
        assert entry["done"] == (1 if s == 3 else 0)
        assert entry["grad_norm"] == 1.0 + s
        assert entry["samples"]["_type"] == "trackio.table"
        rows = entry["samples"]["_value"]
        assert [r["uid"] for r in rows] == [f"u{s}-0", f"u{s}-1"]
        assert rows[0] == {"step": s, "uid": f"u{s}-0", "task": "db-std", "index": 0, "reward": 0.0,
                           "status": "completed", "text": f"turn text {s}", "tools": '["a", "b"]'}
    stored = SQLiteStorage.get_run_config(project, run)
    assert {k: v for k, v in stored.items() if not k.startswith("_")} == config


def test_local_run_and_resume_continue_the_same_run(tmp_path: Path):
    run_dir = tmp_path / "run"
    config = _write_config(run_dir)
    registry = Registry()
    options = {"project": "resume-test", **QUIET}
    logger = registry.build(LoggerSpec, "trackio", options, run_dir=run_dir)
    assert not logger.resumed and logger.run_name == "trackio-test" and logger.url is None
    first_id = logger.run.id
    _run_steps(run_dir, logger, range(1, 4))
    logger.close()
    assert json.loads((run_dir / RUN_FILE).read_text())["run"] == "trackio-test"
    _check_run("resume-test", "trackio-test", run_dir, [1, 2, 3], config)

    # resume: the same run folder, a config that changed one value and added one key; the
    # checkpoint was at step 2, so step 3 is trained (and logged) again
    resumed_config = _write_config(run_dir, n_samples=16, extra="new")
    logger = registry.build(LoggerSpec, "trackio", options, run_dir=run_dir)
    assert logger.resumed and logger.run.id == first_id
    _run_steps(run_dir, logger, range(3, 5))
    logger.close()
    assert SQLiteStorage.get_runs("resume-test") == ["trackio-test"]
    # the history keeps both step-3 entries, as metrics.jsonl does; the config is the latest invocation's
    _check_run("resume-test", "trackio-test", run_dir, [1, 2, 3, 3, 4], resumed_config)


def test_a_run_folder_for_a_run_the_storage_lacks_says_what_to_do(tmp_path: Path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / RUN_FILE).write_text(json.dumps({"project": "lost", "run": "gone", "space_id": None,
                                                "server_url": None}))
    with pytest.raises(RuntimeError, match="delete the file to start a new Trackio run"):
        TrackioLogger(TrackioLoggerConfig(project="lost", **QUIET), run_dir=run_dir)


def test_another_project_starts_a_new_run(tmp_path: Path):
    run_dir = tmp_path / "run"
    _write_config(run_dir, name="moved")
    with TrackioLogger(TrackioLoggerConfig(project="first", **QUIET), run_dir=run_dir) as logger:
        logger.log(1, {"x": 1.0})
    with TrackioLogger(TrackioLoggerConfig(project="second", **QUIET), run_dir=run_dir) as logger:
        assert not logger.resumed
        logger.log(1, {"x": 2.0})
    assert json.loads((run_dir / RUN_FILE).read_text())["project"] == "second"
    assert [e["x"] for e in SQLiteStorage.get_logs("second", "moved")] == [2.0]


def test_log_config_and_log_samples_off(tmp_path: Path):
    run_dir = tmp_path / "run"
    _write_config(run_dir)
    logger = TrackioLogger(TrackioLoggerConfig(project="quiet", run_name="named", log_config=False,
                                               log_samples=False, **QUIET), run_dir=run_dir)
    _run_steps(run_dir, logger, range(1, 3))
    logger.close()
    logs = SQLiteStorage.get_logs("quiet", "named")
    assert [e["step"] for e in logs] == [1, 2] and not any("samples" in e for e in logs)
    config = SQLiteStorage.get_run_config("quiet", "named") or {}
    assert {k: v for k, v in config.items() if not k.startswith("_")} == {}


def test_config_section_reaches_the_logger_through_the_trainer(tmp_path: Path):
    from agentrl_core.jobs.training import Trainer

    config = config_from_dict({"run": {"name": "job", "output_dir": str(tmp_path / "run")},
                               "logging": {"loggers": ["jsonl", "trackio"],
                                           "trackio": {"project": "job-project", "group": "g1", **QUIET}}})
    assert config.logging.options["trackio"] == TrackioLoggerConfig(project="job-project", group="g1", **QUIET)
    assert config_from_dict(config_to_dict(config)).logging.options == config.logging.options
    job = SimpleNamespace(registry=Registry(), config=config, run_dir=tmp_path / "run")
    jsonl, logger = Trainer._loggers(job)
    try:
        logger.log(1, {"x": 1.0})
    finally:
        logger.close()
        jsonl.close()
    assert SQLiteStorage.get_runs("job-project") == ["run"]  # no config.yaml here: the run folder's name
    assert SQLiteStorage.get_run_config("job-project", "run")["_Group"] == "g1"
    assert (Path(os.environ["TRACKIO_DIR"]) / "job-project.db").exists()


def test_unknown_option_is_a_config_error():
    with pytest.raises(ConfigError, match="logging.trackio"):
        config_from_dict({"logging": {"loggers": ["trackio"], "trackio": {"projekt": "x"}}})
