"""A lean pooled HTTP/1.1 client for controller <-> worker traffic.

One :class:`Pool` per origin keeps idle keep-alive connections (newest first) and parses
responses with httptools. It is several times cheaper per request than a general client,
which matters because every environment turn crosses it. Failures are typed so callers can
decide what is safe to retry: :class:`ConnectFailed` means the request never reached the
server; :class:`ConnectionBroken` means it may have; :class:`RequestTimeout` means no full
answer arrived in time. Plain ``http://`` only: workers live on a trusted network, and a
``token`` sends the run's ``Authorization: Bearer`` header with every request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

import httptools

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


class TransportError(Exception):
    """The HTTP exchange failed below the HTTP level."""


class ConnectFailed(TransportError):
    """No connection could be made: the request was not sent (safe to retry)."""


class ConnectionBroken(TransportError):
    """The connection broke after the request was (possibly) sent."""


class RequestTimeout(TransportError):
    """No complete response arrived in time."""


class _NotSent(ConnectionBroken):
    """The connection was closed before a byte of the request went out: any request may be sent again."""


class Response:
    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)

    def detail(self) -> str:
        """The server's one-sentence reason (``detail`` of a JSON error), else the raw text."""
        try:
            data = json.loads(self.body)
        except ValueError:
            return self.body.decode(errors="replace")[:300].strip() or f"HTTP {self.status}"
        if isinstance(data, dict) and "detail" in data:
            detail = data["detail"]
            return detail if isinstance(detail, str) else json.dumps(detail)[:300]
        return json.dumps(data)[:300]


class _Connection(asyncio.Protocol):
    """One keep-alive connection; carries one request at a time."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future | None = None
        self.closed = False
        self.idle_since = 0.0
        self.got_bytes = False
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._complete = False

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionBroken(f"malformed HTTP response from {self.pool.origin}: {exc}"))
            self.close()

    def eof_received(self) -> bool | None:
        self._fail(ConnectionBroken(f"{self.pool.origin} closed the connection before answering"))
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        reason = f": {exc}" if exc else ""
        self._fail(ConnectionBroken(f"the connection to {self.pool.origin} was lost{reason}"))

    # -- httptools callbacks ------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        # Read keep-alive now: the parser resets its flags once this callback returns.
        self._complete = self.parser.should_keep_alive()
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(Response(self.parser.get_status_code(), self._headers, b"".join(self._body)))

    # -- use ----------------------------------------------------------------------------

    def send(self, data: bytes) -> asyncio.Future:
        self._headers = {}
        self._body = []
        self._complete = False  # set to 'reusable' when the response completes
        self.got_bytes = False
        transport = self.transport
        assert transport is not None
        if not self.open():
            self.closed = True
            raise _NotSent(f"the connection to {self.pool.origin} closed before the request was sent")
        waiter = asyncio.get_running_loop().create_future()
        try:
            transport.write(data)
        except RuntimeError:  # uvloop, when the handle closed under us: nothing was sent
            self.closed = True
            raise _NotSent(f"the connection to {self.pool.origin} closed before the request was sent") from None
        self.waiter = waiter
        return waiter

    def open(self) -> bool:
        """Not closed, also by the peer: a reset closes the transport at once, ``connection_lost`` only comes later."""
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def reusable(self) -> bool:
        return self.open() and self._complete

    def _fail(self, exc: Exception) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def on_timeout(self) -> None:
        self._fail(RequestTimeout(f"{self.pool.origin} did not answer in time"))
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Pool:
    """Keep-alive connections to one ``http://host:port`` origin."""

    def __init__(self, host: str, port: int, *, connect_timeout: float = 5.0, idle_timeout: float = 4.0,
                 token: str | None = None) -> None:
        self.host = host
        self.port = port
        self.origin = f"http://{host}:{port}"
        self.connect_timeout = connect_timeout
        # Below uvicorn's default keep-alive (5 s), so we drop a connection before the server does.
        self.idle_timeout = idle_timeout
        self._idle: list[_Connection] = []
        self._host_header = f"Host: {host}:{port}\r\n".encode()
        if token:  # every request carries the run's token (agentrl_core.http.auth)
            self._host_header += f"Authorization: Bearer {token}\r\n".encode("latin-1")

    @classmethod
    def for_url(cls, url: str, **kwargs: Any) -> tuple[Pool, str]:
        """A pool for ``url``'s origin and the URL's path without a trailing slash."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{url!r} is not an http://host:port URL")
        try:
            port = parts.port or 80
        except ValueError:
            raise ValueError(f"{url!r} has an invalid port") from None
        return cls(parts.hostname, port, **kwargs), parts.path.rstrip("/")

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(self), self.host, self.port), self.connect_timeout
            )
        except asyncio.TimeoutError:
            raise ConnectFailed(f"connecting to {self.origin} timed out after {self.connect_timeout} s") from None
        except (OSError, UnicodeError) as exc:
            raise ConnectFailed(f"cannot connect to {self.origin}: {exc.strerror or exc}"
                                if isinstance(exc, OSError) else f"cannot connect to {self.origin}: {exc}") from None
        return conn

    def _take_idle(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.open() and now - conn.idle_since < self.idle_timeout:
                return conn
            conn.close()
        return None

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        *,
        headers: Iterable[tuple[str, str]] = (),
        timeout: float | None = None,
        retry_stale: bool = True,
    ) -> Response:
        """Send one request and return the response (any status).

        ``retry_stale``: when a reused idle connection turns out to be closed before any
        byte of the answer arrived, send once more on a fresh connection. Pass False for
        requests that must never be replayed.
        """
        head = [f"{method} {path} HTTP/1.1\r\n".encode(), self._host_header]
        for name, value in headers:
            head.append(f"{name}: {value}\r\n".encode("latin-1"))
        if body or method != "GET":
            head.append(b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body))
        head.append(b"\r\n")
        data = b"".join(head) + body
        conn = self._take_idle()
        reused = conn is not None
        if conn is None:
            conn = await self._connect()
        try:
            return await self._exchange(conn, data, timeout)
        except _NotSent:
            if not reused:
                raise
        except ConnectionBroken:
            if not (reused and retry_stale and not conn.got_bytes):
                raise
        return await self._exchange(await self._connect(), data, timeout)

    async def _exchange(self, conn: _Connection, data: bytes, timeout: float | None) -> Response:
        waiter = conn.send(data)
        handle = asyncio.get_running_loop().call_later(timeout, conn.on_timeout) if timeout else None
        try:
            response = await waiter
        except BaseException:
            conn.close()
            raise
        finally:
            if handle is not None:
                handle.cancel()
        if conn.reusable():
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.close()
        return response

    async def request_json(self, method: str, path: str, data: Any = None, **kwargs: Any) -> Response:
        body = b"" if data is None else _ENCODER.encode(data).encode()
        return await self.request(method, path, body, **kwargs)

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()
