"""What the viewer reads: run folders, their trajectory store (read-only) and ``metrics.jsonl``.

Every function opens its own read-only connection and closes it, so each answer is a fresh
snapshot: a run that is still writing (WAL mode) shows every step committed so far, and the
viewer never takes a lock the writer could wait on.
"""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentrl_core.errors import AgentrlError
from agentrl_core.train.trajstore import FILENAME, read_tokens

__all__ = ["ViewError", "BadFilter", "find_runs", "read_metrics", "open_store", "steps", "tasks", "groups", "trajectories",
           "trajectory", "FILTER_KEYS"]

METRICS = "metrics.jsonl"
LIVE_SECONDS = 120.0  # a run whose files changed this recently is shown as running
_SUMMARY_COLUMNS = ("id", "kind", "step", "uid", "task", "split", "task_index", "group_id", "sample", "model", "status",
                    "failure", "reward", "training_reward", "advantage", "num_turns", "num_tokens",
                    "num_action_tokens", "min_version", "max_version")
FILTER_KEYS = ("kind", "step", "task", "index", "group", "status", "min_reward", "max_reward")


class ViewError(AgentrlError):
    """A request the viewer cannot answer: something it names is not there (HTTP ``status`` 404)."""

    status = 404


class BadFilter(ViewError):
    """A filter value that is not what it must be (a number)."""

    status = 400


def is_run(path: Path) -> bool:
    return (path / FILENAME).is_file() or (path / METRICS).is_file()


def find_runs(root: Path) -> dict[str, Path]:
    """The runs under ``root``: ``root`` itself when it is a run, else the runs among its sub-folders
    (two levels deep: ``runs/<name>`` and ``runs/<group>/<name>``), by their path relative to ``root``."""
    if is_run(root):
        return {root.name: root}
    found: dict[str, Path] = {}
    for child in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if is_run(child):
            found[child.name] = child
            continue
        with contextlib.suppress(OSError):
            for grandchild in sorted(p for p in child.iterdir() if p.is_dir() and not p.name.startswith(".")):
                if is_run(grandchild):
                    found[f"{child.name}/{grandchild.name}"] = grandchild
    return found


@contextlib.contextmanager
def open_store(run_dir: Path) -> Iterator[sqlite3.Connection | None]:
    """A read-only connection to the run's store (None when the run has none)."""
    path = run_dir / FILENAME
    if not path.is_file():
        yield None
        return
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=10.0,
                               check_same_thread=False)
    except sqlite3.Error as exc:
        raise ViewError(f"cannot open the trajectory store {path} read-only: {exc}") from None
    conn.row_factory = sqlite3.Row
    try:
        yield conn
    finally:
        conn.close()


def run_summary(name: str, run_dir: Path) -> dict[str, Any]:
    """One line of the run list: sizes, last step, and whether it looks alive."""
    files = [run_dir / FILENAME, run_dir / f"{FILENAME}-wal", run_dir / METRICS]
    mtimes = [p.stat().st_mtime for p in files if p.exists()]
    updated = max(mtimes, default=None)
    out: dict[str, Any] = {"name": name, "path": str(run_dir), "store": (run_dir / FILENAME).is_file(),
                           "metrics": (run_dir / METRICS).is_file(), "updated": updated,
                           "running": updated is not None and time.time() - updated < LIVE_SECONDS
                           and not (run_dir / "summary.json").exists(),
                           "finished": (run_dir / "summary.json").exists(), "kinds": {}, "last_step": None}
    with open_store(run_dir) as conn:
        if conn is not None:
            for row in conn.execute("SELECT kind, count(*) AS n, max(step) AS last FROM trajectories GROUP BY kind"):
                out["kinds"][row["kind"]] = row["n"]
                if row["last"] is not None:
                    out["last_step"] = max(out["last_step"] or 0, row["last"])
    return out


