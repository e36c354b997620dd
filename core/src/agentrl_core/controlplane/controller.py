"""The controller: one HTTP front for every task worker (docs/architecture.md section 4).

``agentrl controller --port 5020`` serves the AgentRL / AgentBench-FC controller API under
``/api`` (``get_indices``, ``start_sample``, ``interact``, ``cancel``, ``cancel_all``,
``cancel_notice``, ``receive_heartbeat``, ``mark_stale``, ``list_workers``,
``list_sessions``, ``sync_all``, ``version``, ``health``), Prometheus text at ``/metrics``
and its OpenAPI document at ``/openapi.json``. Workers register by heartbeat; a new
session goes to the live worker of its task with the most free slots and stays pinned to
it. A worker that cannot be reached loses its sessions at once (their next interact
answers ``task error``); one whose heartbeats stop is marked unresponsive after
``unresponsive_after`` and removed after ``remove_after``. Idle sessions expire, the
registry is reconciled with each worker's own session list, and cancels propagate.
The protocol is documented in ``core/docs/control_plane.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from typing import Any

from agentrl_core._version import __version__
from agentrl_core.config import ControllerConfig
from agentrl_core.controlplane import wire
from agentrl_core.controlplane.metrics import Metrics
from agentrl_core.controlplane.openapi import controller_openapi
from agentrl_core.controlplane.state import SessionEntry, State, Worker, WorkerState
from agentrl_core.controlplane.upkeep import Upkeep
from agentrl_core.http.client import ConnectFailed, ConnectionBroken, TransportError
from agentrl_core.http.server import (
    App,
    HTTPError,
    Request,
    Response,
    bind_socket,
    check_bind,
    dumps,
    json_response,
    serve_app,
)
from agentrl_core.types import Status

log = logging.getLogger(__name__)

PROTOCOL = "agentrl-controller/1"

# what a worker calls on the controller: open without the token when controller.unauthenticated_workers is set
WORKER_PATHS = ("/api/receive_heartbeat", "/api/cancel_notice")


class Controller:
    """The controller service; ``serve()`` runs it, ``app`` is its ASGI application.

    With a ``token`` every route needs ``Authorization: Bearer <token>``, except the worker
    routes when ``config.unauthenticated_workers`` lets upstream workers (which cannot send
    it) register; such a worker is never sent the token.
    """

    def __init__(self, config: ControllerConfig | None = None, *, token: str | None = None) -> None:
        self.config = config or ControllerConfig()
        self.token = token or None
        self.state = State(connect_timeout=self.config.connect_timeout, tombstones=self.config.finished_sessions_kept)
        self.metrics = Metrics()
        self.started = time.time()
        self.app = App(name="controller", max_body_bytes=self.config.max_body_bytes, token=self.token,
                       open_paths=WORKER_PATHS if self.config.unauthenticated_workers else ())
        self.upkeep = Upkeep(self.state, self.config, self.metrics)
        self.app.observe = self.metrics.observe
        for method, path, handler in self.routes():
            self.app.route(method, path, handler)
        self._openapi = dumps(controller_openapi(__version__))

    def routes(self) -> list[tuple[str, str, Any]]:
        api = [
            ("GET", "get_indices", self.get_indices),
            ("POST", "start_sample", self.start_sample),
            ("POST", "interact", self.interact),
            ("POST", "cancel", self.cancel),
            ("POST", "cancel_all", self.cancel_all),
            ("POST", "cancel_notice", self.cancel_notice),
            ("POST", "receive_heartbeat", self.receive_heartbeat),
            ("POST", "mark_stale", self.mark_stale),
            ("GET", "list_workers", self.list_workers),
            ("GET", "list_sessions", self.list_sessions),
            ("POST", "sync_all", self.sync_all),
            ("GET", "version", self.version),
            ("GET", "health", self.health),
            ("GET", "metrics", self.prometheus),
        ]
        return [(m, f"/api/{p}", h) for m, p, h in api] + [
            ("GET", "/health", self.health),
            ("GET", "/metrics", self.prometheus),
            ("GET", "/openapi.json", self.openapi),
        ]

    # -- client routes -------------------------------------------------------------------

    async def get_indices(self, request: Request) -> Any:
        return self._task(_required_name(request)).indices.indices

    async def start_sample(self, request: Request) -> Any:
        body = request.json_object()
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise HTTPError(400, "start_sample needs a task name in the field 'name'")
        task = self._task(name)
        raw_index = wire.parse_index(body.get("index"))
        custom_task = body.get("custom_task")
        if custom_task is not None and not isinstance(custom_task, dict):
            raise HTTPError(400, "custom_task must be an object")
        # upstream's convention: index -1 with a custom_task asks the worker for a task it is given,
        # whether or not the worker lists -1 among its indices; the worker decides
        index = -1 if custom_task is not None and raw_index == -1 else task.indices.normalize(raw_index)
        if index is None:
            raise HTTPError(400, f"index {raw_index!r} is not an index of task {name!r} ({len(task.indices)} indices)")
        tried: set[int] = set()
        while True:
            worker = self.state.pick_worker(task, tried)
            if worker is None:
                raise HTTPError(406, self._no_capacity(name))
            tried.add(worker.id)
            session = self.state.new_session(name, index, worker)
            session.busy = True
            payload = {"index": index, "session_id": session.id, "custom_task": custom_task}
            try:
                response = await worker.pool.request_json(
                    "POST", f"{worker.path}/start_sample", payload, timeout=self.config.start_timeout)
            except (ConnectFailed, ConnectionBroken) as exc:  # dead worker: another one may take it
                self.state.end(session, "its worker could not be reached")
                self.upkeep.lose_worker(worker, str(exc))
                continue
            except TransportError as exc:
                self._start_failed(session, worker, exc)
                raise HTTPError(504, f"worker {worker.id} of task {name!r} did not start the session within "
                                     f"{self.config.start_timeout:g} s") from None
            except Exception as exc:  # unforeseen: the session must not stay listed with no client to end it
                self._start_failed(session, worker, f"{type(exc).__name__}: {exc}")
                raise
            finally:  # a reconciliation running meanwhile must not judge this session by an older list
                session.busy = False
                session.last_update = time.monotonic()
            if response.status == 406:  # our count was off: re-sync it, try another worker
                self.state.end(session, "its worker was full")
                self.upkeep.spawn(self.upkeep.reconcile(worker))
                continue
            if response.status != 200:
                self.state.end(session, "its worker refused to start it")
                status = response.status if 400 <= response.status < 500 else 502
                raise HTTPError(status, f"worker {worker.id} of task {name!r} could not start index {index!r}: "
                                        f"{response.detail()}")
            out = _parse_out(response)
            if out is None:
                self._start_failed(session, worker, "an answer that is not a JSON object")
                raise HTTPError(502, f"worker {worker.id} of task {name!r} answered start_sample with invalid JSON")
            self.metrics.started(name)
            if wire.finished(out):
                self._finish(session, out)
            elif self.state.sessions.get(session.id) is not session:  # cancelled while starting
                out = wire.failure_out(Status.CANCELLED, "the session was cancelled while starting")
            return json_response(wire.to_client(out), headers=[(b"session_id", str(session.id).encode())])

    async def interact(self, request: Request) -> Any:
        body = request.json_object()
        sid = wire.session_id_from(request, body)
        messages = wire.parse_messages(body.get("messages"))
        session = self._session(sid)
        if session.lost is not None:
            self.state.end(session, f"it failed: {session.lost}")
            self.metrics.finished(session.task, Status.TASK_ERROR.value)
            return wire.to_client(wire.failure_out(Status.TASK_ERROR, session.lost))
        if session.busy:
            raise HTTPError(409, f"session {sid} is busy with another call; send one interact at a time")
        worker = session.worker
        session.busy = True
        session.last_update = time.monotonic()
        payload = dumps({"session_id": sid, "messages": messages})
        try:
            response = await worker.pool.request(
                "POST", f"{worker.path}/interact", payload, timeout=self.config.request_timeout, retry_stale=False)
        except TransportError as exc:
            return self._interact_failed(session, exc)
        finally:
            session.busy = False
            session.last_update = time.monotonic()
        if response.status != 200:
            if _lost_on_worker(response):  # the worker lost it (restarted): an infrastructure failure
                return self._interact_failed(session, f"the worker no longer has session {sid}")
            if 400 <= response.status < 500:
                raise HTTPError(response.status, response.detail())
            return self._interact_failed(session, f"the worker answered {response.status}: {response.detail()}")
        try:
            out = response.json().get("env_out")
        except (ValueError, AttributeError):
            out = None
        if not isinstance(out, dict):
            return self._interact_failed(session, "the worker answered interact without an env_out object")
        if wire.finished(out):
            self._finish(session, out)
        return wire.to_client(out)

    async def cancel(self, request: Request) -> Any:
        sid = wire.session_id_from(request, request.json_object(required=False))
        session = self.state.sessions.get(sid)
        if session is None:
            if self.state.why_gone(sid) is None:
                raise HTTPError(404, f"there is no session {sid}")
            return {"session_id": sid, "cancelled": False}
        self.state.end(session, "it was cancelled")
        self.metrics.finished(session.task, Status.CANCELLED.value)
        if session.lost is None:
            self.state.hold_for_cancel(session)
            await self.upkeep.cancel_on_worker(session.worker, sid)
        return {"session_id": sid, "cancelled": True}

    async def cancel_all(self, request: Request) -> Any:
        query = request.query()
        name = query.get("name")
        force = query.get("force", "").lower() in ("1", "true", "yes")
        if name is not None:
            names = [self._task(name).name]
        elif len(self.state.tasks) > 1 and not force:
            raise HTTPError(400, f"{len(self.state.tasks)} tasks are registered ({', '.join(sorted(self.state.tasks))}); "
                                 "pass name=<task> or force=true")
        else:
            names = list(self.state.tasks)
        cancelled = 0
        for session in [s for s in self.state.sessions.values() if s.task in names]:
            self.state.end(session, "it was cancelled by cancel_all")
            self.metrics.finished(session.task, Status.CANCELLED.value)
            cancelled += 1
        workers = [w for n in names for w in self.state.tasks[n].workers.values() if w.state is not WorkerState.DEAD]
        await asyncio.gather(*(self.upkeep.cancel_all_on(worker) for worker in workers))
        return {"cancelled": cancelled, "tasks": names}

    async def cancel_notice(self, request: Request) -> Any:
        sid = wire.session_id_from(request, request.json_object(required=False))
        return {"session_id": sid, "known": self.state.cancel_confirmed(sid)}

    # -- worker routes ---------------------------------------------------------------------

    async def receive_heartbeat(self, request: Request) -> Any:
        body = request.json_object()
        name, address = body.get("name"), body.get("address")
        if not isinstance(name, str) or not name:
            raise HTTPError(400, "a heartbeat needs the task name in the field 'name'")
        if not isinstance(address, str) or not address.startswith("http://"):
            raise HTTPError(400, "a heartbeat needs the worker's http:// address in the field 'address'")
        concurrency = body.get("concurrency")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or not 0 <= concurrency <= 10**9:
            raise HTTPError(400, "a heartbeat needs a non-negative integer 'concurrency'")
        indices = wire.check_indices(body.get("indices"))
        task = self.state.tasks.get(name)
        if task is not None and task.indices.indices != indices:
            raise HTTPError(409, f"task {name!r} is registered with different indices ({len(task.indices)} registered, "
                                 f"{len(indices)} sent); give this worker another --task-name")
        worker = self.state.find_worker(name, address)
        if worker is None:
            try:
                worker = self.state.register(name, address, concurrency, indices,
                                             token=self.token if request.authenticated else None)
            except ValueError as exc:
                raise HTTPError(400, f"the worker address is invalid: {exc}") from None
            log.info("worker %s registered task %r at %s (concurrency %d%s)", worker.id, name, address, concurrency,
                     "" if worker.authenticated or self.token is None else ", without the token")
            self.upkeep.spawn(self.upkeep.reconcile(worker))  # adopt what it still runs (e.g. after our restart)
        else:
            worker.last_heartbeat = time.monotonic()
            worker.capacity = concurrency
            if (worker.state is not WorkerState.ALIVE or not worker.ready) and not worker.syncing:
                log.info("worker %s of task %r is back; re-syncing its sessions", worker.id, name)
                self.upkeep.spawn(self.upkeep.reconcile(worker))
        return {"worker_id": worker.id, "status": int(worker.state)}

    async def mark_stale(self, request: Request) -> Any:
        body = request.json_object()
        stale = body.get("stale", True)
        if not isinstance(stale, bool):
            raise HTTPError(400, "stale must be true or false")
        worker = self.state.worker_by_id(body.get("worker_id")) if "worker_id" in body else None
        name = body.get("name")
        if worker is None or (name is not None and worker.task != name):
            raise HTTPError(404, f"there is no worker {body.get('worker_id')!r} of task {name!r}; see list_workers")
        worker.stale = stale
        return worker.dump(time.monotonic())

    async def list_workers(self, request: Request) -> Any:
        now = time.monotonic()
        return {name: {"indices": task.indices.indices, "workers": {str(w.id): w.dump(now) for w in task.workers.values()}}
                for name, task in self.state.tasks.items()}

    async def list_sessions(self, request: Request) -> Any:
        now = time.monotonic()
        name = request.query().get("name")
        return {str(sid): s.dump(now) for sid, s in self.state.sessions.items() if name is None or s.task == name}

    async def sync_all(self, request: Request) -> Any:
        workers = [w for w in self.state.workers() if w.state is not WorkerState.DEAD]
        results = await asyncio.gather(*(self.upkeep.reconcile(w) for w in workers))
        return {str(w.id): ok for w, ok in zip(workers, results, strict=True)}

    async def version(self, request: Request) -> Any:
        return {"version": __version__, "protocol": PROTOCOL, "implementation": "agentrl-core"}

    async def health(self, request: Request) -> Any:
        workers = list(self.state.workers())
        return {
            "status": "ok",
            "uptime": round(time.time() - self.started, 3),
            "tasks": len(self.state.tasks),
            "workers": len(workers),
            "alive_workers": sum(w.state is WorkerState.ALIVE for w in workers),
            "sessions": len(self.state.sessions),
        }

    async def prometheus(self, request: Request) -> Any:
        text = self.metrics.render(self.state)
        return Response(text.encode(), headers=[(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")])

    async def openapi(self, request: Request) -> Any:
        return Response(self._openapi)

    # -- helpers -----------------------------------------------------------------------------

    def _task(self, name: str):
        task = self.state.tasks.get(name)
        if task is None:
            known = ", ".join(sorted(self.state.tasks)) or "none"
            raise HTTPError(404, f"no worker serves task {name!r}; registered tasks: {known}")
        return task

    def _session(self, sid: int) -> SessionEntry:
        session = self.state.sessions.get(sid)
        if session is None:
            why = self.state.why_gone(sid)
            if why is not None:
                raise HTTPError(409, f"session {sid} has already ended: {why}")
            raise HTTPError(404, f"there is no session {sid}")
        return session

    def _no_capacity(self, name: str) -> str:
        workers = list(self.state.tasks[name].workers.values()) if name in self.state.tasks else []
        open_ = [w for w in workers if w.dispatchable()]
        if open_:
            used, cap = sum(w.current for w in open_), sum(w.capacity for w in open_)
            return (f"every worker of task {name!r} is full ({used} of {cap} slots in use on {len(open_)} workers); "
                    "retry later")
        states = sorted({w.state_name() for w in workers})
        return f"task {name!r} has no live worker taking sessions ({len(workers)} registered: {', '.join(states)})"

    def _finish(self, session: SessionEntry, out: dict[str, Any]) -> None:
        status = out.get("status") if isinstance(out.get("status"), str) else Status.UNKNOWN.value
        if self.state.sessions.get(session.id) is session:
            self.state.end(session, f"it finished with status {status!r}")
        self.metrics.finished(session.task, status)

    def _interact_failed(self, session: SessionEntry, problem: Any) -> dict[str, Any]:
        """The session is gone or broken: answer task error, free it, tell the worker."""
        reason = f"worker {session.worker.id} failed: {problem}"
        if isinstance(problem, ConnectFailed | ConnectionBroken):
            self.upkeep.lose_worker(session.worker, str(problem))
        elif self.state.sessions.get(session.id) is session and session.lost is None:
            self.state.hold_for_cancel(session)
            self.upkeep.spawn(self.upkeep.cancel_on_worker(session.worker, session.id))
        if self.state.sessions.get(session.id) is session:
            self.state.end(session, f"it failed: {reason}")
        self.metrics.finished(session.task, Status.TASK_ERROR.value)
        log.warning("session %s of task %r: %s", session.id, session.task, reason)
        return wire.to_client(wire.failure_out(Status.TASK_ERROR, reason))

    def _start_failed(self, session: SessionEntry, worker: Worker, problem: Any) -> None:
        if self.state.sessions.get(session.id) is session:
            self.state.end(session, f"it failed to start: {problem}")
            self.state.hold_for_cancel(session)
            self.upkeep.spawn(self.upkeep.cancel_on_worker(worker, session.id))

    async def serve(
        self,
        host: str | None = None,
        port: int | None = None,
        *,
        sock: socket.socket | None = None,
        stop: asyncio.Event | None = None,
        on_ready: Any = None,
    ) -> None:
        """Listen and serve until stopped (SIGTERM/SIGINT or ``stop``)."""
        sock = sock or bind_socket(host or self.config.host, self.config.port if port is None else port)
        check_bind(sock, self.app)
        loops = [asyncio.ensure_future(self.upkeep.monitor()), asyncio.ensure_future(self.upkeep.reconcile_loop())]
        if on_ready is not None:
            on_ready(sock.getsockname())
        try:
            await serve_app(self.app, sock, stop=stop)
        finally:
            self.upkeep.close()
            for task in loops:
                task.cancel()
            for task in loops:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for worker in self.state.workers():
                worker.pool.close()


def _required_name(request: Request) -> str:
    name = request.query().get("name")
    if not name:
        raise HTTPError(400, "pass the task name as the query parameter name=<task>")
    return name


def _lost_on_worker(response: Any) -> bool:
    """The worker does not hold the session: our worker's 404, upstream agentrl-worker's 400 "No such session"."""
    if response.status == 404:
        return True
    return response.status == 400 and response.detail().strip().rstrip(".").lower() == "no such session"


def _parse_out(response: Any) -> dict[str, Any] | None:
    try:
        data = json.loads(response.body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None
