"""The controller <-> worker HTTP client (agentrl_core.http.client) on a connection the peer closed.

A peer's reset closes the transport at once, but the protocol hears of it (``connection_lost``)
only on a later pass of the event loop. A request that took that idle connection in between
used to write to a closed transport: uvloop raised RuntimeError (an unhandled error in the
controller's start_sample, which left the session listed), asyncio dropped the bytes and the
request failed once the loss was heard, even though nothing had been sent. Both loops are
tested: agentrl's servers run on uvloop when it is installed.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from agentrl_core.http.client import ConnectFailed, Pool

pytestmark = pytest.mark.anyio


@pytest.fixture(params=[pytest.param(("asyncio", {}), id="asyncio"),
                        pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")])
def anyio_backend(request):
    return request.param


async def keep_alive_server() -> tuple[asyncio.Server, list[bytes]]:
    """Answers every request ``200 ok`` on a kept-alive connection; records each request line."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                seen.append(head.split(b"\r\n", 1)[0])
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0), seen


@contextlib.asynccontextmanager
async def pool_with_an_idle_connection():
    """A pool whose one idle connection has answered ``GET /first``; the requests the server saw."""
    server, seen = await keep_alive_server()
    pool = Pool("127.0.0.1", server.sockets[0].getsockname()[1])
    try:
        assert (await pool.request("GET", "/first")).status == 200
        yield pool, seen
    finally:
        pool.close()
        server.close()
        await server.wait_closed()


async def test_an_idle_connection_closed_by_the_peer_is_not_used_and_nothing_is_lost():
    async with pool_with_an_idle_connection() as (pool, seen):
        (idle,) = pool._idle
        idle.transport.abort()  # as a reset does: closed now, connection_lost on a later pass of the loop
        assert not idle.closed  # the protocol has not heard yet
        # a request that must never be replayed: nothing of it was sent, so it goes on a new connection
        response = await pool.request("POST", "/interact", b"{}", retry_stale=False)
        assert (response.status, response.body) == (200, b"ok")
        assert seen == [b"GET /first HTTP/1.1", b"POST /interact HTTP/1.1"]


async def test_a_connection_closed_between_taking_and_sending_is_sent_again_on_a_new_one():
    async with pool_with_an_idle_connection() as (pool, seen):
        take = pool._take_idle

        def take_then_reset():  # the reset lands after the pool's check, before the write
            conn = take()
            conn.transport.abort()
            return conn

        pool._take_idle = take_then_reset
        response = await pool.request("POST", "/start_sample", b"{}", retry_stale=False)
        assert response.status == 200 and seen[-1] == b"POST /start_sample HTTP/1.1"
        port = pool.port
    pool = Pool("127.0.0.1", port)  # the server is gone: a new connection fails as before
    with pytest.raises(ConnectFailed):
        await pool.request("GET", "/gone")


async def test_a_write_refused_by_a_closed_handle_is_sent_again_on_a_new_connection():
    async with pool_with_an_idle_connection() as (pool, seen):
        (idle,) = pool._idle

        class ClosedHandle:  # what uvloop's transport does when its handle closed under a reset
            def __init__(self, transport):
                self.transport = transport

            def is_closing(self):
                return False

            def write(self, data):
                raise RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed")

            def close(self):
                self.transport.close()

        idle.transport = ClosedHandle(idle.transport)
        response = await pool.request("POST", "/interact", b"{}", retry_stale=False)
        assert response.status == 200 and seen[-1] == b"POST /interact HTTP/1.1" and idle.closed
