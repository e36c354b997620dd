"""Controller + task worker + client in one event loop: the protocol and the bookkeeping.

Fault tests with real processes are in test_control_plane_faults.py.
"""

from __future__ import annotations

import json

import anyio
import httpx
import pytest

from agentrl_core.config import ControllerConfig
from agentrl_core.controlplane.client import (
    ControllerClient,
    NoCapacity,
    RequestRejected,
    SessionConflict,
    UnknownSession,
)
from agentrl_core.controlplane.openapi import controller_openapi
from agentrl_core.env import Environment, Status, Step, ToolSession, assistant_tool_call, function_tool, tool_result
from agentrl_core.http.server import HTTPError
from agentrl_core.testing.controlplane import local_control_plane

pytestmark = pytest.mark.anyio

TOOLS = [
    function_tool("ping", "answer pong", {"n": {"type": "integer"}}, ["n"]),
    function_tool("wait", "take a while", {"seconds": {"type": "number"}}, ["seconds"]),
    function_tool("block", "wait until the test releases the environment", {}),
    function_tool("fail", "the sandbox breaks", {}),
    function_tool("finish", "end the episode", {"reward": {"type": "number"}}, ["reward"]),
]


class EchoSession(ToolSession):
    def __init__(self, env: EchoEnv, index) -> None:
        super().__init__(TOOLS, max_rounds=50)
        self.env = env
        self.index = index

    async def on_start(self) -> Step:
        if self.index == "broken":
            raise RuntimeError("the sandbox did not come up")
        self.env.live += 1
        return Step([{"role": "user", "content": f"task {self.index}"}])

    async def on_tool_call(self, call, message) -> Step:
        if call.name == "ping":
            return Step([tool_result(call, f"pong {call.arguments['n']}")])
        if call.name == "wait":
            await anyio.sleep(call.arguments["seconds"])
            return Step([tool_result(call, "waited")])
        if call.name == "block":
            await self.env.release.wait()
            return Step([tool_result(call, "released")])
        if call.name == "fail":
            raise RuntimeError("the sandbox broke")
        return Step([tool_result(call, "bye")], status=Status.COMPLETED, reward=call.arguments["reward"],
                    metrics={"answer": "ok"})

    async def on_close(self) -> None:
        self.env.closed += 1
        if self.index != "broken":
            self.env.live -= 1


class EchoEnv(Environment):
    name = "echo"
    tools = TOOLS

    def __init__(self, concurrency: int = 16) -> None:
        super().__init__()
        self.concurrency = concurrency
        self.live = 0
        self.closed = 0
        self.release = anyio.Event()

    def index_sets(self):
        return {"std": list(range(10)), "named": ["a", "b", "c", "broken"]}

    async def open(self, split, index):
        return EchoSession(self, self.check_index(split, index))


def ping(n: int = 1):
    return assistant_tool_call("ping", {"n": n})


async def eventually(predicate, timeout: float = 5.0, what: str = "condition") -> None:
    """Poll a condition (never a fixed sleep): the control plane works in the background."""
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.01)


@pytest.fixture
def anyio_backend():
    return "asyncio"


def fast_config(**overrides) -> ControllerConfig:
    return ControllerConfig(**{"unresponsive_after": 5.0, "cancel_timeout": 5.0, **overrides})


async def test_episode_through_controller():
    env = EchoEnv()
    async with local_control_plane(fast_config()) as plane:
        worker = await plane.add_worker(env, "std")
        async with ControllerClient(plane.url) as client:
            assert await client.get_indices("echo-std") == list(range(10))
            started = await client.start("echo-std", 3)
            assert isinstance(started.session_id, int) and started.status is Status.RUNNING
            assert started.messages == [{"role": "user", "content": "task 3"}]
            assert [t["function"]["name"] for t in started.tools] == [t["function"]["name"] for t in TOOLS]
            result = await client.interact(started.session_id, ping(7))
            assert result.messages[0]["content"] == "pong 7" and not result.finish
            assert result.metrics == {"rounds": 1, "invalid_turns": 0}
            result = await client.interact(started.session_id, assistant_tool_call("finish", {"reward": 0.5}))
            assert result.finish and result.status is Status.COMPLETED and result.reward == 0.5
            assert result.metrics == {"rounds": 2, "invalid_turns": 0, "answer": "ok"}
            assert await client.list_sessions() == {}
            assert env.live == 0 and env.closed == 1 and worker.sessions == {}
            workers = (await client.list_workers())["echo-std"]["workers"]
            assert [w["current"] for w in workers.values()] == [0]


