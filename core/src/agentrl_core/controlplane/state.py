"""The controller's bookkeeping: tasks, workers, sessions, capacity (no I/O here).

A worker is identified by (task name, address). Its ``current`` load counts the sessions
pinned to it plus the cancelled ones whose slot it has not confirmed free yet. A worker
the controller cannot reach is ``DEAD``; one whose heartbeats stopped is
``UNRESPONSIVE`` (upstream's "coma"); both get no new sessions, and their sessions are
*lost*: the next interact answers ``task error``. Finished sessions leave a tombstone, so
a late call gets a clear "already finished" instead of "unknown".
"""

from __future__ import annotations

import enum
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from agentrl_core.controlplane.wire import IndexSet
from agentrl_core.http.client import Pool
from agentrl_core.types import Index


class WorkerState(enum.IntEnum):
    """Upstream's integer WorkerStatus values, kept for list_workers compatibility."""

    ALIVE = 0
    UNRESPONSIVE = 1
    DEAD = 2


class Worker:
    __slots__ = ("id", "task", "address", "pool", "path", "capacity", "sessions", "cancelling", "state", "stale",
                 "last_heartbeat", "registered", "syncing", "ready", "cancel_since", "lost_reason", "authenticated")

    def __init__(self, worker_id: int, task: str, address: str, capacity: int, *, connect_timeout: float,
                 token: str | None = None) -> None:
        self.id = worker_id
        self.task = task
        self.address = address
        # the token goes only to a worker that sent it: an unauthenticated (upstream) worker never sees it
        self.authenticated = token is not None
        self.pool, self.path = Pool.for_url(address, connect_timeout=connect_timeout, token=token)
        self.capacity = capacity
        self.sessions: dict[int, SessionEntry] = {}
        self.cancelling: set[int] = set()  # cancelled sessions still holding a slot on the worker
        self.state = WorkerState.ALIVE
        self.stale = False  # draining: keeps its sessions, gets no new ones
        self.last_heartbeat = time.monotonic()
        self.registered = time.time()
        self.syncing = False
        self.ready = False  # set by the first reconciliation: until then its load is unknown
        self.cancel_since = 0.0
        self.lost_reason = ""

    @property
    def current(self) -> int:
        return len(self.sessions) + len(self.cancelling)

    @property
    def free(self) -> int:
        return self.capacity - self.current

    def dispatchable(self) -> bool:
        # Not blocked while syncing: reconciliation skips sessions created after it asked.
        return self.state is WorkerState.ALIVE and self.ready and not self.stale

    def state_name(self) -> str:
        if self.state is WorkerState.ALIVE:
            return "syncing" if not self.ready else "draining" if self.stale else "alive"
        return self.state.name.lower()

    def dump(self, now: float) -> dict[str, Any]:
        return {
            "id": self.id,
            "address": self.address,
            "capacity": self.capacity,
            "current": self.current,
            "last_visit": time.time() - (now - self.last_heartbeat),
            "status": int(self.state),
            "state": self.state_name(),
            "stale": self.stale,
            "sessions": len(self.sessions),
            "cancelling": len(self.cancelling),
            "locked": self.syncing,
            "authenticated": self.authenticated,
        }


class SessionEntry:
    """The controller's row for one open session (not the plugin's ``protocols.Session``)."""

    __slots__ = ("id", "task", "index", "worker", "start", "last_update", "busy", "lost")

    def __init__(self, session_id: int, task: str, index: Index, worker: Worker) -> None:
        self.id = session_id
        self.task = task
        self.index = index
        self.worker = worker
        self.start = time.time()
        self.last_update = time.monotonic()
        self.busy = False
        self.lost: str | None = None  # why the session is gone (its next interact gets task error)

    def dump(self, now: float) -> dict[str, Any]:
        return {
            "name": self.task,
            "index": self.index,
            "start": self.start,
            "last_update": time.time() - (now - self.last_update),
            "worker_id": self.worker.id,
            "locked": self.busy,
            "lost": self.lost,
        }


class Task:
    __slots__ = ("name", "indices", "workers")

    def __init__(self, name: str, indices: list[Index]) -> None:
        self.name = name
        self.indices = IndexSet(indices)
        self.workers: dict[int, Worker] = {}


