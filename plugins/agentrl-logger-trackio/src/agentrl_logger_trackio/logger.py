"""The ``trackio`` logger: a run's metrics, config and sample rollouts in a Trackio run.

What goes where:

- every ``log(step, metrics)`` call: the same flattened keys as ``metrics.jsonl``, as one
  Trackio log entry at that step (``step`` itself is Trackio's step column, not a metric);
- once, at start: ``<run_dir>/config.yaml`` (written by ``agentrl train`` before the loggers
  are built) as the run's config, nested as in the file;
- the rows ``<run_dir>/samples.jsonl`` gained since the previous call (the decoded rollouts
  ``logging.sample_rollouts`` picks each step; core writes them just before calling the
  loggers) as a ``trackio.Table`` under the key ``samples`` at that step;
- ``<run_dir>/trackio_run.json``: the Trackio project and run name, so that a resumed run
  (same run folder) continues the same Trackio run.

Trackio keeps everything in a local SQLite database per project, under ``$TRACKIO_DIR``
(default ``~/.cache/huggingface/trackio``); ``trackio show`` serves its dashboard. With
``space_id`` or ``server_url`` it sends to a Hugging Face Space or a Trackio server instead.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrs import frozen

from agentrl_core.train.loggers import SamplesTail, flatten_metrics

log = logging.getLogger(__name__)

__all__ = ["TrackioLogger", "TrackioLoggerConfig", "RUN_FILE", "RESERVED"]

RUN_FILE = "trackio_run.json"
# keys Trackio keeps for itself (a metric named so would be stored as "__<key>"); "step" is its step column
RESERVED = frozenset({"project", "run", "timestamp", "step", "time", "metrics"})


@frozen
class TrackioLoggerConfig:
    """Config section ``logging.trackio``."""

    project: str | None = None  # None: the TRACKIO_PROJECT variable, else "agentrl"
    run_name: str | None = None  # None: run.name from the run's config, else the run folder's name
    group: str | None = None  # Trackio's run group (runs shown together)
    # a Hugging Face Space ("user/name") to log to instead of the local database (needs a token)
    space_id: str | None = None
    server_url: str | None = None  # a self-hosted Trackio server (http://...) instead of the local database
    # Trackio's own CPU/GPU metrics every 10 s; None: Trackio's choice (on when psutil / a GPU is there)
    system_metrics: bool | None = None
    log_config: bool = True  # the run config as the Trackio run's config
    log_samples: bool = True  # samples.jsonl rows as a Trackio table each step


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return value
    return None


class TrackioLogger:
    """``log(step, metrics)`` to one Trackio run; ``close()`` finishes it."""

    def __init__(self, config: TrackioLoggerConfig | None = None, *, run_dir: str | os.PathLike | None = None) -> None:
        import trackio

        if run_dir is None:
            raise ValueError("the trackio logger needs run_dir= (the run's output directory)")
        self.config = c = config or TrackioLoggerConfig()
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        run_config = self._read_run_config()
        self.project = c.project or os.environ.get("TRACKIO_PROJECT") or "agentrl"
        saved = self._saved_run()
        self.resumed = saved is not None
        name = saved or c.run_name or (run_config.get("run") or {}).get("name") or self.run_dir.name
        kwargs: dict[str, Any] = {}
        if c.system_metrics is not None:
            kwargs.update(auto_log_cpu=c.system_metrics, auto_log_gpu=c.system_metrics)
        try:
            self.run = trackio.init(
                project=self.project, name=name, group=c.group, space_id=c.space_id, server_url=c.server_url,
                config=run_config if c.log_config and run_config else None,
                resume="must" if self.resumed else "never", embed=False, **kwargs,
            )
        except ValueError as exc:
            if not self.resumed:
                raise
            raise RuntimeError(
                f"{self.run_dir / RUN_FILE} names Trackio run {name!r} of project {self.project!r}, which this "
                f"Trackio storage does not have ({exc}); delete the file to start a new Trackio run"
            ) from exc
        self.run_name = self.run.name
        if not self.resumed:
            self._save_run()
        self._samples = SamplesTail(self.run_dir, "trackio")  # rows of this logger's steps only
        self._closed = False
        log.info("trackio: %s run %s of project %s (%s)", "resumed" if self.resumed else "started", self.run_name,
                 self.project, self.url or f'trackio show --project "{self.project}"')

    # -- run ---------------------------------------------------------------------------------------

    @property
    def url(self) -> str | None:
        """The run's dashboard on a Space or a server, else None (``trackio show`` serves local runs)."""
        if self.config.space_id is None and self.config.server_url is None:
            return None
        return getattr(self.run, "url", None)

    def _read_run_config(self) -> dict[str, Any]:
        path = self.run_dir / "config.yaml"
        if not path.exists():
            return {}
        import yaml

        return yaml.safe_load(path.read_text()) or {}

    def _saved_run(self) -> str | None:
        run_file = self.run_dir / RUN_FILE
        if not run_file.exists():
            return None
        saved = json.loads(run_file.read_text())
        where = (self.project, self.config.space_id, self.config.server_url)
        if (saved.get("project"), saved.get("space_id"), saved.get("server_url")) == where:
            return saved["run"]
        log.warning("trackio: %s is for project %s (space %s, server %s), not %s (space %s, server %s); "
                    "starting a new Trackio run", run_file, saved.get("project"), saved.get("space_id"),
                    saved.get("server_url"), *where)
        return None

    def _save_run(self) -> None:
        run_file = self.run_dir / RUN_FILE
        tmp = run_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"project": self.project, "run": self.run_name, "run_id": self.run.id,
                                   "space_id": self.config.space_id, "server_url": self.config.server_url}) + "\n")
        tmp.replace(run_file)

    # -- logger protocol ---------------------------------------------------------------------------

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        import trackio

        record: dict[str, Any] = {}
        for key, value in flatten_metrics(metrics):
            number = _number(value)
            if number is None or key in RESERVED:
                continue  # numbers only; "step" is the entry's step
            record[key] = number
        if self.config.log_samples:
            rows = self._samples.read()
            if rows:
                columns = list(dict.fromkeys(k for row in rows for k in row))
                data = [[_cell(row.get(k)) for k in columns] for row in rows]
                record["samples"] = trackio.Table(columns=columns, data=data, allow_mixed_types=True)
        self.run.log(record, step=int(step))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.run.finish()

    def __enter__(self) -> TrackioLogger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _cell(value: Any) -> Any:
    """A table cell: numbers and text as they are, anything else as JSON text."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return json.dumps(value, default=str)