async def test_start_response_carries_the_session_id_header_upstream_style():
    async with local_control_plane(fast_config()) as plane:
        await plane.add_worker(EchoEnv(), "std")
        async with httpx.AsyncClient() as http:
            response = await http.post(f"{plane.url}/start_sample", json={"name": "echo-std", "index": "4"})
            assert response.status_code == 200
            sid = int(response.headers["session_id"])
            body = response.json()
            assert set(body) >= {"messages", "tools", "status", "finish", "reward", "metrics"} and "metric" not in body
            response = await http.post(f"{plane.url}/interact", headers={"session_id": str(sid)},
                                       json={"messages": [ping(2)]})
            assert response.json()["status"] == "running" and response.json()["metrics"]["rounds"] == 1


async def test_string_indices_and_int_mapping():
    env = EchoEnv()
    async with local_control_plane(fast_config()) as plane:
        await plane.add_worker(env, "named")
        async with ControllerClient(plane.url) as client:
            assert await client.get_indices("echo-named") == ["a", "b", "c", "broken"]
            by_name = await client.start("echo-named", "b")
            by_position = await client.start("echo-named", 1)  # int indices map onto string lists
            assert by_name.messages == by_position.messages == [{"role": "user", "content": "task b"}]
            sessions = await client.list_sessions()
            assert sessions[str(by_position.session_id)]["index"] == "b"
            with pytest.raises(Exception, match="index 'z' is not an index of task 'echo-named'"):
                await client.start("echo-named", "z")
            with pytest.raises(UnknownSession, match="no worker serves task 'nope'"):
                await client.start("nope", 0)


async def test_an_exception_in_one_session_is_task_error_for_that_session_only():
    env = EchoEnv()
    async with local_control_plane(fast_config()) as plane:
        await plane.add_worker(env, "std")
        async with ControllerClient(plane.url) as client:
            a, b = await client.start("echo-std", 0), await client.start("echo-std", 1)
            broken = await client.interact(a.session_id, assistant_tool_call("fail", {}))
            assert broken.finish and broken.status is Status.TASK_ERROR
            assert "RuntimeError in step: the sandbox broke" in broken.metrics["error"]
            fine = await client.interact(b.session_id, ping(3))
            assert fine.status is Status.RUNNING and fine.messages[0]["content"] == "pong 3"
            assert env.live == 1 and env.closed == 1
            with pytest.raises(SessionConflict, match="already ended"):
                await client.interact(a.session_id, ping())


async def test_an_exception_while_starting_is_task_error():
    env = EchoEnv()
    async with local_control_plane(fast_config()) as plane:
        worker = await plane.add_worker(env, "named")
        async with ControllerClient(plane.url) as client:
            started = await client.start("echo-named", "broken")
            assert started.finish and started.status is Status.TASK_ERROR
            assert "the sandbox did not come up" in started.metrics["error"]
            assert worker.sessions == {} and await client.list_sessions() == {}
            assert env.closed == 1  # opened sessions are closed even when start() fails


async def test_a_step_over_the_step_timeout_is_task_error():
    env = EchoEnv()
    async with local_control_plane(fast_config()) as plane:
        await plane.add_worker(env, "std", step_timeout=0.2)
        async with ControllerClient(plane.url) as client:
            started = await client.start("echo-std", 0)
            with anyio.fail_after(3):
                result = await client.interact(started.session_id, assistant_tool_call("wait", {"seconds": 30}))
            assert result.status is Status.TASK_ERROR and "within 0.2 s" in result.metrics["error"]
            assert env.live == 0 and env.closed == 1


async def test_least_loaded_dispatch_capacity_and_all_full():
    small, large = EchoEnv(), EchoEnv()
    async with local_control_plane(fast_config()) as plane:
        w_small = await plane.add_worker(small, "std", concurrency=2)
        w_large = await plane.add_worker(large, "std", concurrency=3)
        async with ControllerClient(plane.url) as client:
            sessions = [await client.start("echo-std", i) for i in range(5)]
            # free slots (2, 3): large, then the tie (2, 2) goes to the first registered, ...
            assert (len(w_small.sessions), len(w_large.sessions)) == (2, 3)
            with anyio.fail_after(1):  # all full: a clear error, quickly
                with pytest.raises(NoCapacity, match=r"every worker of task 'echo-std' is full \(5 of 5 slots"):
                    await client.start("echo-std", 9)
            await client.interact(sessions[0].session_id, assistant_tool_call("finish", {"reward": 1}))
            again = await client.start("echo-std", 9)
            assert again.status is Status.RUNNING
            workers = (await client.list_workers())["echo-std"]["workers"]
            assert sorted((w["capacity"], w["current"]) for w in workers.values()) == [(2, 2), (3, 3)]


