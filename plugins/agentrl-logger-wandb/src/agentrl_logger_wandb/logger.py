"""The ``wandb`` logger: a run's metrics, config and sample rollouts in a Weights & Biases run.

What goes where:

- every ``log(step, metrics)`` call: the same flattened keys as ``metrics.jsonl`` plus
  ``step`` (the training step), one ``run.log`` call; every metric is plotted against
  ``step`` (``define_metric("*", step_metric="step")``), not W&B's own ``_step`` counter,
  so a resumed run (which trains the steps after its checkpoint again) appends instead of
  being refused for a step that went backwards;
- once, at start: ``<run_dir>/config.yaml`` (written by ``agentrl train`` before the loggers
  are built) as the run's config, nested as in the file;
- the rows ``<run_dir>/samples.jsonl`` gained since the previous call (the decoded rollouts
  ``logging.sample_rollouts`` picks each step; core writes them just before calling the
  loggers) as a ``wandb.Table`` under the key ``samples``;
- ``<run_dir>/wandb_run.json``: the W&B run id, so that a resumed run (same run folder)
  continues the same W&B run, online or offline.

Offline (``mode: offline`` or ``WANDB_MODE=offline``) W&B writes everything under
``<dir>/wandb/offline-run-*``; ``wandb sync`` uploads it later (a resumed offline run is a
second folder with the same run id, which ``wandb sync`` uploads after the first).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from attrs import field, frozen

from agentrl_core.train.loggers import SamplesTail, flatten_metrics

log = logging.getLogger(__name__)

__all__ = ["WandbLogger", "WandbLoggerConfig", "RUN_FILE"]

RUN_FILE = "wandb_run.json"


@frozen
class WandbLoggerConfig:
    """Config section ``logging.wandb``."""

    project: str | None = None  # None: the WANDB_PROJECT variable, else "agentrl"
    entity: str | None = None  # team or user; None: WANDB_ENTITY, else the API key's default entity
    # online: send as it trains (needs `wandb login` or WANDB_API_KEY); offline: write files for `wandb sync`;
    # disabled: nothing; None: the WANDB_MODE variable, else online
    mode: Literal["online", "offline", "disabled"] | None = None
    run_name: str | None = None  # None: run.name from the run's config, else the run folder's name
    group: str | None = None  # W&B's run group (runs compared together)
    tags: list[str] = field(factory=list)  # tags on the W&B run
    notes: str | None = None  # the run's description in W&B
    dir: str | None = None  # where W&B writes its wandb/ folder; None: the run folder
    log_config: bool = True  # the run config as the W&B run's config
    log_samples: bool = True  # samples.jsonl rows as a W&B table each step


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return value
    return None


class WandbLogger:
    """``log(step, metrics)`` to one W&B run; ``close()`` finishes it."""

    def __init__(self, config: WandbLoggerConfig | None = None, *, run_dir: str | os.PathLike | None = None) -> None:
        import wandb

        if run_dir is None:
            raise ValueError("the wandb logger needs run_dir= (the run's output directory)")
        self.config = config or WandbLoggerConfig()
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        run_config = self._read_run_config()
        c = self.config
        self.project = c.project or os.environ.get("WANDB_PROJECT") or "agentrl"
        self.mode = c.mode or os.environ.get("WANDB_MODE") or "online"
        if self.mode not in ("online", "offline", "disabled"):
            raise ValueError(f"logging.wandb.mode (or WANDB_MODE) must be online, offline or disabled, got {self.mode!r}")
        run_id, self.resumed = self._saved_run_id()
        wandb_dir = Path(c.dir) if c.dir else self.run_dir
        wandb_dir.mkdir(parents=True, exist_ok=True)
        name = c.run_name or (run_config.get("run") or {}).get("name") or self.run_dir.name
        self.run = wandb.init(
            project=self.project, entity=c.entity, mode=self.mode, name=name, group=c.group,
            tags=list(c.tags) or None, notes=c.notes, dir=str(wandb_dir), id=run_id,
            resume="allow" if self.resumed else None,
            config=run_config if c.log_config and run_config else None,
            allow_val_change=True,  # a resumed run's config may change a value
            reinit="create_new",  # several runs in one process (tests, notebooks) do not finish each other
        )
        self.run_id = self.run.id
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")
        if not self.resumed:
            self._save_run_id()
        self._samples = SamplesTail(self.run_dir, "wandb")  # rows of this logger's steps only
        self._closed = False
        where = self.url or (self.run.dir if self.mode == "offline" else self.mode)
        log.info("wandb: %s run %s (%s)", "resumed" if self.resumed else "started", self.run_id, where)

    # -- run ---------------------------------------------------------------------------------------

    @property
    def url(self) -> str | None:
        """The run's page when online, else None."""
        if self.mode != "online":
            return None
        return getattr(self.run, "url", None)

    @property
    def offline_dir(self) -> Path | None:
        """The folder ``wandb sync`` uploads, in offline mode (``<dir>/wandb/offline-run-<time>-<id>``)."""
        if self.mode != "offline":
            return None
        return Path(self.run.dir).parent

    def _read_run_config(self) -> dict[str, Any]:
        path = self.run_dir / "config.yaml"
        if not path.exists():
            return {}
        import yaml

        return yaml.safe_load(path.read_text()) or {}

    def _saved_run_id(self) -> tuple[str | None, bool]:
        run_file = self.run_dir / RUN_FILE
        if not run_file.exists():
            return None, False
        saved = json.loads(run_file.read_text())
        if saved.get("project") == self.project and saved.get("entity") == self.config.entity:
            return saved["run_id"], True
        log.warning("wandb: %s is for project %s/%s, not %s/%s; starting a new W&B run", run_file,
                    saved.get("entity"), saved.get("project"), self.config.entity, self.project)
        return None, False

    def _save_run_id(self) -> None:
        run_file = self.run_dir / RUN_FILE
        tmp = run_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"run_id": self.run.id, "project": self.project, "entity": self.config.entity,
                                   "mode": self.mode}) + "\n")
        tmp.replace(run_file)

    # -- logger protocol ---------------------------------------------------------------------------

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        record: dict[str, Any] = {}
        for key, value in flatten_metrics(metrics):
            number = _number(value)
            if number is not None:
                record[key] = number  # text and lists go nowhere here, as in metrics' other trackers
        record["step"] = int(step)
        if self.config.log_samples:
            table = self._samples_table()
            if table is not None:
                record["samples"] = table
        self.run.log(record)

    def _samples_table(self) -> Any:
        import wandb

        rows = self._samples.read()
        if not rows:
            return None
        columns = list(dict.fromkeys(k for row in rows for k in row))
        data = [[_cell(row.get(k)) for k in columns] for row in rows]
        for j in range(len(columns)):  # W&B refuses a column of mixed types (an index that is 3 or "a-7")
            kinds = {type(r[j]) for r in data if r[j] is not None}
            if len(kinds) > 1 and not kinds <= {int, float}:
                for r in data:
                    r[j] = None if r[j] is None else str(r[j])
        return wandb.Table(columns=columns, data=data)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.run.finish()

    def __enter__(self) -> WandbLogger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _cell(value: Any) -> Any:
    """A table cell: numbers and text as they are, anything else as JSON text (one type per column)."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return json.dumps(value, default=str)
