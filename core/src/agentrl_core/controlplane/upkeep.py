"""The controller's work with workers outside client calls.

Cancels (with notice, falling back to a plain cancel), ``cancel_all``, reconciliation with a
worker's own session list, and the periodic check: liveness from heartbeats, removal of
silent workers, idle-session expiry, overdue cancel notices. Everything here tolerates a
worker that is slow, wrong or gone; none of it raises into a client request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from agentrl_core.config import ControllerConfig
from agentrl_core.controlplane import wire
from agentrl_core.controlplane.metrics import Metrics
from agentrl_core.controlplane.state import State, Worker, WorkerState
from agentrl_core.http.client import ConnectFailed, ConnectionBroken, RequestTimeout, TransportError
from agentrl_core.http.server import HTTPError
from agentrl_core.types import Status

log = logging.getLogger("agentrl_core.controlplane.controller")


class Upkeep:
    def __init__(self, state: State, config: ControllerConfig, metrics: Metrics) -> None:
        self.state = state
        self.config = config
        self.metrics = metrics
        self.background: set[asyncio.Task] = set()

    def lose_worker(self, worker: Worker, reason: str) -> None:
        if worker.state is not WorkerState.DEAD:
            log.warning("worker %s of task %r at %s is unreachable: %s", worker.id, worker.task, worker.address, reason)
            self.metrics.worker_lost(worker.task)
        self.state.lose_worker(worker, reason)

    async def cancel_on_worker(self, worker: Worker, sid: int) -> None:
        """Ask the worker to cancel ``sid``; its slot is freed on confirmation."""
        headers = [("session_id", str(sid))]
        timeout = self.config.cancel_timeout
        try:
            response = await worker.pool.request_json(
                "POST", f"{worker.path}/cancel_with_notice", {"session_id": sid}, headers=headers, timeout=timeout)
            if response.status == 200:
                return  # the worker posts cancel_notice when the session is closed
            response = await worker.pool.request_json(
                "POST", f"{worker.path}/cancel", {"session_id": sid}, headers=headers, timeout=timeout)
        except (ConnectFailed, ConnectionBroken) as exc:
            self.lose_worker(worker, str(exc))
            return
        except RequestTimeout:
            log.warning("worker %s did not confirm the cancel of session %s in %s s", worker.id, sid, timeout)
            return  # the slot stays held until reconciliation finds the session gone
        self.state.cancel_confirmed(sid)  # cancelled now, or the worker never had it

    async def cancel_all_on(self, worker: Worker) -> None:
        try:
            response = await worker.pool.request_json(
                "POST", f"{worker.path}/cancel_all", None, timeout=max(self.config.cancel_timeout, 30.0))
        except (ConnectFailed, ConnectionBroken) as exc:
            self.lose_worker(worker, str(exc))
            return
        except RequestTimeout:
            log.warning("worker %s did not finish cancel_all in time; reconciling later", worker.id)
            return
        if response.status == 200:
            for sid in list(worker.cancelling):
                self.state.cancel_confirmed(sid)

    async def reconcile(self, worker: Worker) -> bool:
        """Make our view of ``worker`` match its own session list (adopt, lose, confirm)."""
        if worker.syncing:
            return False
        worker.syncing = True
        asked = time.monotonic()
        try:
            response = await worker.pool.request("GET", f"{worker.path}/get_sessions",
                                                 timeout=max(self.config.cancel_timeout, 5.0))
            reported = {wire.parse_session_id(k): v for k, v in response.json().items()} if response.status == 200 else None
        except TransportError as exc:
            self.lose_worker(worker, str(exc))
            return False
        except (ValueError, AttributeError, HTTPError):
            reported = None
        finally:
            worker.syncing = False
        task = self.state.tasks.get(worker.task)
        if task is None or task.workers.get(worker.id) is not worker:
            return False  # removed while we waited for its answer
        if reported is None:  # it is up but cannot list its sessions: serve it unreconciled
            log.warning("worker %s of task %r answered get_sessions badly; not reconciled", worker.id, worker.task)
            worker.ready = True
            return False
        for sid, session in list(worker.sessions.items()):
            if sid not in reported and not session.busy and session.last_update < asked:
                session.lost = f"worker {worker.id} no longer holds session {sid}"
                del worker.sessions[sid]
        for sid in [s for s in worker.cancelling if s not in reported]:
            self.state.cancel_confirmed(sid)
        for sid, index in reported.items():
            if sid in worker.sessions or sid in worker.cancelling:
                continue
            known = self.state.sessions.get(sid)
            if known is None and self.state.why_gone(sid) is None:
                self.state.adopt(sid, worker.task, index, worker)
            elif known is not None and known.lost is None:
                continue  # live on another worker entry (cannot happen with our ids): leave it
            else:  # a session we ended or gave up as lost: it must not hold the slot
                self.state.cancel_confirmed(sid)
                worker.cancelling.add(sid)
                self.state.pending_cancels[sid] = worker
                self.spawn(self.cancel_on_worker(worker, sid))
        if time.monotonic() - worker.last_heartbeat <= self.config.unresponsive_after:
            worker.state = WorkerState.ALIVE
        worker.ready = True
        return True

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.background.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self.background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("controller background task failed", exc_info=task.exception())

    def check(self, now: float | None = None) -> None:
        """One pass of the monitor: worker liveness, removal, idle expiry, stuck cancels."""
        now = time.monotonic() if now is None else now
        cfg = self.config
        for worker in list(self.state.workers()):
            silent = now - worker.last_heartbeat
            if silent > cfg.remove_after:
                log.warning("removing worker %s of task %r: no heartbeat for %.0f s", worker.id, worker.task, silent)
                self.state.remove_worker(worker, f"worker {worker.id} sent no heartbeat for {silent:.0f} s")
            elif silent > cfg.unresponsive_after and worker.state is WorkerState.ALIVE:
                log.warning("worker %s of task %r is unresponsive: no heartbeat for %.1f s", worker.id, worker.task, silent)
                worker.state = WorkerState.UNRESPONSIVE
            elif worker.cancelling and now - worker.cancel_since > cfg.cancel_notice_timeout and not worker.syncing:
                worker.cancel_since = now
                self.spawn(self.reconcile(worker))
        idle = cfg.idle_session_timeout
        for session in [s for s in self.state.sessions.values() if not s.busy and now - s.last_update > idle]:
            self.state.end(session, f"it expired after {idle:g} s without a call")
            self.metrics.finished(session.task, Status.CANCELLED.value)
            if session.lost is None:
                self.state.hold_for_cancel(session)
                self.spawn(self.cancel_on_worker(session.worker, session.id))

    async def monitor(self) -> None:
        cfg = self.config
        interval = max(0.05, min(1.0, cfg.unresponsive_after / 4, cfg.idle_session_timeout / 4))
        while True:
            await asyncio.sleep(interval)
            self.check()

    async def reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.reconcile_interval)
            for worker in [w for w in self.state.workers() if w.state is WorkerState.ALIVE]:
                self.spawn(self.reconcile(worker))

    def close(self) -> None:
        for task in list(self.background):
            task.cancel()