async def test_a_worker_that_answers_406_is_skipped_for_another():
    first, second = EchoEnv(), EchoEnv()
    async with local_control_plane(fast_config()) as plane:
        w1 = await plane.add_worker(first, "std", concurrency=1)
        w2 = await plane.add_worker(second, "std", concurrency=1)
        async with httpx.AsyncClient() as http:  # fill w1 behind the controller's back
            direct = await http.post(f"{w1.address}/start_sample", json={"index": 0, "session_id": 42})
            assert direct.status_code == 200
        async with ControllerClient(plane.url) as client:
            started = await client.start("echo-std", 5)
            assert started.status is Status.RUNNING and list(w2.sessions) == [started.session_id]
            await client._call("POST", "sync_all")
            sessions = await client.list_sessions()
            assert sessions["42"]["worker_id"] == 0  # the stray session was adopted, its slot counted
            with pytest.raises(NoCapacity):
                await client.start("echo-std", 6)


async def test_cancel_releases_the_session_and_its_slot():
    env = EchoEnv()
    async with local_control_plane(fast_config()) as plane:
        worker = await plane.add_worker(env, "std", concurrency=1)
        async with ControllerClient(plane.url) as client:
            started = await client.start("echo-std", 0)
            assert await client.cancel(started.session_id) is True
            await eventually(lambda: env.closed == 1 and not worker.sessions)
            assert env.live == 0
            await eventually(lambda: not plane.controller.state.pending_cancels)  # the worker's cancel notice
            assert (await client.start("echo-std", 1)).status is Status.RUNNING
            assert await client.cancel(started.session_id) is False  # already ended: not an error
            with pytest.raises(SessionConflict, match="it was cancelled"):
                await client.interact(started.session_id, ping())


async def test_cancel_during_a_step_interrupts_it_and_closes_the_session():
    env = EchoEnv()
    async with local_control_plane(fast_config()) as plane:
        await plane.add_worker(env, "std")
        async with ControllerClient(plane.url) as client:
            started = await client.start("echo-std", 0)
            results = []

            async def step():
                results.append(await client.interact(started.session_id, assistant_tool_call("block", {})))

            async with anyio.create_task_group() as tg:
                tg.start_soon(step)
                await eventually(lambda: plane.controller.state.sessions[started.session_id].busy)
                with pytest.raises(SessionConflict, match="busy with another call"):
                    await client.interact(started.session_id, ping())
                await client.cancel(started.session_id)
            assert results[0].status is Status.CANCELLED and results[0].finish
            await eventually(lambda: env.closed == 1)
            assert env.live == 0


async def test_idle_sessions_expire_and_are_closed():
    env = EchoEnv()
    async with local_control_plane(fast_config(idle_session_timeout=0.3)) as plane:
        await plane.add_worker(env, "std")
        async with ControllerClient(plane.url) as client:
            started = await client.start("echo-std", 0)
            await eventually(lambda: env.closed == 1)
            with pytest.raises(SessionConflict, match=r"expired after 0.3 s without a call"):
                await client.interact(started.session_id, ping())


async def test_mark_stale_drains_a_worker():
    a_env, b_env = EchoEnv(), EchoEnv()
    async with local_control_plane(fast_config()) as plane:
        a = await plane.add_worker(a_env, "std")
        b = await plane.add_worker(b_env, "std")
        async with ControllerClient(plane.url) as client:
            on_a = await client.start("echo-std", 0)
            assert list(a.sessions) == [on_a.session_id]
            drained = await client.mark_stale("echo-std", 0, True)
            assert drained["stale"] is True and drained["state"] == "draining"
            for i in range(3):
                await client.start("echo-std", i)
            assert len(a.sessions) == 1 and len(b.sessions) == 3
            assert (await client.interact(on_a.session_id, ping())).status is Status.RUNNING  # existing ones go on
            await client.mark_stale("echo-std", 0, False)
            await client.start("echo-std", 4)
            assert len(a.sessions) == 2
            with pytest.raises(UnknownSession, match="there is no worker 7"):
                await client.mark_stale("echo-std", 7)


