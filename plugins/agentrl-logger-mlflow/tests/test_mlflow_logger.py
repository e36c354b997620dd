"""The mlflow logger against a real tracking server and a file store."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from agentrl_logger_mlflow.logger import RUN_FILE, MlflowLogger, MlflowLoggerConfig, flatten_params, mlflow_key
from mlflow.tracking import MlflowClient

from agentrl_core.config import config_from_dict, config_to_dict
from agentrl_core.errors import ConfigError
from agentrl_core.registry import Registry
from agentrl_core.train.loggers import JsonlLogger
from agentrl_core.types import LoggerSpec


def test_mlflow_key_keeps_agentrl_keys_and_replaces_what_mlflow_refuses():
    assert mlflow_key("task/db-std/reward") == "task/db-std/reward"
    assert mlflow_key("version_lag/tokens/3") == "version_lag/tokens/3"
    assert mlflow_key("time/step_s") == "time/step_s"
    assert mlflow_key("a:b@c") == "a_b_c"
    assert mlflow_key("a//b") == "a/_/b"
    assert mlflow_key("../x/./y/") == "_/x/_/y/_"
    assert mlflow_key("/lead") == "_/lead"
    assert len(mlflow_key("k" * 400)) == 250


def test_flatten_params_dots_nested_keys_and_truncates_long_values():
    from agentrl_logger_mlflow.logger import MAX_PARAM_VAL_LENGTH

    params = dict(flatten_params({"rollout": {"n_samples": 8, "tags": ["a", "b"], "empty": {}},
                                  "run": {"name": "x", "seed": None}, "long": "y" * 10_000}))
    assert params["rollout.n_samples"] == "8"
    assert params["rollout.tags"] == '["a", "b"]'
    assert params["rollout.empty"] == "{}"
    assert params["run.name"] == "x"
    assert params["run.seed"] == "null"
    assert len(params["long"]) == MAX_PARAM_VAL_LENGTH and params["long"].endswith("...")


def _write_config(run_dir: Path, **overrides) -> dict:
    data = {"run": {"name": "mlflow-test", "output_dir": str(run_dir)},
            "rollout": {"n_samples": overrides.get("n_samples", 4)},
            "logging": {"loggers": ["jsonl", "mlflow"]}}
    config = config_to_dict(config_from_dict(data))
    if "extra" in overrides:
        config["run"]["extra_key"] = overrides["extra"]  # a key a resumed config might add
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return config


def _step_metrics(step: int) -> dict:
    return {"task": {"db-std": {"reward": 0.25 * step, "success": step % 2}},
            "version_lag/mean": 0.5, "grad_norm": 1.0 + step, "odd:key": float(step), "done": step == 3}


def _run_steps(run_dir: Path, logger: MlflowLogger, steps: range) -> None:
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
        keys |= set(json.loads(line)) - {"step", "time"}
    return keys


def _check_run(tracking_uri: str, run_dir: Path, steps: int) -> None:
    client = MlflowClient(tracking_uri=tracking_uri)
    run_id = json.loads((run_dir / RUN_FILE).read_text())["run_id"]
    run = client.get_run(run_id)
    # the same keys as metrics.jsonl, after the documented sanitising (":" -> "_")
    assert set(run.data.metrics) == {mlflow_key(k) for k in _jsonl_keys(run_dir)}
    assert "odd_key" in run.data.metrics and "task/db-std/reward" in run.data.metrics
    history = client.get_metric_history(run_id, "task/db-std/reward")
    assert sorted((m.step, m.value) for m in history) == [(s, 0.25 * s) for s in range(1, steps + 1)]
    assert [m.value for m in sorted(client.get_metric_history(run_id, "done"), key=lambda m: m.step)] == \
        [1.0 if s == 3 else 0.0 for s in range(1, steps + 1)]
    assert run.data.params["rollout.n_samples"] == "4"
    assert run.data.params["run.name"] == "mlflow-test"
    assert run.data.params["logging.loggers"] == '["jsonl", "mlflow"]'
    assert run.info.run_name == "mlflow-test"
    assert run.data.tags["agentrl.run_dir"] == str(run_dir.resolve())
    tables = {a.path for a in client.list_artifacts(run_id, "samples")}
    assert tables == {f"samples/step_{s:06d}.json" for s in range(1, steps + 1)}
    table = json.loads(Path(client.download_artifacts(run_id, "samples/step_000002.json", str(run_dir / "dl"))).read_text())
    assert table["columns"][:3] == ["step", "uid", "task"]
    assert [row[1] for row in table["data"]] == ["u2-0", "u2-1"]  # only that step's rows


def _resume_and_check(tracking_uri: str, run_dir: Path, options: dict) -> None:
    registry = Registry()
    logger = registry.build(LoggerSpec, "mlflow", options, run_dir=run_dir)
    first_id = logger.run_id
    assert not logger.resumed
    _run_steps(run_dir, logger, range(1, 4))
    logger.close()
    client = MlflowClient(tracking_uri=tracking_uri)
    assert client.get_run(first_id).info.status == "FINISHED"
    _check_run(tracking_uri, run_dir, 3)

    # resume: the same run folder, a config that changed one value and added one key
    _write_config(run_dir, n_samples=16, extra="new")
    logger = registry.build(LoggerSpec, "mlflow", options, run_dir=run_dir)
    assert logger.resumed and logger.run_id == first_id
    assert client.get_run(first_id).info.status == "RUNNING"
    _run_steps(run_dir, logger, range(4, 6))
    logger.close()
    run = client.get_run(first_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["rollout.n_samples"] == "4"  # MLflow keeps the first value
    assert run.data.params["run.extra_key"] == "new"
    _check_run(tracking_uri, run_dir, 5)
    assert len(client.search_runs([run.info.experiment_id])) == 1


def test_tracking_server_run_and_resume(mlflow_server: str, tmp_path: Path):
    run_dir = tmp_path / "run"
    _write_config(run_dir)
    _resume_and_check(mlflow_server, run_dir, {"tracking_uri": mlflow_server, "experiment": "server-test"})
    logger = MlflowLogger(MlflowLoggerConfig(tracking_uri=mlflow_server, experiment="server-test"), run_dir=run_dir)
    assert logger.url == f"{mlflow_server}/#/experiments/{logger.experiment_id}/runs/{logger.run_id}"
    logger.close()


def test_file_store_run_and_resume(tmp_path: Path):
    run_dir = tmp_path / "run"
    _write_config(run_dir)
    uri = (tmp_path / "mlruns").as_uri()
    _resume_and_check(uri, run_dir, {"tracking_uri": uri, "experiment": "file-test"})
    assert (tmp_path / "mlruns").is_dir()


def test_config_section_reaches_the_logger_through_the_trainer(tmp_path: Path):
    from agentrl_core.jobs.training import Trainer

    uri = (tmp_path / "mlruns").as_uri()
    config = config_from_dict({"run": {"name": "job", "output_dir": str(tmp_path / "run")},
                               "logging": {"loggers": ["jsonl", "mlflow"],
                                           "mlflow": {"tracking_uri": uri, "experiment": "job-exp",
                                                      "tags": {"team": "rl"}}}})
    assert config.logging.options["mlflow"] == MlflowLoggerConfig(tracking_uri=uri, experiment="job-exp",
                                                                   tags={"team": "rl"})
    assert config_from_dict(config_to_dict(config)).logging.options == config.logging.options
    job = SimpleNamespace(registry=Registry(), config=config, run_dir=tmp_path / "run")
    jsonl, logger = Trainer._loggers(job)
    try:
        run = MlflowClient(tracking_uri=uri).get_run(logger.run_id)
        assert run.data.tags["team"] == "rl"
        assert MlflowClient(tracking_uri=uri).get_experiment(run.info.experiment_id).name == "job-exp"
    finally:
        logger.close()
        jsonl.close()


def test_unknown_option_is_a_config_error():
    with pytest.raises(ConfigError, match="logging.mlflow"):
        config_from_dict({"logging": {"loggers": ["mlflow"], "mlflow": {"trackinguri": "x"}}})


def test_resume_against_a_store_without_the_run_says_what_to_do(tmp_path: Path):
    run_dir = tmp_path / "run"
    uri = (tmp_path / "mlruns").as_uri()
    (run_dir).mkdir()
    (run_dir / RUN_FILE).write_text(json.dumps({"run_id": "0" * 32, "tracking_uri": uri}))
    with pytest.raises(RuntimeError, match="delete the file to start a new MLflow run"):
        MlflowLogger(MlflowLoggerConfig(tracking_uri=uri), run_dir=run_dir)
