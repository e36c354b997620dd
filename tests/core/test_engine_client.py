"""The engine client against answers real engines give: bare aborts, replaced engines, slow servers.

No engine runs here: ``httpx.MockTransport`` answers for the routing tests, and a raw socket
server that trickles a response byte by byte stands in for an engine that never finishes.
"""

from __future__ import annotations

import socket
import threading

import anyio
import httpx
import pytest

from agentrl_core.rollout.engine_client import EngineClient, EnginePool, EngineTimeout, GenerateResult

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def test_an_abort_before_prefill_has_no_output_ids_and_is_an_empty_abort():
    # SGLang's answer for a request aborted in its waiting queue (TokenizerManager._handle_abort_req)
    answer = {"text": "", "meta_info": {"id": "r1", "finish_reason": {"type": "abort", "message": "Abort before prefill"},
                                        "prompt_tokens": 0, "completion_tokens": 0}}
    result = GenerateResult.from_response(answer, engine="http://e")
    assert result.aborted and result.output_ids == [] and result.logprobs == []
    assert result.message == "Abort before prefill"


def answer(ids):
    return {"text": "", "output_ids": ids, "meta_info": {"finish_reason": {"type": "stop"}, "weight_version": "0",
                                                           "output_token_logprobs": [[-0.5, i, None] for i in ids]}}


async def test_a_request_finishing_on_a_replaced_engine_leaves_the_counts_right():
    release = anyio.Event()
    arrived = anyio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "old":
            arrived.set()
            await release.wait()
        return httpx.Response(200, json=answer([7]))

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        pool = EnginePool("current", ["http://old"], http=http)
        box = []
        async with anyio.create_task_group() as tg:
            async def slow():
                box.append(await pool.generate("k", [1], {"max_new_tokens": 1}))

            tg.start_soon(slow)
            await arrived.wait()
            assert pool.in_flight == {"http://old": 1}
            pool.replace_engine("http://old", "http://new")
            assert pool.in_flight == {"http://new": 0}  # the old engine's request is not the new one's load
            release.set()
        assert box[0].output_ids == [7]  # it finished on the old engine without a KeyError
        assert pool.in_flight == {"http://new": 0}
        await pool.generate("k2", [1], {"max_new_tokens": 1})
        assert pool.in_flight == {"http://new": 0}


async def test_a_replacement_at_the_same_url_is_not_decremented_by_the_old_request():
    release = anyio.Event()
    arrived = anyio.Event()
    calls = []

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) == 1:
            arrived.set()
            await release.wait()
        return httpx.Response(200, json=answer([3]))

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        pool = EnginePool("current", ["http://e"], http=http)
        async with anyio.create_task_group() as tg:
            tg.start_soon(pool.generate, "k", [1], {"max_new_tokens": 1})
            await arrived.wait()
            pool.replace_engine("http://e", "http://e")  # restarted on the same port
            release.set()
        assert pool.in_flight == {"http://e": 0}


class TricklingServer:
    """Answers every request with a chunked body that never ends: one byte every 0.1 s."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)

    def serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
                while not self.stop.wait(0.1):
                    try:
                        conn.sendall(b"1\r\n \r\n")
                    except OSError:
                        break

    def __enter__(self) -> TricklingServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


async def test_every_engine_call_has_a_whole_operation_deadline():
    # each read gets a byte within httpx's read timeout, so only a deadline on the whole call ends it
    with TricklingServer() as server:
        async with EngineClient(server.url, timeout=1.0) as client:
            with anyio.fail_after(20):  # the guard of this test, not the behaviour under test
                with pytest.raises(EngineTimeout, match="did not finish within 1 s"):
                    await client.model_info()
                with pytest.raises(EngineTimeout):
                    await client.pause_generation()
                with pytest.raises(EngineTimeout):
                    await client.request("GET", "/get_server_info", timeout=0.5)


async def test_health_waits_longer_than_sglangs_own_health_check():
    from agentrl_core.rollout.engine_client import DEFAULT_HEALTH_TIMEOUT

    assert DEFAULT_HEALTH_TIMEOUT > 20  # SGLANG_HEALTH_CHECK_TIMEOUT's default
    with TricklingServer() as server:
        async with EngineClient(server.url, health_timeout=0.5) as client:
            with anyio.fail_after(20):
                assert await client.health() is False
                assert await client.alive() is False
