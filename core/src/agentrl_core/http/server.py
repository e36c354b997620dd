"""A small ASGI application and the uvicorn runner used by the task worker and controller.

Why not a framework: the controller sits on the hot path of every environment turn, and
a route table, JSON bodies and one-sentence errors are all it needs. Requests are
dispatched by ``(method, path)`` in one dict lookup; bodies are capped while they stream
in (413); every error is ``{"detail": "<one sentence>"}`` as FastAPI writes it, which is
what upstream clients expect. A token (:mod:`agentrl_core.http.auth`) makes every route
but ``open_paths`` answer 401 to a request without ``Authorization: Bearer <token>``, and
:func:`serve_app` refuses a non-loopback address to an app without one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl

from agentrl_core.http.auth import UNAUTHORIZED, check_bearer, require_token_to_bind

log = logging.getLogger(__name__)

JSON_HEADERS = [(b"content-type", b"application/json")]


class HTTPError(Exception):
    """Answer the request with ``status`` and ``{"detail": detail}``."""

    def __init__(self, status: int, detail: str, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = list(headers)


class Response:
    __slots__ = ("status", "body", "headers")

    def __init__(self, body: bytes, status: int = 200, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.status = status
        self.body = body
        self.headers = headers if headers is not None else JSON_HEADERS


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))  # json.dumps(**kw) builds one per call


def dumps(data: Any) -> bytes:
    return _ENCODER.encode(data).encode()


def json_response(data: Any, status: int = 200, headers: Iterable[tuple[bytes, bytes]] = ()) -> Response:
    return Response(dumps(data), status, [*JSON_HEADERS, *headers])


def error_body(detail: str) -> bytes:
    return dumps({"detail": detail})


class Request:
    __slots__ = ("scope", "body", "_json", "authenticated")

    def __init__(self, scope: Mapping[str, Any], body: bytes, authenticated: bool = False) -> None:
        self.scope = scope
        self.body = body
        self._json: Any = _UNSET
        self.authenticated = authenticated  # it carried the app's token (False when the app has none)

    @property
    def path(self) -> str:
        return self.scope["path"]

    def header(self, name: bytes) -> str | None:
        """The value of header ``name`` (lowercase bytes), or None."""
        for key, value in self.scope["headers"]:
            if key == name:
                return value.decode("latin-1")
        return None

    def query(self) -> dict[str, str]:
        raw = self.scope.get("query_string", b"")
        return dict(parse_qsl(raw.decode("latin-1"), keep_blank_values=True)) if raw else {}

    def json(self, *, required: bool = True) -> Any:
        """The parsed JSON body; a clear 400 if it is not JSON (or missing when required)."""
        if self._json is _UNSET:
            if not self.body.strip():
                if required:
                    raise HTTPError(400, "the request needs a JSON body")
                self._json = None
            else:
                try:
                    self._json = json.loads(self.body)
                except (ValueError, UnicodeDecodeError) as exc:
                    raise HTTPError(400, f"the request body is not valid JSON ({_json_problem(exc)})") from None
                except RecursionError:
                    raise HTTPError(400, "the request body is JSON nested too deeply") from None
        return self._json

    def json_object(self, *, required: bool = True) -> dict[str, Any]:
        data = self.json(required=required)
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise HTTPError(400, f"the request body must be a JSON object, got {type(data).__name__}")
        return data


_UNSET = object()


def _json_problem(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at position {exc.pos}"
    return str(exc)[:100]


Handler = Callable[[Request], Awaitable[Any]]


_CHALLENGE = [(b"www-authenticate", b'Bearer realm="agentrl"')]


class App:
    """An ASGI app over a route table; handlers return a Response or JSON-able data.

    With a ``token``, a request to any path but ``open_paths`` must carry ``Authorization:
    Bearer <token>`` (compared in constant time), else it gets 401 before routing; handlers
    of open paths see ``request.authenticated``.
    """

    def __init__(self, *, name: str, max_body_bytes: int = 32 * 1024 * 1024, token: str | None = None,
                 open_paths: Iterable[str] = ()) -> None:
        self.name = name
        self.max_body_bytes = max_body_bytes
        self.token = token or None
        self.open_paths = frozenset(open_paths)
        self.routes: dict[tuple[str, str], Handler] = {}
        self._methods: dict[str, set[str]] = {}
        self.observe: Callable[[str, int], None] | None = None  # (route, status) after each request

    def route(self, method: str, path: str, handler: Handler) -> None:
        self.routes[(method, path)] = handler
        self._methods.setdefault(path, set()).add(method)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":  # we run uvicorn with lifespan="off"; answer politely anyway
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return

    async def _http(self, scope: dict, receive: Callable, send: Callable) -> None:
        path = scope["path"]
        handler = self.routes.get((scope["method"], path))
        try:
            authenticated = False
            if self.token is not None:
                authenticated = check_bearer(_header(scope, b"authorization"), self.token)
                if not authenticated and path not in self.open_paths:
                    raise HTTPError(401, UNAUTHORIZED, _CHALLENGE)
            if handler is None:
                allowed = self._methods.get(path)
                if allowed:
                    raise HTTPError(405, f"{path} accepts {', '.join(sorted(allowed))}, not {scope['method']}",
                                    [(b"allow", ", ".join(sorted(allowed)).encode())])
                raise HTTPError(404, f"there is no route {path}")
            body = await self._read_body(scope, receive)
            result = await handler(Request(scope, body, authenticated))
            response = result if isinstance(result, Response) else Response(dumps(result))
        except HTTPError as exc:
            response = Response(error_body(exc.detail), exc.status, [*JSON_HEADERS, *exc.headers])
        except Exception as exc:  # a bug: log it, and still answer with one sentence
            log.exception("%s: unhandled error in %s %s", self.name, scope["method"], path)
            response = Response(error_body(f"internal error: {type(exc).__name__}: {exc}"[:300]), 500)
        headers = response.headers
        await send({
            "type": "http.response.start",
            "status": response.status,
            "headers": [*headers, (b"content-length", str(len(response.body)).encode())],
        })
        await send({"type": "http.response.body", "body": response.body})
        if self.observe is not None:
            self.observe(path if handler is not None else "other", response.status)

    async def _read_body(self, scope: dict, receive: Callable) -> bytes:
        limit = self.max_body_bytes
        for key, value in scope["headers"]:
            if key == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    raise HTTPError(400, "the Content-Length header is not a number") from None
                if declared > limit:
                    raise HTTPError(413, f"the request body has {declared} bytes, over the limit of {limit} bytes")
                break
        message = await receive()
        body = message.get("body", b"")
        if not message.get("more_body"):
            return body
        chunks = [body]
        size = len(body)
        while message.get("more_body"):
            message = await receive()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise HTTPError(413, f"the request body has more than {limit} bytes, the limit")
            chunks.append(chunk)
        return b"".join(chunks)


def _header(scope: Mapping[str, Any], name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


# ---------------------------------------------------------------------------------------
# Running an app


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0 picks a free one); SO_REUSEADDR for quick restarts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP: asyncio then sets TCP_NODELAY on accepted connections; without it a
    # response written as head + body waits for the client's delayed ACK (40 ms per request).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(4096)
    sock.setblocking(False)
    return sock


def check_bind(sock: socket.socket, app: Any) -> None:
    """Refuse (ConfigError, and close ``sock``) when ``app`` has no token and ``sock`` is not on a loopback address.

    :func:`serve_app` checks it too; services call it as soon as they bind, before they announce themselves.
    """
    try:
        require_token_to_bind(str(sock.getsockname()[0]), getattr(app, "token", None),
                              service=getattr(app, "name", "service"))
    except Exception:
        sock.close()
        raise


def _make_server(app: App, *, keep_alive: float) -> Any:
    import uvicorn

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):  # the caller handles signals, so cleanup runs before exit
            yield

    config = uvicorn.Config(
        app,
        http="httptools",
        lifespan="off",
        access_log=False,
        log_config=None,
        log_level="warning",
        timeout_keep_alive=keep_alive,
        proxy_headers=False,
        server_header=False,
        date_header=False,
        timeout_graceful_shutdown=5,
        backlog=4096,
    )
    return _Server(config)


async def serve_app(
    app: App,
    sock: socket.socket,
    *,
    keep_alive: float = 75.0,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve ``app`` on ``sock`` until ``stop`` is set, SIGTERM/SIGINT arrive, or cancellation.

    An app without a ``token`` may only serve a loopback address (ConfigError otherwise).
    """
    check_bind(sock, app)
    server = _make_server(app, keep_alive=keep_alive)
    loop = asyncio.get_running_loop()
    installed = []

    def request_exit() -> None:
        server.should_exit = True

    if stop is None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, request_exit)
                installed.append(sig)

    async def watch_stop() -> None:
        assert stop is not None
        await stop.wait()
        server.should_exit = True

    watcher = asyncio.ensure_future(watch_stop()) if stop is not None else None
    try:
        await server.serve(sockets=[sock])
    finally:
        if watcher is not None:
            watcher.cancel()
        for sig in installed:
            loop.remove_signal_handler(sig)


def run_event_loop(main: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``main()`` on uvloop when it is installed, else on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        uvloop = None
    if uvloop is None:  # outside the except block: every traceback logged while serving would chain the ImportError
        return asyncio.run(main())
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main())
    uvloop.install()  # pragma: no cover - Python 3.10
    return asyncio.run(main())  # pragma: no cover


def tune_gc() -> None:
    """Fewer garbage collections for a long-running server process.

    Thousands of in-flight requests keep many objects alive, so the default gen-0
    threshold (700 allocations) runs collections that rescan them constantly; measured
    +20-50% round trips at concurrency 1024. Objects from start-up are frozen out of scans.
    """
    import gc

    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def raise_fd_limit() -> int:
    """Raise the soft open-file limit to the hard limit (many sessions, many sockets)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            return hard
    return soft