def steps(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Per kind and step: how many trajectories, their mean reward and success, and the statuses."""
    rows = conn.execute(
        "SELECT kind, step, count(*) AS trajectories, avg(reward) AS reward, avg(reward >= 1) AS success, "
        "avg(advantage != 0) AS nonzero_advantage, min(time) AS time, "
        "sum(status = 'completed') AS completed FROM trajectories GROUP BY kind, step ORDER BY step DESC, kind")
    return [dict(r) for r in rows]


def tasks(conn: sqlite3.Connection, kind: str | None = None) -> list[dict[str, Any]]:
    """Per task: trajectories, reward, success, and the steps it appears in."""
    where, args = ("WHERE kind = ?", [kind]) if kind else ("", [])
    rows = conn.execute(
        f"SELECT task, count(*) AS trajectories, avg(reward) AS reward, avg(reward >= 1) AS success, "
        f"count(DISTINCT task_index) AS indices, min(step) AS first_step, max(step) AS last_step "
        f"FROM trajectories {where} GROUP BY task ORDER BY task", args)
    return [dict(r) for r in rows]


def _filters(params: dict[str, str]) -> tuple[str, list[Any]]:
    """The WHERE clause of a listing's filters (each one optional; an empty value is no filter)."""
    clauses: list[str] = []
    args: list[Any] = []
    for key in ("kind", "task", "status"):
        if params.get(key):
            clauses.append(f"{key} = ?")
            args.append(params[key])
    if params.get("group"):
        clauses.append("group_id = ?")
        args.append(params["group"])
    if params.get("index"):
        clauses.append("CAST(task_index AS TEXT) = ?")
        args.append(params["index"])
    if params.get("step"):
        clauses.append("step = ?")
        args.append(_number(params, "step", int))
    for key, op in (("min_reward", ">="), ("max_reward", "<=")):
        if params.get(key):
            clauses.append(f"reward {op} ?")
            args.append(_number(params, key, float))
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", args


def _number(params: dict[str, str], key: str, kind: type) -> Any:
    try:
        value = kind(params[key])
    except ValueError:
        raise BadFilter(f"the filter {key}={params[key]!r} is not a number") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise BadFilter(f"the filter {key}={params[key]!r} is not a finite number")
    return value


def trajectories(conn: sqlite3.Connection, params: dict[str, str]) -> dict[str, Any]:
    """The trajectories matching the filters (newest step first), without messages or tokens."""
    where, args = _filters(params)
    limit = min(_number(params, "limit", int) if params.get("limit") else 200, 2000)
    offset = _number(params, "offset", int) if params.get("offset") else 0
    total = conn.execute(f"SELECT count(*) FROM trajectories{where}", args).fetchone()[0]
    rows = conn.execute(
        f"SELECT {', '.join(_SUMMARY_COLUMNS)}, json_array_length(tool_calls) AS num_tool_calls FROM trajectories"
        f"{where} ORDER BY step DESC, task, group_id, sample, id LIMIT ? OFFSET ?", [*args, limit, offset])
    statuses = conn.execute(f"SELECT status, count(*) FROM trajectories{where} GROUP BY status", args).fetchall()
    return {"total": total, "limit": limit, "offset": offset, "statuses": {s: n for s, n in statuses},
            "trajectories": [dict(r) for r in rows]}


def groups(conn: sqlite3.Connection, params: dict[str, str]) -> list[dict[str, Any]]:
    """Groups (the samples of one prompt) matching the filters, with their reward spread."""
    where, args = _filters(params)
    rows = conn.execute(
        f"SELECT group_id, kind, step, task, CAST(task_index AS TEXT) AS task_index, count(*) AS samples, "
        f"min(reward) AS min_reward, max(reward) AS max_reward, avg(reward) AS reward, "
        f"group_concat(DISTINCT status) AS statuses FROM trajectories{where} "
        f"GROUP BY kind, step, group_id ORDER BY step DESC, task, group_id LIMIT 500", args)
    return [dict(r) for r in rows]


def trajectory(conn: sqlite3.Connection, trajectory_id: int, decode: Any = None) -> dict[str, Any]:
    """One trajectory in full: messages, tool calls, turns, metrics, and its tokens.

    ``decode(ids) -> list[str]`` gives each token's text (None: the token ids only).
    """
    row = conn.execute("SELECT * FROM trajectories WHERE id = ?", (trajectory_id,)).fetchone()
    if row is None:
        raise ViewError(f"there is no trajectory {trajectory_id} in this run (it may have been pruned: the store "
                        "keeps the last logging.trajectory_store_max_steps steps)")
    out = dict(row)
    for key in ("messages", "tool_calls", "turns", "metrics"):
        out[key] = json.loads(out[key]) if out[key] else None
    tokens = read_tokens(conn, trajectory_id)
    if tokens is not None:
        tokens["text"] = decode(tokens["input_ids"]) if decode is not None else None
    out["tokens"] = tokens
    same = conn.execute("SELECT id, kind, step, sample, reward, status FROM trajectories WHERE task = ? AND "
                        "CAST(task_index AS TEXT) IS CAST(? AS TEXT) ORDER BY step, kind, sample, id",
                        (row["task"], row["task_index"])).fetchall()
    out["same_task"] = [dict(r) for r in same]  # what the compare view picks from
    return out


def read_metrics(run_dir: Path) -> dict[str, Any]:
    """``metrics.jsonl``'s numeric scalars: the sorted keys, and one row per step, merging the lines of a
    step (a validation round logs its own line; a resumed run logs its steps again, the last value
    wins). A line still being written is skipped."""
    path = run_dir / METRICS
    if not path.is_file():
        return {"keys": [], "rows": []}
    by_step: dict[Any, dict[str, float]] = {}
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict):
                continue
            numeric = {k: float(v) for k, v in record.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
            by_step.setdefault(record.get("step", len(by_step)), {}).update(numeric)
    rows = [by_step[k] for k in sorted(by_step, key=lambda s: (not isinstance(s, (int, float)), s))]
    keys = sorted({k for r in rows for k in r} - {"step", "time"})
    return {"keys": keys, "rows": rows}
