"""The task worker: serves one environment index set over the worker protocol.

``agentrl worker --env db --split std --controller http://ctl:5020/api`` registers the task
``db-std`` by heartbeat (``POST {controller}/receive_heartbeat {name, address,
concurrency, indices}`` every 8 s) and answers the controller under ``/api``:

* ``POST start_sample {index, session_id, custom_task?}`` -> ``{messages, tools, status,
  finish, reward, metric}`` with the ``session_id`` response header; 406 when full;
* ``POST interact {session_id, messages}`` -> ``{session_id, env_out}``;
* ``POST cancel``, ``cancel_with_notice`` (answers at once, then ``POST cancel_notice`` to
  the controller), ``cancel_all``, ``cancel_all_with_notice``;
* ``GET get_sessions`` (``{session_id: index}``), ``get_indices``, ``worker_status``,
  ``health``; ``POST sample_status {session_id}``.

An exception inside one session (start, step or a step timeout) turns into ``task error``
for that session only. Every session is closed exactly once, whatever ends it: finish,
cancel, error, or the worker shutting down. See ``core/docs/control_plane.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
from typing import Any

import anyio

from agentrl_core._version import __version__
from agentrl_core.controlplane import wire
from agentrl_core.controlplane.openapi import worker_openapi
from agentrl_core.env.api import UnknownIndexError
from agentrl_core.errors import SessionError
from agentrl_core.http.client import Pool, TransportError
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
from agentrl_core.protocols import Environment, Session
from agentrl_core.types import Index, Status

log = logging.getLogger(__name__)


class _Running:
    """A live session. While ``busy``, the request handling it owns it (start or step)."""

    __slots__ = ("session_id", "index", "session", "busy", "scope", "cancelled", "idle")

    def __init__(self, session_id: int, index: Index) -> None:
        self.session_id = session_id
        self.index = index
        self.session: Session | None = None
        self.busy = True
        self.scope: anyio.CancelScope | None = None
        self.cancelled = False
        self.idle: asyncio.Event | None = None  # created by a cancel that waits for the owner

    def release(self) -> None:
        self.scope = None
        self.busy = False
        if self.idle is not None:
            self.idle.set()


class TaskWorker:
    """Serve ``env``'s index set ``split`` as task ``task_name`` (default ``<env>-<split>``)."""

    def __init__(
        self,
        env: Environment,
        split: str,
        *,
        task_name: str | None = None,
        controller_url: str | None = None,
        concurrency: int | None = None,
        heartbeat_interval: float = 8.0,
        start_timeout: float | None = 300.0,
        step_timeout: float | None = 600.0,
        close_timeout: float = 60.0,
        max_body_bytes: int = 32 * 1024 * 1024,
        token: str | None = None,
    ) -> None:
        sets = env.index_sets()
        if split not in sets:
            raise UnknownIndexError(
                f"environment {env.name!r} has no index set {split!r}; available: {', '.join(sorted(sets))}"
            )
        self.env = env
        self.split = split
        self.task_name = task_name or f"{env.name}-{split}"
        self.indices = list(sets[split])
        self.concurrency = int(concurrency or env.concurrency)
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        self.heartbeat_interval = heartbeat_interval
        self.start_timeout = start_timeout
        self.step_timeout = step_timeout
        self.close_timeout = close_timeout
        self.sessions: dict[int, _Running] = {}
        self.address: str | None = None  # set by serve(): what the controller calls
        self.controller_url = controller_url.rstrip("/") if controller_url else None
        self._controller: Pool | None = None
        self._controller_path = ""
        if self.controller_url:
            self._controller, self._controller_path = Pool.for_url(self.controller_url, token=token)
        self._background: set[asyncio.Task] = set()
        self.token = token or None  # every route needs it; the worker sends it to the controller too
        self._openapi: bytes | None = None
        self.app = App(name=f"worker {self.task_name}", max_body_bytes=max_body_bytes, token=self.token)
        for method, path, handler in [
            ("POST", "/api/start_sample", self.start_sample),
            ("POST", "/api/interact", self.interact),
            ("POST", "/api/cancel", self.cancel),
            ("POST", "/api/cancel_with_notice", self.cancel_with_notice),
            ("POST", "/api/cancel_all", self.cancel_all),
            ("POST", "/api/cancel_all_with_notice", self.cancel_all_with_notice),
            ("GET", "/api/get_sessions", self.get_sessions),
            ("GET", "/api/get_indices", self.get_indices),
            ("GET", "/api/worker_status", self.worker_status),
            ("POST", "/api/sample_status", self.sample_status),
            ("GET", "/api/health", self.health),
            ("GET", "/openapi.json", self.openapi),
        ]:
            self.app.route(method, path, handler)

    # -- routes ---------------------------------------------------------------------------

    async def start_sample(self, request: Request) -> Any:
        body = request.json_object()
        sid = wire.parse_session_id(body.get("session_id"))
        index = wire.parse_index(body.get("index"))
        if body.get("custom_task") is not None:
            raise HTTPError(400, f"task {self.task_name!r} does not support custom tasks")
        if sid in self.sessions:
            raise HTTPError(400, f"session {sid} already exists on this worker")
        if len(self.sessions) >= self.concurrency:
            raise HTTPError(406, f"this worker is full: {len(self.sessions)} of {self.concurrency} sessions in use")
        try:
            index = self.env.check_index(self.split, index) if hasattr(self.env, "check_index") else index
        except UnknownIndexError as exc:
            raise HTTPError(400, str(exc)) from None
        running = _Running(sid, index)
        self.sessions[sid] = running
        out = await self._run_start(running)
        return json_response(out, headers=[(b"session_id", str(sid).encode())])

    async def _run_start(self, running: _Running) -> dict[str, Any]:
        sid = running.session_id
        try:
            with anyio.CancelScope(deadline=_deadline(self.start_timeout)) as scope:
                running.scope = scope
                running.session = await self.env.open(self.split, running.index)
                step = await running.session.start()
            if scope.cancelled_caught:
                await self._finish(sid)
                if not running.cancelled:
                    raise TimeoutError
                return wire.failure_out(Status.CANCELLED, "the session was cancelled while starting")
        except UnknownIndexError as exc:
            await self._finish(sid)
            raise HTTPError(400, str(exc)) from None
        except Exception as exc:
            reason = _describe(exc, "start", self.start_timeout)
            log.warning("session %s (%s index %r) failed to start: %s", sid, self.task_name, running.index, reason,
                        exc_info=not isinstance(exc, TimeoutError))
            await self._finish(sid)
            return {**wire.failure_out(Status.TASK_ERROR, reason), "tools": self.env.tools}
        finally:
            running.release()
        if running.cancelled:  # a cancel arrived before the start could be interrupted
            return wire.failure_out(Status.CANCELLED, "the session was cancelled while starting")
        tools = getattr(running.session, "tools", None) or self.env.tools
        if step.finish:
            await self._finish(sid)
        return wire.env_out(step, tools)

    async def interact(self, request: Request) -> Any:
        body = request.json_object()
        sid = wire.parse_session_id(body.get("session_id"))
        messages = wire.parse_messages(body.get("messages"))
        running = self.sessions.get(sid)
        if running is None:
            raise HTTPError(404, f"session {sid} does not exist on this worker")
        if running.busy or running.cancelled:
            raise HTTPError(409, f"session {sid} is busy with another call")
        message = wire.assistant_message(messages)
        running.busy = True
        try:
            with anyio.CancelScope(deadline=_deadline(self.step_timeout)) as scope:
                running.scope = scope
                step = await running.session.step(message)  # type: ignore[union-attr]
            if scope.cancelled_caught:
                if not running.cancelled:
                    raise TimeoutError
                out = wire.failure_out(Status.CANCELLED, "the session was cancelled during this step")
                return {"session_id": sid, "env_out": out}
        except SessionError as exc:  # e.g. the session refused a concurrent call
            raise HTTPError(409, str(exc)) from None
        except Exception as exc:
            reason = _describe(exc, "step", self.step_timeout)
            log.warning("session %s (%s index %r) failed in step: %s", sid, self.task_name, running.index, reason,
                        exc_info=not isinstance(exc, TimeoutError))
            await self._finish(sid)
            return {"session_id": sid, "env_out": wire.failure_out(Status.TASK_ERROR, reason)}
        finally:
            running.release()
        if step.finish:
            await self._finish(sid)
        return {"session_id": sid, "env_out": wire.env_out(step)}

    async def cancel(self, request: Request) -> Any:
        sid = wire.session_id_from(request, request.json_object(required=False))
        if sid not in self.sessions:
            raise HTTPError(404, f"session {sid} does not exist on this worker")
        await self._cancel(sid)
        return {"session_id": sid}

    async def cancel_with_notice(self, request: Request) -> Any:
        sid = wire.session_id_from(request, request.json_object(required=False))
        if sid not in self.sessions:
            raise HTTPError(404, f"session {sid} does not exist on this worker")
        self._spawn(self._cancel_and_notify(sid))
        return {"session_id": sid}

    async def cancel_all(self, request: Request) -> Any:
        ids = list(self.sessions)
        await asyncio.gather(*(self._cancel(sid) for sid in ids))
        return {"cancelled": ids}

    async def cancel_all_with_notice(self, request: Request) -> Any:
        ids = list(self.sessions)
        for sid in ids:
            self._spawn(self._cancel_and_notify(sid))
        return {"cancelled": ids}

    async def get_sessions(self, request: Request) -> Any:
        return {str(sid): r.index for sid, r in self.sessions.items()}

    async def get_indices(self, request: Request) -> Any:
        return self.indices

    async def worker_status(self, request: Request) -> Any:
        return {"concurrency": self.concurrency, "current": len(self.sessions)}

    async def sample_status(self, request: Request) -> Any:
        sid = wire.session_id_from(request, request.json_object(required=False))
        running = self.sessions.get(sid)
        if running is None:
            raise HTTPError(404, f"session {sid} does not exist on this worker")
        return {"session_id": sid, "index": running.index, "status": {"busy": running.busy}}

    async def health(self, request: Request) -> Any:
        return {"status": "ok", "task": self.task_name, "sessions": len(self.sessions), "concurrency": self.concurrency}

    async def openapi(self, request: Request) -> Any:
        if self._openapi is None:
            self._openapi = dumps(worker_openapi(__version__))
        return Response(self._openapi)

    # -- session lifetime -----------------------------------------------------------------

    async def _cancel(self, sid: int) -> None:
        running = self.sessions.get(sid)
        if running is None:
            return
        running.cancelled = True
        if running.busy:  # let the call in progress unwind before closing the session
            running.idle = running.idle or asyncio.Event()
            if running.scope is not None:
                running.scope.cancel()
            await running.idle.wait()
        await self._finish(sid)

    async def _cancel_and_notify(self, sid: int) -> None:
        await self._cancel(sid)
        if self._controller is not None:
            try:
                await self._controller.request_json(
                    "POST", f"{self._controller_path}/cancel_notice", {"session_id": sid},
                    headers=[("session_id", str(sid))], timeout=10.0,
                )
            except TransportError as exc:
                log.warning("could not send the cancel notice of session %s to the controller: %s", sid, exc)

    async def _finish(self, sid: int) -> None:
        """Forget session ``sid`` and close it (once, shielded, bounded by close_timeout)."""
        running = self.sessions.pop(sid, None)
        if running is None or running.session is None:
            return
        with anyio.CancelScope(shield=True):
            try:
                with anyio.fail_after(self.close_timeout):
                    await running.session.close()
            except Exception as exc:
                log.warning("closing session %s of %s failed: %s: %s", sid, self.task_name, type(exc).__name__, exc)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- heartbeats and serving -----------------------------------------------------------

    def heartbeat_payload(self) -> dict[str, Any]:
        return {"name": self.task_name, "address": self.address, "concurrency": self.concurrency,
                "indices": self.indices}

    async def send_heartbeat(self) -> bool:
        assert self._controller is not None
        try:
            response = await self._controller.request_json(
                "POST", f"{self._controller_path}/receive_heartbeat", self.heartbeat_payload(),
                timeout=max(self.heartbeat_interval, 5.0),
            )
        except TransportError as exc:
            log.warning("heartbeat to %s failed: %s", self.controller_url, exc)
            return False
        if response.status != 200:
            log.error("the controller rejected the heartbeat of %s: %s", self.task_name, response.detail())
            return False
        return True

    async def _heartbeats(self) -> None:
        while True:
            await self.send_heartbeat()
            await asyncio.sleep(self.heartbeat_interval)

    async def serve(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        address: str | None = None,
        sock: socket.socket | None = None,
        stop: asyncio.Event | None = None,
        on_ready: Any = None,
    ) -> None:
        """Listen, heartbeat, and serve until stopped; then cancel and close every session."""
        sock = sock or bind_socket(host, port)
        check_bind(sock, self.app)
        bound_host, bound_port = sock.getsockname()[:2]
        self.address = address or f"http://{_public_host(host, bound_host)}:{bound_port}/api"
        heartbeats = asyncio.ensure_future(self._heartbeats()) if self._controller is not None else None
        if on_ready is not None:
            on_ready(self)
        try:
            await serve_app(self.app, sock, stop=stop)
        finally:
            if heartbeats is not None:
                heartbeats.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await heartbeats
            await self.shutdown()

    async def shutdown(self) -> None:
        with anyio.CancelScope(shield=True):
            await asyncio.gather(*(self._cancel(sid) for sid in list(self.sessions)))
            for task in list(self._background):
                task.cancel()
            if self._controller is not None:
                self._controller.close()
            await self.env.aclose()


def _deadline(timeout: float | None) -> float:
    return anyio.current_time() + timeout if timeout else math.inf


def _public_host(requested: str, bound: str) -> str:
    if requested in ("0.0.0.0", "::", ""):
        return socket.gethostname()
    return f"[{bound}]" if ":" in bound else bound


def _describe(exc: BaseException, what: str, timeout: float | None) -> str:
    if isinstance(exc, TimeoutError):
        return f"the environment did not finish {what} within {timeout} s"
    return f"{type(exc).__name__} in {what}: {exc}"[:500]
