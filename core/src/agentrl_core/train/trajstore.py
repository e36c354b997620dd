"""The trajectory store: every trajectory a run trained on (or evaluated), in SQLite.

``<run dir>/trajectories.sqlite`` holds, per trajectory, the task, index, group, sample,
messages, tool calls, rewards, status, advantage and turns, and per token the ids, loss
mask, sampling log-prob, policy version, and the learner's log-prob and importance ratio
(core/docs/observability.md documents the schema, with example queries).

The training loop only enqueues: :meth:`TrajectoryStore.add_step` hands the step's
(immutable) trajectories to a background writer thread, which serializes them and commits
one transaction per step. The database is in WAL mode, so readers (``sqlite3``, a viewer)
see committed steps while the run writes, and a killed run leaves every committed step
readable. The store is bounded: after each step, training trajectories older than
``max_steps`` steps are deleted (their pages are reused, so the file stops growing).
"""

from __future__ import annotations

import json
import logging
import math
import queue
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["TrajectoryStore", "SCHEMA_VERSION", "FILENAME", "tool_calls_of", "read_tokens"]

FILENAME = "trajectories.sqlite"
SCHEMA_VERSION = 1
_DIGITS = 6  # log-probs and ratios are stored rounded to 1e-6: exact enough to read, a third of repr's size

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS steps (
    run TEXT NOT NULL, kind TEXT NOT NULL, step INTEGER NOT NULL, time REAL NOT NULL,
    trajectories INTEGER NOT NULL, metrics TEXT,
    PRIMARY KEY (run, kind, step)
);
CREATE TABLE IF NOT EXISTS trajectories (
    id INTEGER PRIMARY KEY,
    run TEXT NOT NULL, kind TEXT NOT NULL, step INTEGER, time REAL NOT NULL,
    uid TEXT NOT NULL, task TEXT NOT NULL, split TEXT, task_index, group_id TEXT, sample INTEGER, model TEXT,
    status TEXT NOT NULL, failure TEXT, reward REAL, training_reward REAL, advantage REAL,
    num_turns INTEGER, num_tokens INTEGER, num_action_tokens INTEGER, prompt_length INTEGER,
    min_version INTEGER, max_version INTEGER,
    messages TEXT, tool_calls TEXT, turns TEXT, metrics TEXT
);
CREATE INDEX IF NOT EXISTS trajectories_step ON trajectories (run, kind, step);
CREATE INDEX IF NOT EXISTS trajectories_task ON trajectories (task, status);
CREATE INDEX IF NOT EXISTS trajectories_group ON trajectories (group_id);
CREATE TABLE IF NOT EXISTS tokens (
    trajectory_id INTEGER PRIMARY KEY REFERENCES trajectories (id) ON DELETE CASCADE,
    input_ids TEXT NOT NULL, loss_mask TEXT NOT NULL, logprobs TEXT NOT NULL, versions TEXT NOT NULL,
    learner_logprobs TEXT, ratios TEXT, advantages TEXT, sequence_lengths TEXT
);
"""


def connect(path: str | Path, *, timeout: float = 30.0) -> sqlite3.Connection:
    """A connection to a store (WAL, foreign keys on); the writer's and any reader's."""
    conn = sqlite3.connect(str(path), timeout=timeout, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")  # a commit survives a killed process (not a power cut)
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def tool_calls_of(messages: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """Every tool call of the assistant's messages, flattened: ``{turn, id, name, arguments}``.

    ``turn`` counts assistant messages from 0; ``arguments`` is the string the model wrote.
    """
    calls: list[dict[str, Any]] = []
    turn = -1
    for m in messages or []:
        if m.get("role") != "assistant":
            continue
        turn += 1
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            calls.append({"turn": turn, "id": call.get("id"), "name": fn.get("name"), "arguments": fn.get("arguments")})
    return calls


def _floats(values: Sequence[float] | None, mask: Sequence[int] | None = None) -> str | None:
    """A JSON list of rounded floats (``null`` where ``mask`` is 0 or a value is not finite)."""
    if values is None:
        return None
    out = []
    for i, v in enumerate(values):
        if (mask is not None and not mask[i]) or v is None or not math.isfinite(v):
            out.append(None)
        else:
            out.append(round(float(v), _DIGITS))
    return json.dumps(out, separators=(",", ":"))


def _ints(values: Sequence[int] | None) -> str | None:
    return None if values is None else json.dumps([int(v) for v in values], separators=(",", ":"))


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, default=str)


def read_tokens(conn: sqlite3.Connection, trajectory_id: int) -> dict[str, Any] | None:
    """The token arrays of one trajectory as Python lists (``None`` for a column not filled)."""
    row = conn.execute("SELECT input_ids, loss_mask, logprobs, versions, learner_logprobs, ratios, advantages, "
                       "sequence_lengths FROM tokens WHERE trajectory_id = ?", (trajectory_id,)).fetchone()
    if row is None:
        return None
    names = ("input_ids", "loss_mask", "logprobs", "versions", "learner_logprobs", "ratios", "advantages",
             "sequence_lengths")
    return {name: (json.loads(value) if value is not None else None) for name, value in zip(names, row, strict=True)}


def _expand_learner(traj: Any, per_sequence: list[Any] | None) -> list[float | None] | None:
    """The learner's log-probs of the loss tokens, one array per sequence, spread over the trajectory."""
    if per_sequence is None:
        return None
    out: list[float | None] = [None] * len(traj.input_ids)
    for (start, end), values in zip(traj.sequences(), per_sequence, strict=True):
        if values is None:
            continue
        positions = [p for p in range(start, end) if traj.loss_mask[p]]
        if len(positions) != len(values):
            raise ValueError(f"trajectory {traj.uid}: {len(values)} learner log-probs for {len(positions)} loss tokens")
        for p, v in zip(positions, values, strict=True):
            out[p] = float(v)
    return out


