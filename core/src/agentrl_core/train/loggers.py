"""The built-in metric sinks: ``jsonl`` (``<run_dir>/metrics.jsonl``) and ``tensorboard``.

Both take ``(config, run_dir=...)`` as the ``agentrl_loggers`` factories do and implement
``log(step, metrics)`` and ``close()``. Metrics are a flat or nested mapping; nested keys
are joined with ``/`` (``{"task": {"db": {"reward": 0.5}}}`` -> ``task/db/reward``).
Tensors and numpy scalars become Python numbers.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["JsonlLogger", "SamplesTail", "TensorboardLogger", "flatten_metrics"]


def _plain(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        return value.item()  # torch / numpy scalars
    if hasattr(value, "tolist") and callable(value.tolist):
        return value.tolist()
    return value


def flatten_metrics(metrics: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(key, value)`` pairs with nested mappings joined by ``/``."""
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from flatten_metrics(value, f"{name}/")
        else:
            yield name, _plain(value)


class SamplesTail:
    """The rows appended to ``<run_dir>/samples.jsonl`` since the last :meth:`read` (tracker loggers'
    sample tables).

    Rows already in the file when the tail is made belong to steps before this logger (or to the
    run it resumes) and are skipped; a line still being written waits for the next call; a line
    that is not JSON is skipped with a warning naming ``who``.
    """

    def __init__(self, run_dir: str | os.PathLike, who: str) -> None:
        self.path = Path(run_dir) / "samples.jsonl"
        self.who = who
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        rows = []
        for line in data[:end].splitlines():
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    log.warning("%s: skipping a samples.jsonl line that is not JSON", self.who)
        return rows


def _run_dir(run_dir: str | os.PathLike | None) -> Path:
    if run_dir is None:
        raise ValueError("a logger needs run_dir= (the run's output directory)")
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    return path


class JsonlLogger:
    """One JSON object per ``log`` call: ``{"step", "time", <flattened metrics>}``.

    Appends, so a resumed run continues the same file (steps after the checkpoint it
    resumed from appear twice; the later lines are the ones that count).
    """

    def __init__(self, config: Any = None, *, run_dir: str | os.PathLike | None = None, filename: str = "metrics.jsonl") -> None:
        self.path = _run_dir(run_dir) / filename
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        record: dict[str, Any] = {"step": int(step), "time": time.time()}
        for key, value in flatten_metrics(metrics):
            if isinstance(value, float) and not math.isfinite(value):
                value = str(value)  # JSON has no nan/inf
            record[key] = value
        self._file.write(json.dumps(record, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> JsonlLogger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class TensorboardLogger:
    """TensorBoard event files under ``<run_dir>/tensorboard``: numbers as scalars, text as text."""

    def __init__(self, config: Any = None, *, run_dir: str | os.PathLike | None = None, subdir: str = "tensorboard") -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # pragma: no cover - the train extra installs tensorboard
            raise ImportError("the tensorboard logger needs the tensorboard package: pip install 'agentrl-core[train]'") from exc
        self.path = _run_dir(run_dir) / subdir
        self._writer = SummaryWriter(log_dir=str(self.path))

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        for key, value in flatten_metrics(metrics):
            if isinstance(value, bool):
                value = float(value)
            if isinstance(value, (int, float)):
                self._writer.add_scalar(key, value, step)
            elif isinstance(value, str):
                self._writer.add_text(key, value, step)
            elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
                self._writer.add_text(key, "\n\n---\n\n".join(value), step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> TensorboardLogger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
