"""The rollout side's controller client: retries only when safe, timeouts, clear errors."""

from __future__ import annotations

import asyncio
import socket

import anyio
import httpx
import pytest
from test_control_plane import EchoEnv, fast_config

from agentrl_core.controlplane.client import (
    ControllerClient,
    ControllerTimeout,
    ControllerUnavailable,
    Result,
    SessionConflict,
    UnknownSession,
)
from agentrl_core.env import Status, assistant_tool_call
from agentrl_core.testing.controlplane import local_control_plane

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def reserved_port() -> socket.socket:
    """A bound socket that does not listen yet: connecting to it is refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


class ObservedTransport(httpx.AsyncBaseTransport):
    """Passes requests through and records what failed (observation only)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.refused = asyncio.Event()
        self.attempts = 0

    async def handle_async_request(self, request):
        self.attempts += 1
        try:
            return await self.inner.handle_async_request(request)
        except httpx.ConnectError:
            self.refused.set()
            raise

    async def aclose(self):
        await self.inner.aclose()


async def forward(sock: socket.socket, target_port: int) -> asyncio.AbstractServer:
    """Start listening on ``sock`` and relay every connection to ``target_port`` (a TCP proxy)."""

    async def pipe(reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def handle(reader, writer):
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    sock.listen(64)
    sock.setblocking(False)
    return await asyncio.start_server(handle, sock=sock)


async def test_start_retries_while_the_controller_is_unreachable():
    env = EchoEnv()
    async with local_control_plane(fast_config()) as plane:
        await plane.add_worker(env, "std")
        port = int(plane.url.rsplit(":", 1)[1].split("/")[0])
        front = reserved_port()
        transport = ObservedTransport()
        url = f"http://127.0.0.1:{front.getsockname()[1]}/api"
        async with ControllerClient(url, transport=transport, start_retries=50, retry_delay=0.02) as client:
            async with anyio.create_task_group() as tg:
                results = []

                async def start():
                    results.append(await client.start("echo-std", 2))

                tg.start_soon(start)
                await transport.refused.wait()  # the first attempt was refused for real
                server = await forward(front, port)  # now the controller becomes reachable
            server.close()
            assert transport.attempts >= 2 and results[0].messages == [{"role": "user", "content": "task 2"}]
            assert env.live == 1


async def test_start_gives_up_with_a_clear_error():
    sock = reserved_port()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/api"
    async with ControllerClient(url, start_retries=2, retry_delay=0.01) as client:
        with anyio.fail_after(5), pytest.raises(ControllerUnavailable, match=r"cannot reach the controller at http://"):
            await client.start("echo-std", 0)
    sock.close()


class Swallower:
    """A controller test double that reads each request and hangs up (or never answers)."""

    def __init__(self, answer: bool) -> None:
        self.requests: list[bytes] = []
        self.hang = not answer
        self.release = asyncio.Event()

    async def handle(self, reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0)
        await reader.readexactly(length)
        self.requests.append(head.split(b"\r\n")[0])
        if self.hang:
            await self.release.wait()
        writer.close()

    async def __aenter__(self):
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/api"
        return self

    async def __aexit__(self, *exc):
        self.release.set()
        self.server.close()


async def test_interact_is_never_replayed():
    async with Swallower(answer=True) as double, ControllerClient(double.url, start_retries=5) as client:
        with pytest.raises(ControllerUnavailable, match="broke during interact"):
            await client.interact(7, assistant_tool_call("ping", {"n": 1}))
        assert double.requests == [b"POST /api/interact HTTP/1.1"]
        with pytest.raises(ControllerUnavailable, match="broke during start_sample"):
            await client.start("echo-std", 0)  # it may have started: not retried either
        assert len(double.requests) == 2


async def test_every_call_has_a_timeout():
    async with Swallower(answer=False) as double, ControllerClient(double.url, interact_timeout=0.3,
                                                                    timeout=0.3) as client:
        with anyio.fail_after(3):
            with pytest.raises(ControllerTimeout, match="did not answer interact in time"):
                await client.interact(7, assistant_tool_call("ping", {"n": 1}))
            with pytest.raises(ControllerTimeout, match="did not answer cancel in time"):
                await client.cancel(7)


async def test_errors_carry_the_controllers_reason():
    async with local_control_plane(fast_config()) as plane:
        await plane.add_worker(EchoEnv(), "std")
        async with ControllerClient(plane.url) as client:
            with pytest.raises(UnknownSession, match=r"get_indices failed \(404\): no worker serves task 'nope'"):
                await client.get_indices("nope")
            with pytest.raises(UnknownSession, match="there is no session 5"):
                await client.interact(5, assistant_tool_call("ping", {"n": 1}))
            assert await client.cancel(5) is False
            started = await client.start("echo-std", 1)
            done = await client.interact(started.session_id, [assistant_tool_call("finish", {"reward": 1})])
            assert done.finish and done.status is Status.COMPLETED and done.reward == 1.0
            with pytest.raises(SessionConflict) as info:
                await client.interact(started.session_id, assistant_tool_call("ping", {"n": 1}))
            assert info.value.status == 409
            assert await client.cancel(started.session_id) is False


def test_results_from_upstream_shaped_answers():
    upstream = Result.from_json({"messages": [], "finish": True, "reward": 1, "metric": {"score": 0.5}})
    assert upstream.status is Status.UNKNOWN and upstream.finish and upstream.metrics == {"score": 0.5}
    running = Result.from_json({"messages": [{"role": "tool", "content": "x"}], "status": "running"})
    assert not running.finish and running.reward == 0.0
    error = Result.from_json({"messages": [], "status": "task error", "finish": True, "metrics": {"error": "boom"}})
    assert error.status is Status.TASK_ERROR and error.metrics["error"] == "boom"
    with pytest.raises(Exception, match="unknown status 'exploded'"):
        Result.from_json({"status": "exploded"})