class State:
    def __init__(self, *, connect_timeout: float = 5.0, tombstones: int = 100_000) -> None:
        self.connect_timeout = connect_timeout
        self.tasks: dict[str, Task] = {}
        self.sessions: dict[int, SessionEntry] = {}
        self.finished: OrderedDict[int, str] = OrderedDict()  # session id -> why it ended
        self.max_tombstones = tombstones
        self.pending_cancels: dict[int, Worker] = {}
        # Ids keep growing across controller restarts, so adopted sessions never collide.
        self._next_session = int(time.time() * 1000) * 1000
        self._next_worker = 0

    # -- workers ---------------------------------------------------------------------------

    def workers(self) -> Iterator[Worker]:
        for task in self.tasks.values():
            yield from task.workers.values()

    def find_worker(self, task: str, address: str) -> Worker | None:
        entry = self.tasks.get(task)
        if entry is None:
            return None
        for worker in entry.workers.values():
            if worker.address == address:
                return worker
        return None

    def worker_by_id(self, worker_id: Any) -> Worker | None:
        for worker in self.workers():
            if str(worker.id) == str(worker_id):
                return worker
        return None

    def register(self, task_name: str, address: str, capacity: int, indices: list[Index], *,
                 token: str | None = None) -> Worker:
        task = self.tasks.get(task_name)
        if task is None:
            task = self.tasks[task_name] = Task(task_name, indices)
        worker = Worker(self._next_worker, task_name, address, capacity, connect_timeout=self.connect_timeout,
                        token=token)
        self._next_worker += 1
        task.workers[worker.id] = worker
        return worker

    def pick_worker(self, task: Task, exclude: set[int]) -> Worker | None:
        """The live worker with the most free slots (least loaded), or None."""
        best = None
        for worker in task.workers.values():
            if worker.id in exclude or not worker.dispatchable():
                continue
            if worker.free > 0 and (best is None or worker.free > best.free):
                best = worker
        return best

    def lose_worker(self, worker: Worker, reason: str) -> None:
        """The worker cannot be reached: every session on it is lost, its slots are free."""
        worker.state = WorkerState.DEAD
        worker.lost_reason = reason
        for session in list(worker.sessions.values()):
            if session.lost is None:
                session.lost = reason
        worker.sessions.clear()
        for sid in worker.cancelling:
            self.pending_cancels.pop(sid, None)
        worker.cancelling.clear()
        worker.pool.close()

    def remove_worker(self, worker: Worker, reason: str) -> None:
        self.lose_worker(worker, reason)
        task = self.tasks.get(worker.task)
        if task is not None:
            task.workers.pop(worker.id, None)
            if not task.workers:
                del self.tasks[worker.task]

    # -- sessions --------------------------------------------------------------------------

    def new_session(self, task: str, index: Index, worker: Worker) -> SessionEntry:
        self._next_session += 1
        session = SessionEntry(self._next_session, task, index, worker)
        self.sessions[session.id] = session
        worker.sessions[session.id] = session
        return session

    def adopt(self, session_id: int, task: str, index: Index, worker: Worker) -> SessionEntry:
        session = SessionEntry(session_id, task, index, worker)
        self.sessions[session_id] = session
        worker.sessions[session_id] = session
        self._next_session = max(self._next_session, session_id)
        return session

    def end(self, session: SessionEntry, why: str) -> None:
        """Forget a session (finished, failed or cancelled) and remember why."""
        if self.sessions.get(session.id) is session:
            del self.sessions[session.id]
        if session.worker.sessions.get(session.id) is session:
            del session.worker.sessions[session.id]
        self.finished[session.id] = why
        if len(self.finished) > self.max_tombstones:
            self.finished.popitem(last=False)

    def hold_for_cancel(self, session: SessionEntry) -> None:
        """Keep the cancelled session's slot until its worker confirms the cancel."""
        worker = session.worker
        if worker.state is WorkerState.DEAD:
            return
        if not worker.cancelling:
            worker.cancel_since = time.monotonic()
        worker.cancelling.add(session.id)
        self.pending_cancels[session.id] = worker

    def cancel_confirmed(self, session_id: int) -> bool:
        worker = self.pending_cancels.pop(session_id, None)
        if worker is None:
            return False
        worker.cancelling.discard(session_id)
        return True

    def why_gone(self, session_id: int) -> str | None:
        return self.finished.get(session_id)
