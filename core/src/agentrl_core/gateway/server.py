"""``agentrl gateway``: the OpenAI-compatible training gateway in front of the engine pools.

Routes (core/docs/gateway.md is the reference):

=========================================  ==================================================
``POST /v1/chat/completions``              OpenAI chat (tools, streaming), bearer = session key
``POST /v1/completions``                   OpenAI text completions
``GET /v1/models``                         the served model
``/sessions/{id}/v1/...``                  the same, bound to the session by its base URL
``POST /sessions``                         open a session: ``{id, key, base_url}``
``GET /sessions/{id}``                     its state; ``?tokens=1`` adds the captured samples
``POST /sessions/{id}/reward``             ``{reward, status?, metrics?}``
``POST /sessions/{id}/close``              end it; answers its record with every sample
``GET /sessions``                          open sessions
``POST /admin/pools``                      ``{pools: {name: [url]}}`` (an engine was replaced)
``POST /admin/pause``, ``/admin/continue`` a weight update begins / ends (``{global_step}``)
``GET /health``, ``GET /stats``            liveness; counters
=========================================  ==================================================

With a ``token`` (``--token`` / ``AGENTRL_TOKEN``, the run's shared secret) every route but
the OpenAI ones needs ``Authorization: Bearer <token>``: the session and admin routes are
the trainer's. The OpenAI routes are the agent's, authenticated by its session's key or
base URL; the gateway sends the same token to the engines. Without a token the gateway
only listens on a loopback address.

The handlers are in :mod:`.openai_api` and :mod:`.session_api`, the wire format in
:mod:`.protocol`, token capture in :mod:`.capture`, sessions in :mod:`.sessions` and the
engines' side in :mod:`.engines`. Everything runs on one event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl_core.gateway.capture import Renderer
from agentrl_core.gateway.engines import EngineRouter
from agentrl_core.gateway.protocol import OpenAIError, unauthorized
from agentrl_core.gateway.sessions import SESSION_SCOPE_KEY, GatewaySession, SessionGone, SessionStore, fingerprint
from agentrl_core.http.server import App, HTTPError, Request, Response, bind_socket, check_bind, serve_app

log = logging.getLogger(__name__)

__all__ = ["GatewayServer", "SESSION_SCOPE_KEY", "AGENT_PATHS"]

# the agent's routes: a session key (or base URL) authenticates them, not the run's token
AGENT_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models")


class GatewayServer:
    """One gateway: the model's tokenizer and template, the sessions, the engine router, the app.

    ``config`` is a :class:`~agentrl_core.config.GatewayConfig`; ``rollout`` (a
    :class:`~agentrl_core.config.RolloutConfig`) gives the sampling settings and the
    per-sample token limits.
    """

    def __init__(self, *, tokenizer: Any, pools: Mapping[str, Sequence[str]], config: Any, rollout: Any,
                 model_path: str = "", tool_parser: Any, reasoning_parser: Any = None, chat_template: Any = None,
                 sampler: Any = None, seed: int = 0, request_timeout: float | None = None,
                 token: str | None = None, lora: str | None = None) -> None:
        self.config = config
        self.token = token or None
        self.rollout = rollout
        self.model_path = model_path
        self.served_model_name = config.served_model_name or (Path(model_path).name if model_path else "agentrl")
        self.renderer = Renderer(tokenizer, chat_template)
        self.tool_parser = tool_parser
        self.reasoning_parser = reasoning_parser
        self.router = EngineRouter(pools, sampler=sampler, seed=seed, on_weight_update=config.on_weight_update,
                                   retry_after_s=config.retry_after_s, max_abort_retries=config.max_abort_retries,
                                   request_timeout=request_timeout, token=self.token, lora=lora)
        self.sessions = SessionStore(idle_timeout=config.idle_timeout, max_duration=config.max_duration,
                                     finished_ttl=config.finished_ttl, replay_window=config.replay_window,
                                     on_end=self._export if config.export else None)
        self.counters: Counter = Counter()
        self.latency = LatencyLog()
        self.started = time.time()
        self.url = ""
        self.app = self._build_app()

    # -- the app ------------------------------------------------------------------------

    def _build_app(self) -> App:
        from agentrl_core.gateway import openai_api, session_api

        app = App(name="gateway", max_body_bytes=self.config.max_body_bytes, token=self.token, open_paths=AGENT_PATHS)
        for method, path, handler in [
            ("POST", "/v1/chat/completions", openai_api.chat_completions),
            ("POST", "/v1/completions", openai_api.completions),
            ("GET", "/v1/models", openai_api.list_models),
            ("POST", "/sessions", session_api.create_session),
            ("GET", "/sessions", session_api.list_sessions),
            ("GET", "/sessions/{id}", session_api.get_session),
            ("POST", "/sessions/{id}/reward", session_api.post_reward),
            ("POST", "/sessions/{id}/close", session_api.close_session),
            ("POST", "/admin/pools", session_api.set_pools),
            ("POST", "/admin/pause", session_api.pause),
            ("POST", "/admin/continue", session_api.resume),
            ("GET", "/health", session_api.health),
            ("GET", "/stats", session_api.stats),
        ]:
            app.route(method, path, _bind(handler, self))
        app.route("GET", "/openapi.json", self.openapi)
        return app

    async def openapi(self, request: Request) -> Any:
        from agentrl_core._version import __version__
        from agentrl_core.gateway.openapi import gateway_openapi

        return gateway_openapi(__version__)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        """ASGI entry: ``/sessions/{id}/...`` paths are routed with the id moved into the scope."""
        if scope["type"] == "http":
            path = scope["path"]
            if path.startswith("/sessions/"):
                _, _, rest = path.partition("/sessions/")
                session_id, slash, tail = rest.partition("/")
                if session_id:
                    scope = {**scope, SESSION_SCOPE_KEY: session_id,
                             "path": ("/" + tail) if tail.startswith("v1/") or tail == "v1" else
                             "/sessions/{id}" + (slash + tail if tail else "")}
        await self.app(scope, receive, send)

    # -- sessions -----------------------------------------------------------------------

    def session_for_call(self, request: Request) -> GatewaySession:
        """The open session of an OpenAI call: by its base URL, else by its bearer key; 401 otherwise."""
        session_id = request.scope.get(SESSION_SCOPE_KEY)
        try:
            if session_id is not None:
                return self.sessions.get(session_id)
            auth = request.header(b"authorization") or ""
            scheme, _, key = auth.partition(" ")
            if scheme.lower() != "bearer" or not key.strip():
                raise SessionGone("send the session's key as 'Authorization: Bearer <key>', or use the session's "
                                  "base URL /sessions/{id}/v1")
            return self.sessions.for_key(key.strip())
        except SessionGone as exc:
            self.counters["unauthorized"] += 1
            raise unauthorized(str(exc)) from None

    def base_url(self, session: GatewaySession) -> str:
        return f"{self.url}/sessions/{session.id}/v1"

    async def once(self, session: GatewaySession, request: Request, make: Callable[[], Awaitable[Response]]) -> Response:
        """Run a call, or answer a replayed one (an SDK retry of an identical request) with its first answer."""
        retry = request.header(b"x-stainless-retry-count")
        idempotency = request.header(b"idempotency-key")
        call_key = fingerprint(request.path, request.body, idempotency)
        replayed = idempotency is not None or (retry is not None and retry.strip() not in ("", "0"))
        if replayed and call_key in session.replays:
            first = await asyncio.shield(session.replays[call_key])
            if first is not None:  # None: the first attempt failed and recorded nothing, so this one runs
                session.counters["replay"] += 1
                self.counters["replays"] += 1
                return first
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        session.replays[call_key] = future
        session.replays.move_to_end(call_key)
        while len(session.replays) > self.sessions.replay_window:
            if not next(iter(session.replays.values())).done():
                break
            session.replays.popitem(last=False)
        try:
            response = await make()
        except BaseException:
            future.set_result(None)
            if session.replays.get(call_key) is future:
                del session.replays[call_key]
            raise
        future.set_result(response)
        return response

    # -- running ------------------------------------------------------------------------

    async def reap(self, interval: float) -> None:
        """Expire sessions whose client went quiet or whose deadline passed; forget old records."""
        while True:
            await asyncio.sleep(interval)
            for session in self.sessions.expire_due():
                log.info("session %s expired: %s", session.id, session.end_reason)

    async def serve(self, host: str = "127.0.0.1", port: int = 0, *, stop: asyncio.Event | None = None,
                    on_listening: Callable[[str], None] | None = None) -> None:
        sock = bind_socket(host, port)
        check_bind(sock, self.app)
        self.url = f"http://{host if ':' not in host else f'[{host}]'}:{sock.getsockname()[1]}"
        reaper = asyncio.ensure_future(self.reap(min(5.0, max(0.05, self.config.idle_timeout / 4))))
        try:
            if on_listening is not None:
                on_listening(self.url)
            await serve_app(self, sock, stop=stop)  # type: ignore[arg-type]  (self.token: checked as the app's)
        finally:
            reaper.cancel()
            sock.close()
            await self.router.aclose()

    def _export(self, session: GatewaySession) -> None:
        path = Path(self.config.export)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(session.export(), ensure_ascii=False) + "\n")


def _bind(handler: Callable[[GatewayServer, Request], Awaitable[Any]], gateway: GatewayServer) -> Callable:
    async def bound(request: Request) -> Any:
        try:
            return await handler(gateway, request)
        except OpenAIError as exc:
            return exc.response()
        except HTTPError as exc:  # a malformed body, from the HTTP kit: OpenAI's shape on OpenAI routes
            if request.path.startswith("/v1/"):
                return OpenAIError(exc.status, exc.detail, headers=exc.headers).response()
            raise

    return bound


class LatencyLog:
    """The gateway's own time per call (handler time minus engine time), for ``/stats`` and the benchmark."""

    def __init__(self, keep: int = 100_000) -> None:
        self.overhead_ms: list[float] = []
        self.keep = keep

    def add(self, total_s: float, engine_s: float) -> None:
        if len(self.overhead_ms) >= self.keep:
            del self.overhead_ms[: self.keep // 2]
        self.overhead_ms.append(max(0.0, (total_s - engine_s) * 1000))

    def percentiles(self) -> dict[str, float]:
        values = sorted(self.overhead_ms)
        if not values:
            return {}

        def pick(q: float) -> float:
            return values[min(len(values) - 1, int(q * len(values)))]

        return {"overhead_ms_p50": pick(0.5), "overhead_ms_p99": pick(0.99), "calls_timed": float(len(values))}