async def test_cancel_all_needs_a_name_when_several_tasks_are_registered():
    env = EchoEnv()
    async with local_control_plane(fast_config()) as plane:
        std = await plane.add_worker(env, "std")
        named = await plane.add_worker(env, "named")
        async with ControllerClient(plane.url) as client:
            await client.start("echo-std", 0)
            await client.start("echo-named", "a")
            with pytest.raises(Exception, match=r"2 tasks are registered \(echo-named, echo-std\); pass name="):
                await client.cancel_all()
            assert (await client.cancel_all("echo-std"))["cancelled"] == 1
            assert not std.sessions and len(named.sessions) == 1
            assert (await client.cancel_all(force=True))["cancelled"] == 1
            assert not named.sessions and env.live == 0


async def test_heartbeat_with_other_indices_is_rejected():
    async with local_control_plane(fast_config()) as plane:
        worker = await plane.add_worker(EchoEnv(), "std")
        async with httpx.AsyncClient() as http:
            response = await http.post(f"{plane.url}/receive_heartbeat", json={
                "name": "echo-std", "address": "http://127.0.0.1:1/api", "concurrency": 4, "indices": [0, 1]})
            assert response.status_code == 409
            assert response.json()["detail"].startswith("task 'echo-std' is registered with different indices")
            response = await http.post(f"{plane.url}/receive_heartbeat", json=worker.heartbeat_payload())
            assert response.status_code == 200 and response.json()["worker_id"] == 0


async def test_reconciliation_adopts_unknown_sessions_and_fails_vanished_ones():
    env = EchoEnv()
    async with local_control_plane(fast_config()) as plane:
        worker = await plane.add_worker(env, "std")
        async with ControllerClient(plane.url) as client, httpx.AsyncClient() as http:
            kept = await client.start("echo-std", 0)
            vanished = await client.start("echo-std", 1)
            # behind the controller: one session appears on the worker, one disappears
            assert (await http.post(f"{worker.address}/start_sample", json={"index": 2, "session_id": 7})).status_code == 200
            assert (await http.post(f"{worker.address}/cancel", json={"session_id": vanished.session_id})).status_code == 200
            assert await client._call("POST", "sync_all") == {"0": True}
            adopted = await client.interact(7, ping(5))  # the adopted session works through the controller
            assert adopted.messages[0]["content"] == "pong 5"
            failed = await client.interact(vanished.session_id, ping())
            assert failed.status is Status.TASK_ERROR and "no longer holds" in failed.metrics["error"]
            assert (await client.interact(kept.session_id, ping())).status is Status.RUNNING


async def test_worker_protocol_errors():
    async with local_control_plane(fast_config()) as plane:
        worker = await plane.add_worker(EchoEnv(), "std", concurrency=1)
        async with httpx.AsyncClient(base_url=worker.address + "/") as http:
            assert (await http.post("start_sample", json={"index": 0, "session_id": 1})).status_code == 200
            duplicate = await http.post("start_sample", json={"index": 1, "session_id": 1})
            assert duplicate.status_code == 400 and "already exists" in duplicate.json()["detail"]
            full = await http.post("start_sample", json={"index": 1, "session_id": 2})
            assert full.status_code == 406 and "this worker is full: 1 of 1" in full.json()["detail"]
            unknown = await http.post("interact", json={"session_id": 5, "messages": [ping()]})
            assert unknown.status_code == 404
            custom = await http.post("start_sample", json={"index": -1, "session_id": 3, "custom_task": {"x": 1}})
            assert custom.status_code == 400 and "custom tasks" in custom.json()["detail"]
            assert (await http.get("get_sessions")).json() == {"1": 0}
            assert (await http.get("worker_status")).json() == {"concurrency": 1, "current": 1}
            assert (await http.post("cancel", json={"session_id": 9})).status_code == 404
            assert (await http.post("cancel_all")).json() == {"cancelled": [1]}


