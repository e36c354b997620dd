"""The ``mlflow`` logger: a run's metrics, config and sample rollouts in an MLflow run.

What goes where:

- every ``log(step, metrics)`` call: the same flattened keys as ``metrics.jsonl``, as MLflow
  metrics at that step (keys made acceptable to MLflow by :func:`mlflow_key`);
- once, at start: ``<run_dir>/config.yaml`` (written by ``agentrl train`` before the loggers
  are built) flattened to ``section.key`` parameters, values truncated to MLflow's limit;
- the rows ``<run_dir>/samples.jsonl`` gained since the previous call (the decoded rollouts
  ``logging.sample_rollouts`` picks each step; core writes them just before calling the
  loggers) as a table artifact ``samples/step_<step>.json`` (``MlflowClient.log_table``);
- ``<run_dir>/mlflow_run.json``: the MLflow run id, so that a resumed run (same run folder)
  appends to the same MLflow run.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from attrs import field, frozen

from agentrl_core.train.loggers import SamplesTail, flatten_metrics

log = logging.getLogger(__name__)

__all__ = ["MlflowLogger", "MlflowLoggerConfig", "mlflow_key", "flatten_params", "RUN_FILE"]

RUN_FILE = "mlflow_run.json"

try:  # MLflow's own limits where this version exports them
    from mlflow.utils.validation import MAX_ENTITY_KEY_LENGTH, MAX_PARAM_VAL_LENGTH
except ImportError:  # pragma: no cover - older layouts
    MAX_ENTITY_KEY_LENGTH, MAX_PARAM_VAL_LENGTH = 250, 500
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100


@frozen
class MlflowLoggerConfig:
    """Config section ``logging.mlflow``."""

    # None: MLflow's own choice (the MLFLOW_TRACKING_URI variable, else its local default).
    # A server (http://host:5000), a database (sqlite:///mlflow.db) or a folder (file:/path/mlruns).
    tracking_uri: str | None = None
    # None: the MLFLOW_EXPERIMENT_NAME variable, else "agentrl"; created if missing
    experiment: str | None = None
    run_name: str | None = None  # None: run.name from the run's config, else the run folder's name
    tags: dict[str, str] = field(factory=dict)  # extra tags on the MLflow run
    log_config: bool = True  # the run config as parameters
    log_samples: bool = True  # samples.jsonl rows as table artifacts


_UNSAFE = re.compile(r"[^\w\-. /]")


def mlflow_key(key: str) -> str:
    """``key`` as MLflow accepts it for a metric or parameter name.

    MLflow allows letters, digits, ``_ - . /`` and space, and refuses names that are not
    a normalised path (``a//b``, ``a/./b``, ``../x``, a leading or trailing ``/``). Every
    other character becomes ``_``; empty, ``.`` and ``..`` path parts become ``_``; a
    name longer than MLflow's limit (250) is cut. Keys agentrl itself writes
    (``task/db-std/reward``) come through unchanged.
    """
    parts = [_UNSAFE.sub("_", part) for part in key.split("/")]
    parts = ["_" if part in ("", ".", "..") else part for part in parts]
    return "/".join(parts)[:MAX_ENTITY_KEY_LENGTH]


def flatten_params(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(dotted key, string value)`` for every leaf of a nested config; lists as JSON."""
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from flatten_params(value, f"{name}.")
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            if len(text) > MAX_PARAM_VAL_LENGTH:
                text = text[: MAX_PARAM_VAL_LENGTH - 3] + "..."
            yield name, text


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    return None


class MlflowLogger:
    """``log(step, metrics)`` to one MLflow run; ``close()`` marks it finished."""

    def __init__(self, config: MlflowLoggerConfig | None = None, *, run_dir: str | os.PathLike | None = None) -> None:
        from mlflow.tracking import MlflowClient

        if run_dir is None:
            raise ValueError("the mlflow logger needs run_dir= (the run's output directory)")
        self.config = config or MlflowLoggerConfig()
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        uri = self.config.tracking_uri
        if uri is not None and (uri.startswith("file:") or "://" not in uri):
            # MLflow 3 refuses its file store unless asked for it; a configured folder is that request
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        self.tracking_uri = self.client.tracking_uri
        run_config = self._read_run_config()
        self.run_id, self.resumed = self._open_run(run_config)
        self.experiment_id = self.client.get_run(self.run_id).info.experiment_id
        if self.config.log_config and run_config:
            self._log_params(run_config)
        self._samples = SamplesTail(self.run_dir, "mlflow")  # rows of this logger's steps only
        self._closed = False
        log.info("mlflow: %s run %s (%s)", "resumed" if self.resumed else "started", self.run_id, self.url or self.tracking_uri)

    # -- run ---------------------------------------------------------------------------------------

    @property
    def url(self) -> str | None:
        """The run's page when the tracking URI is a server, else None."""
        if self.tracking_uri.startswith(("http://", "https://")):
            return f"{self.tracking_uri.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.run_id}"
        return None

    def _read_run_config(self) -> dict[str, Any]:
        path = self.run_dir / "config.yaml"
        if not path.exists():
            return {}
        import yaml

        return yaml.safe_load(path.read_text()) or {}

    def _experiment_id(self) -> str:
        name = self.config.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "agentrl"
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        return self.client.create_experiment(name)

    def _open_run(self, run_config: Mapping[str, Any]) -> tuple[str, bool]:
        from mlflow.entities import RunStatus
        from mlflow.exceptions import MlflowException

        run_file = self.run_dir / RUN_FILE
        if run_file.exists():
            saved = json.loads(run_file.read_text())
            if saved.get("tracking_uri") == self.tracking_uri:
                try:
                    run = self.client.get_run(saved["run_id"])
                except MlflowException as exc:
                    raise RuntimeError(
                        f"{run_file} names MLflow run {saved['run_id']}, which {self.tracking_uri} does not have "
                        f"({exc.error_code}); delete the file to start a new MLflow run"
                    ) from exc
                if run.info.status != RunStatus.to_string(RunStatus.RUNNING):
                    self.client.update_run(run.info.run_id, status="RUNNING")
                return run.info.run_id, True
            log.warning("mlflow: %s is for %s, not %s; starting a new MLflow run",
                        run_file, saved.get("tracking_uri"), self.tracking_uri)
        name = self.config.run_name or (run_config.get("run") or {}).get("name") or self.run_dir.name
        tags = {"agentrl.run_dir": str(self.run_dir.resolve()), **self.config.tags}
        run = self.client.create_run(self._experiment_id(), run_name=name, tags=tags)
        tmp = run_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"run_id": run.info.run_id, "experiment_id": run.info.experiment_id,
                                   "tracking_uri": self.tracking_uri}) + "\n")
        tmp.replace(run_file)
        return run.info.run_id, False

    def _log_params(self, run_config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = {mlflow_key(k): v for k, v in flatten_params(run_config)}
        if self.resumed:  # MLflow refuses to change a parameter: keep the first value, say which differ
            existing = self.client.get_run(self.run_id).data.params
            changed = sorted(k for k, v in params.items() if k in existing and existing[k] != v)
            if changed:
                log.warning("mlflow: the resumed run's config differs in %s; MLflow keeps the first values",
                            ", ".join(changed))
            params = {k: v for k, v in params.items() if k not in existing}
        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[i:i + MAX_PARAMS_PER_BATCH])

    # -- logger protocol ---------------------------------------------------------------------------

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch: dict[str, Metric] = {}
        for key, value in flatten_metrics(metrics):
            number = _number(value)
            if number is None:
                continue  # MLflow metrics are numbers; text goes nowhere here
            name = mlflow_key(key)
            if name in batch and name != key:
                log.warning("mlflow: metric %r maps to %r, which another key already has this step", key, name)
            batch[name] = Metric(name, number, now, int(step))
        items = list(batch.values())
        for i in range(0, len(items), MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=items[i:i + MAX_METRICS_PER_BATCH])
        if self.config.log_samples:
            self._log_samples(int(step))

    def _log_samples(self, step: int) -> None:
        rows = self._samples.read()
        if not rows:
            return
        columns: dict[str, list[Any]] = {}
        keys = list(dict.fromkeys(k for row in rows for k in row))
        for key in keys:
            columns[key] = [row.get(key) for row in rows]
        self.client.log_table(self.run_id, data=columns, artifact_file=f"samples/step_{step:06d}.json")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.client.set_terminated(self.run_id, "FINISHED")

    def __enter__(self) -> MlflowLogger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