class TrajectoryStore:
    """``<run dir>/trajectories.sqlite``, written by a background thread.

    Args:
        path: the database file (created with its schema if missing).
        run: the run's name, stored on every row.
        max_steps: keep the trajectories of the last ``max_steps`` training steps (``None``: all).
        queue_steps: items (steps, episodes) the loop may be ahead of the writer before adding waits.

    Call :meth:`close` to flush and stop the writer (it is safe to call twice).
    """

    def __init__(self, path: str | Path, *, run: str, max_steps: int | None = 100, queue_steps: int = 8) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.run = run
        self.max_steps = max_steps
        self.write_seconds = 0.0  # time the writer thread spent, since the last take_write_seconds()
        self.error: BaseException | None = None
        self._queue: queue.Queue[tuple[str, Any] | None] = queue.Queue(maxsize=queue_steps)
        self._lock = threading.Lock()
        conn = connect(self.path)
        with conn:
            conn.executescript(SCHEMA)
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('created', ?)", (str(time.time()),))
        self._conn = conn
        self._closed = False
        self._thread = threading.Thread(target=self._write_loop, name="trajectory-store", daemon=True)
        self._thread.start()

    # -- what the loop calls (cheap: it only enqueues) ------------------------------------------

    def add_step(self, step: int, trajectories: Sequence[Any], *, advantages: Any = None,
                 learner_logprobs: Mapping[int, Any] | None = None, metrics: Mapping[str, Any] | None = None,
                 kind: str = "train", block: bool = True) -> bool:
        """Queue one trained step: its trajectories (``types.Trajectory``), their ``[B, L]`` advantages,
        and the learner's log-probs of the loss tokens per train sample (``train_samples`` order).

        Returns False, without queueing, when ``block`` is False and the writer is ``queue_steps`` behind.
        """
        return self._put(("step", (kind, step, list(trajectories), advantages, learner_logprobs,
                                   dict(metrics or {}))), block)

    def add_episode(self, trajectory: Any = None, *, kind: str = "eval", step: int | None = None,
                    result: Mapping[str, Any] | None = None, task: str | None = None, index: Any = None,
                    sample: int | None = None, model: str | None = None, group_id: str | None = None,
                    uid: str | None = None, split: str | None = None) -> None:
        """Queue one evaluated episode: a ``Trajectory`` (tokens included), or a ``result`` with at least
        ``status``, ``reward``, ``turns``, ``messages`` (an OpenAI endpoint's, without tokens)."""
        self._put(("episode", (kind, step, trajectory, dict(result or {}),
                               dict(task=task, index=index, sample=sample, model=model, group_id=group_id, uid=uid,
                                    split=split))), True)

    def add_episodes(self, trajectories: Sequence[Any], *, kind: str = "validation", step: int | None = None) -> None:
        """Queue several ``Trajectory`` episodes as one item (a validation round of a training run)."""
        self._put(("episodes", (kind, step, list(trajectories))), True)

    def truncate_after(self, step: int) -> None:
        """Delete the training and validation rows of steps after ``step`` (a resumed run trains them again)."""
        self._put(("truncate", (step,)), True)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until everything queued so far is committed."""
        done = threading.Event()
        self._put(("flush", done), True)
        done.wait(timeout)

    def take_write_seconds(self) -> float:
        with self._lock:
            seconds, self.write_seconds = self.write_seconds, 0.0
        return seconds

    def close(self) -> None:
        """Write what is queued, then stop the writer and close the database."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join()
        try:
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # leave one file behind
        finally:
            self._conn.close()
        if self.error is not None:
            log.error("the trajectory store %s stopped writing after an error: %s", self.path, self.error)

    def __enter__(self) -> TrajectoryStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _put(self, item: tuple[str, Any], block: bool) -> bool:
        if self._closed:
            raise RuntimeError(f"the trajectory store {self.path} is closed")
        try:
            self._queue.put(item, block=block)
        except queue.Full:
            return False
        return True

    # -- the writer thread ------------------------------------------------------------------

    def _write_loop(self) -> None:
        writers = {"step": self._write_step, "episode": self._write_episode, "episodes": self._write_episodes,
                   "truncate": self._write_truncate}
        while True:
            item = self._queue.get()
            batch = [item]
            while item is not None:  # take what else is waiting: one commit for all of it
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                batch.append(item)
            t0 = time.perf_counter()
            events = [payload for what, payload in filter(None, batch) if what == "flush"]
            try:
                with self._conn:
                    for entry in batch:
                        if entry is not None and entry[0] != "flush" and self.error is None:
                            writers[entry[0]](*entry[1])
            except Exception as exc:  # a full disk must not stop training: say so once, stop writing
                if self.error is None:
                    log.error("the trajectory store %s failed and stops writing: %s", self.path, exc)
                self.error = exc
            with self._lock:
                self.write_seconds += time.perf_counter() - t0
            for event in events:
                event.set()
            if batch[-1] is None:
                return

    def _write_step(self, kind: str, step: int, trajectories: list[Any], advantages: Any,
                    learner_logprobs: Mapping[int, Any] | None, metrics: dict[str, Any]) -> None:
        conn = self._conn
        now = time.time()
        adv_rows = advantages.tolist() if advantages is not None and hasattr(advantages, "tolist") else advantages
        sample = 0
        for i, traj in enumerate(trajectories):
            n_seq = len(traj.sequences())
            per_seq = None
            if learner_logprobs is not None:
                per_seq = [learner_logprobs.get(sample + k) for k in range(n_seq)]
                if all(v is None for v in per_seq):
                    per_seq = None
            sample += n_seq
            adv = adv_rows[i][: len(traj.input_ids)] if adv_rows is not None else None
            self._insert(kind, step, now, traj, advantages=adv, learner=_expand_learner(traj, per_seq))
        conn.execute("INSERT OR REPLACE INTO steps VALUES (?, ?, ?, ?, ?, ?)",
                     (self.run, kind, step, now, len(trajectories), _json(_finite(metrics))))
        if self.max_steps is not None:
            cutoff = step - self.max_steps
            conn.execute("DELETE FROM trajectories WHERE run = ? AND kind IN ('train', 'validation') AND step <= ?",
                         (self.run, cutoff))

    def _write_episode(self, kind: str, step: int | None, trajectory: Any, result: dict[str, Any],
                       names: dict[str, Any]) -> None:
        now = time.time()
        if trajectory is not None:
            self._insert(kind, step, now, trajectory, model=names.get("model"))
            return
        messages = result.get("messages")
        self._conn.execute(
            "INSERT INTO trajectories (run, kind, step, time, uid, task, split, task_index, group_id, sample, model, "
            "status, failure, reward, num_turns, messages, tool_calls, metrics) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (self.run, kind, step, now, names.get("uid") or "", names.get("task") or "", names.get("split"),
             names.get("index"), names.get("group_id"), names.get("sample"), names.get("model"),
             str(result.get("status", "unknown")), None, result.get("reward"), result.get("turns"),
             _json(messages), _json(tool_calls_of(messages)),
             _json(_finite({**(result.get("metrics") or {}), "error": result.get("error")}))),
        )

    def _write_episodes(self, kind: str, step: int | None, trajectories: list[Any]) -> None:
        now = time.time()
        for traj in trajectories:
            self._insert(kind, step, now, traj)

    def _write_truncate(self, step: int) -> None:
        for table in ("trajectories", "steps"):
            self._conn.execute(f"DELETE FROM {table} WHERE run = ? AND kind IN ('train', 'validation') AND step > ?",
                               (self.run, step))

    def _insert(self, kind: str, step: int | None, now: float, traj: Any, *, advantages: list[float] | None = None,
                learner: list[float | None] | None = None, model: str | None = None) -> None:
        mask = list(traj.loss_mask)
        action = sum(mask)
        advantage = None
        if advantages is not None and action:
            advantage = sum(a for a, m in zip(advantages, mask, strict=False) if m) / action
        model_versions = [v for v, m in zip(traj.versions, mask, strict=True) if m and v >= 0]
        cur = self._conn.execute(
            "INSERT INTO trajectories (run, kind, step, time, uid, task, split, task_index, group_id, sample, model, "
            "status, failure, reward, training_reward, advantage, num_turns, num_tokens, num_action_tokens, "
            "prompt_length, min_version, max_version, messages, tool_calls, turns, metrics) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (self.run, kind, step, now, traj.uid, traj.task, traj.split, traj.index, traj.group_id, traj.sample, model,
             traj.status.value, traj.failure.value, traj.reward, traj.training_reward, advantage, traj.num_turns,
             len(traj.input_ids), action, traj.prompt_length,
             min(model_versions, default=None), max(model_versions, default=None),
             _json(traj.messages), _json(tool_calls_of(traj.messages)),
             _json([{"pool": t.pool, "engine": t.engine, "version": t.version, "num_tokens": t.num_tokens,
                     "finish_reason": t.finish_reason, "aborted_retries": t.aborted_retries} for t in traj.turns]),
             _json(_finite(traj.metrics))),
        )
        ratios = None
        if learner is not None:
            ratios = [math.exp(lp - old) if lp is not None and m else None
                      for lp, old, m in zip(learner, traj.rollout_logprobs, mask, strict=True)]
        self._conn.execute(
            "INSERT INTO tokens VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (cur.lastrowid, _ints(traj.input_ids), _ints(mask), _floats(traj.rollout_logprobs), _ints(traj.versions),
             _floats(learner, mask) if learner is not None else None,
             _floats(ratios, mask) if ratios is not None else None,
             _floats(advantages, mask) if advantages is not None else None,
             _ints(traj.sequence_lengths)),
        )


def _finite(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """JSON has no nan/inf: such numbers become strings, as in metrics.jsonl."""
    return {k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