async def test_observability_routes_and_openapi_cover_every_route():
    async with local_control_plane(fast_config()) as plane:
        await plane.add_worker(EchoEnv(), "std")
        async with ControllerClient(plane.url) as client, httpx.AsyncClient() as http:
            started = await client.start("echo-std", 0)
            await client.interact(started.session_id, assistant_tool_call("finish", {"reward": 1}))
            root = plane.url.removesuffix("/api")
            metrics = (await http.get(f"{root}/metrics")).text
            assert 'agentrl_controller_sessions_started_total{task="echo-std"} 1' in metrics
            assert 'agentrl_controller_sessions_finished_total{task="echo-std",status="completed"} 1' in metrics
            assert 'agentrl_controller_requests_total{route="/api/interact",code="200"} 1' in metrics
            assert 'agentrl_controller_workers{task="echo-std",state="alive"} 1' in metrics
            health = await client.health()
            assert health["status"] == "ok" and health["alive_workers"] == 1
            version = (await http.get(f"{plane.url}/version")).json()
            assert version["protocol"] == "agentrl-controller/1"
            document = (await http.get(f"{root}/openapi.json")).json()
    routes = {(method.lower(), path) for method, path, _ in plane.controller.routes()}
    documented = {(method, path) for path, ops in document["paths"].items() for method in ops}
    assert routes == documented
    assert json.dumps(controller_openapi("x"))  # serializable


async def test_sessions_start_during_a_slow_reconciliation_and_survive_it():
    env = EchoEnv()
    async with local_control_plane(fast_config()) as plane:
        worker = await plane.add_worker(env, "std")
        answer_sessions = worker.app.routes[("GET", "/api/get_sessions")]
        asked, release = anyio.Event(), anyio.Event()

        async def slow_get_sessions(request):  # the real answer, computed now, delivered late
            listed = await answer_sessions(request)
            asked.set()
            await release.wait()
            return listed

        worker.app.routes[("GET", "/api/get_sessions")] = slow_get_sessions
        async with ControllerClient(plane.url) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(client._call, "POST", "sync_all")
                await asked.wait()
                started = await client.start("echo-std", 1)  # not refused while the worker is re-synced
                release.set()
            result = await client.interact(started.session_id, ping(8))  # not judged lost by the older list
            assert result.status is Status.RUNNING and result.messages[0]["content"] == "pong 8"


async def test_upstream_workers_no_such_session_is_a_lost_session():
    # agentrl-worker 0.4.0 answers 400 {"detail": "No such session"} (not 404) when it lost a
    # session, e.g. after a restart; that is an infrastructure failure, not a bad request
    async with local_control_plane(fast_config()) as plane:
        worker = await plane.add_worker(EchoEnv(), "std")
        async with ControllerClient(plane.url) as client:
            started = await client.start("echo-std", 0)

            async def upstream_lost(request):
                raise HTTPError(400, "No such session")

            worker.app.routes[("POST", "/api/interact")] = upstream_lost
            result = await client.interact(started.session_id, ping())
            assert result.status is Status.TASK_ERROR and "no longer has session" in result.metrics["error"]


async def test_a_custom_task_at_index_minus_one_reaches_the_worker():
    async with local_control_plane(fast_config()) as plane:
        worker = await plane.add_worker(EchoEnv(), "std")
        start_sample = worker.app.routes[("POST", "/api/start_sample")]
        seen = []

        async def recording(request):
            seen.append(request.json_object())
            return await start_sample(request)

        worker.app.routes[("POST", "/api/start_sample")] = recording
        async with ControllerClient(plane.url) as client:
            with pytest.raises(RequestRejected, match="does not support custom tasks"):  # our worker's answer
                await client.start("echo-std", -1, custom_task={"question": "1 + 1"})
            with pytest.raises(RequestRejected, match="is not an index"):  # -1 without a custom task is checked
                await client.start("echo-std", -1)
        assert [(b["index"], b["custom_task"]) for b in seen] == [(-1, {"question": "1 + 1"})]


async def test_an_unforeseen_error_while_starting_leaves_no_session_listed():
    # the soak once left a session listed for good: a write to a connection its dead worker had
    # reset raised RuntimeError (uvloop) in start_sample, past the handlers of transport errors
    env = EchoEnv()
    async with local_control_plane(fast_config()) as plane:
        await plane.add_worker(env, "std")
        (worker,) = plane.controller.state.tasks["echo-std"].workers.values()

        async def broken(*args, **kwargs):
            raise RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed")

        worker.pool.request_json = broken
        async with ControllerClient(plane.url) as client:
            with pytest.raises(Exception, match="500|internal"):
                await client.start("echo-std", 0)
            assert await client.list_sessions() == {}
            del worker.pool.request_json  # the class's own again
            started = await client.start("echo-std", 1)
            assert started.status is Status.RUNNING and list(await client.list_sessions()) == [str(started.session_id)]
