"""Faults and bad input against real processes: ``agentrl controller`` and ``agentrl worker``.

The environment is a throw-away plugin distribution (entry point ``cptest``) put on the
children's PYTHONPATH, so the workers load it exactly as they load an installed plugin.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import anyio
import httpx
import pytest

from agentrl_core.controlplane.client import ControllerClient, NoCapacity
from agentrl_core.env import Status, assistant_tool_call
from agentrl_core.testing.controlplane import Spawned, spawn

pytestmark = [pytest.mark.processes, pytest.mark.anyio]

TASK = "cptest-std"

ENV_MODULE = '''
import anyio
from agentrl_core import hookimpl
from agentrl_core.env import Environment, Status, Step, ToolSession, function_tool, tool_result
from agentrl_core.types import EnvironmentSpec

TOOLS = [
    function_tool("ping", "answer pong", {"n": {"type": "integer"}}, ["n"]),
    function_tool("wait", "take a while", {"seconds": {"type": "number"}}, ["seconds"]),
    function_tool("finish", "end the episode", {"reward": {"type": "number"}}, ["reward"]),
]

class EchoSession(ToolSession):
    def __init__(self, index):
        super().__init__(TOOLS, max_rounds=1000)
        self.index = index
    async def on_start(self):
        return Step([{"role": "user", "content": f"task {self.index}"}])
    async def on_tool_call(self, call, message):
        if call.name == "ping":
            return Step([tool_result(call, f"pong {call.arguments['n']}")])
        if call.name == "wait":
            await anyio.sleep(call.arguments["seconds"])
            return Step([tool_result(call, "waited")])
        return Step([tool_result(call, "bye")], status=Status.COMPLETED, reward=call.arguments["reward"])

class EchoEnv(Environment):
    name = "cptest"
    tools = TOOLS
    concurrency = 4
    def index_sets(self):
        return {"std": list(range(20))}
    async def open(self, split, index):
        return EchoSession(self.check_index(split, index))

@hookimpl
def agentrl_environments():
    yield EnvironmentSpec(name="cptest", factory="agentrl_cp_test_env:EchoEnv")
'''


def ping(n: int = 1):
    return assistant_tool_call("ping", {"n": n})


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("cptest_plugin")
    (root / "agentrl_cp_test_env.py").write_text(textwrap.dedent(ENV_MODULE))
    info = root / "agentrl_cp_test_env-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: agentrl-cp-test-env\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[agentrl]\ncptest = agentrl_cp_test_env\n")
    return {"PYTHONPATH": str(root)}


def start_controller(*args: str, port: int = 0, env: dict | None = None) -> Spawned:
    return spawn("controller", "--port", str(port), "--cancel-timeout", "5", *args, env=env)


def start_worker(controller: Spawned, plugin_env, *args: str) -> Spawned:
    return spawn("worker", "--env", "cptest", "--controller", controller.url, "--heartbeat-interval", "0.2",
                 *args, env=plugin_env)


async def eventually(probe, timeout: float, what: str):
    """Poll ``probe`` (async) until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await anyio.sleep(0.05)


async def workers_of(client: ControllerClient, task: str = TASK) -> list[dict]:
    return list((await client.list_workers()).get(task, {}).get("workers", {}).values())


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def plane(plugin_env):
    """A controller (64 KiB body limit) and one worker of concurrency 2 for the bad-input tests."""
    controller = start_controller("--max-body-bytes", "65536")
    worker = start_worker(controller, plugin_env, "--concurrency", "2")
    wait_alive(controller.url)
    yield controller
    worker.stop()
    controller.stop()


def wait_alive(url: str, workers: int = 1, timeout: float = 30.0, headers: dict | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        found = httpx.get(f"{url}/list_workers", headers=headers).json().get(TASK, {}).get("workers", {}).values()
        if sum(w["state"] == "alive" for w in found) >= workers:
            return
        assert time.monotonic() < deadline, f"{workers} worker(s) did not register within {timeout} s"
        time.sleep(0.05)


async def assert_healthy(url: str) -> None:
    """Nothing else was disturbed: a fresh session still runs an episode."""
    async with ControllerClient(url) as client:
        started = await client.start(TASK, 1)
        assert (await client.interact(started.session_id, ping(2))).messages[0]["content"] == "pong 2"
        done = await client.interact(started.session_id, assistant_tool_call("finish", {"reward": 1}))
        assert done.status is Status.COMPLETED


def one_sentence(response: httpx.Response, status: int, fragment: str) -> str:
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    assert fragment in detail and "\n" not in detail and len(detail) < 300, detail
    return detail


# -- faults ---------------------------------------------------------------------------------


async def test_worker_killed_mid_session(plugin_env):
    controller = start_controller("--unresponsive-after", "1", "--remove-after", "3")
    try:
        worker = start_worker(controller, plugin_env, "--concurrency", "4")
        async with ControllerClient(controller.url, interact_timeout=30) as client:
            await eventually(lambda: _alive(client), 30, "the worker to register")
            idle = await client.start(TASK, 0)
            busy = await client.start(TASK, 1)
            results = []

            async def long_step():
                results.append(await client.interact(busy.session_id, assistant_tool_call("wait", {"seconds": 60})))

            async with anyio.create_task_group() as tg:
                tg.start_soon(long_step)
                await eventually(lambda: _busy(client, busy.session_id), 10, "the long step to reach the worker")
                worker.kill()  # SIGKILL: no clean-up, no goodbye
                with anyio.fail_after(5):  # no client call hangs
                    after = await client.interact(idle.session_id, ping())
            assert results[0].status is Status.TASK_ERROR and results[0].finish
            assert after.status is Status.TASK_ERROR and after.finish
            [dead] = await workers_of(client)
            assert dead["state"] != "alive" and dead["current"] == 0  # marked, and its capacity freed
            with pytest.raises(NoCapacity, match="has no live worker"):
                await client.start(TASK, 2)
            await eventually(lambda: _gone(client), 15, "the dead worker to be removed")
    finally:
        controller.stop()


async def test_hung_worker_times_out_and_recovers(plugin_env):
    controller = start_controller("--request-timeout", "1", "--unresponsive-after", "1")
    worker = start_worker(controller, plugin_env, "--concurrency", "4")
    try:
        async with ControllerClient(controller.url) as client:
            await eventually(lambda: _alive(client), 30, "the worker to register")
            stuck = await client.start(TASK, 0)
            worker.proc.send_signal(signal.SIGSTOP)  # hung: the socket accepts, nothing answers
            try:
                started = time.monotonic()
                result = await client.interact(stuck.session_id, ping())
                assert result.status is Status.TASK_ERROR and "did not answer in time" in result.metrics["error"]
                assert time.monotonic() - started < 3
                [hung] = await eventually(lambda: _unresponsive(client), 10, "the worker to be marked unresponsive")
                with pytest.raises(NoCapacity, match=r"no live worker taking sessions \(1 registered: unresponsive\)"):
                    await client.start(TASK, 1)
            finally:
                worker.proc.send_signal(signal.SIGCONT)
            await eventually(lambda: _alive(client), 10, "the worker to come back by heartbeat")
            await eventually(lambda: _slots_free(client), 10, "the timed-out session to be cancelled on the worker")
            await assert_healthy(controller.url)
    finally:
        worker.stop()
        controller.stop()


async def _unresponsive(client: ControllerClient):
    workers = await workers_of(client)
    return workers if workers and workers[0]["state"] == "unresponsive" else None


async def _busy(client: ControllerClient, sid: int) -> bool:
    return (await client.list_sessions()).get(str(sid), {}).get("locked", False)


async def _gone(client: ControllerClient) -> bool:
    return not await workers_of(client)


async def test_controller_restart_workers_reregister(plugin_env):
    controller = start_controller()
    port = int(controller.url.rsplit(":", 1)[1].split("/")[0])
    worker = start_worker(controller, plugin_env)
    try:
        async with ControllerClient(controller.url) as client:
            await eventually(lambda: _alive(client), 30, "the worker to register")
            survivor = await client.start(TASK, 3)
        controller.kill()
        controller = start_controller(port=port)
        async with ControllerClient(controller.url) as client:
            [alive] = await eventually(lambda: _alive(client), 10, "the worker to re-register by heartbeat")
            assert alive["current"] == 1  # the session it still runs was adopted
            assert (await client.interact(survivor.session_id, ping(4))).messages[0]["content"] == "pong 4"
            await assert_healthy(controller.url)
    finally:
        worker.stop()
        controller.stop()


async def _alive(client: ControllerClient):
    workers = await workers_of(client)
    return workers if workers and all(w["state"] == "alive" for w in workers) else None


async def test_all_workers_full_gives_a_clear_error_quickly(plane):
    async with ControllerClient(plane.url) as client:
        held = [await client.start(TASK, i) for i in range(2)]
        try:
            started = time.monotonic()
            with pytest.raises(NoCapacity, match=r"every worker of task 'cptest-std' is full \(2 of 2 slots in use"):
                await client.start(TASK, 5)
            assert time.monotonic() - started < 1.0
        finally:
            for s in held:
                await client.cancel(s.session_id)
        await eventually(lambda: _slots_free(client), 10, "the cancelled slots to be confirmed free")
        await assert_healthy(plane.url)


async def _slots_free(client: ControllerClient) -> bool:
    return all(w["current"] == 0 for w in await workers_of(client))


# -- bad input --------------------------------------------------------------------------------


async def test_malformed_json(plane):
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{plane.url}/start_sample", content=b'{"name": "cptest-std", "index": ',
                                   headers={"content-type": "application/json"})
        one_sentence(response, 400, "the request body is not valid JSON")
        response = await http.post(f"{plane.url}/interact", content=b"[1, 2]", headers={"session_id": "1"})
        one_sentence(response, 400, "must be a JSON object")
        response = await http.post(f"{plane.url}/interact", content=b"[" * 50_000, headers={"session_id": "1"})
        one_sentence(response, 400, "nested too deeply")
    await assert_healthy(plane.url)


async def test_unknown_session(plane):
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{plane.url}/interact", headers={"session_id": "12345"},
                                   json={"messages": [ping()]})
        one_sentence(response, 404, "there is no session 12345")
        response = await http.post(f"{plane.url}/interact", headers={"session_id": "abc"}, json={"messages": [ping()]})
        one_sentence(response, 400, "must be a non-negative integer")
    await assert_healthy(plane.url)


async def test_interact_on_a_finished_session(plane):
    async with ControllerClient(plane.url) as client, httpx.AsyncClient() as http:
        started = await client.start(TASK, 0)
        await client.interact(started.session_id, assistant_tool_call("finish", {"reward": 1}))
        response = await http.post(f"{plane.url}/interact", headers={"session_id": str(started.session_id)},
                                   json={"messages": [ping()]})
        one_sentence(response, 409, "has already ended: it finished with status 'completed'")
    await assert_healthy(plane.url)


async def test_two_concurrent_interacts_on_one_session(plane):
    async with ControllerClient(plane.url) as client, httpx.AsyncClient() as http:
        started = await client.start(TASK, 0)
        results = []

        async def slow():
            results.append(await client.interact(started.session_id, assistant_tool_call("wait", {"seconds": 0.5})))

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            await eventually(lambda: _busy(client, started.session_id), 10, "the first interact to be in flight")
            response = await http.post(f"{plane.url}/interact", headers={"session_id": str(started.session_id)},
                                       json={"messages": [ping()]})
            one_sentence(response, 409, "is busy with another call")
        assert results[0].messages[0]["content"] == "waited"  # the first one was not disturbed
        assert (await client.interact(started.session_id, ping(9))).messages[0]["content"] == "pong 9"
        await client.cancel(started.session_id)
    await assert_healthy(plane.url)


async def test_oversized_message(plane):
    async with ControllerClient(plane.url) as client, httpx.AsyncClient() as http:
        started = await client.start(TASK, 0)
        huge = {"role": "assistant", "content": "x" * 100_000}
        response = await http.post(f"{plane.url}/interact", headers={"session_id": str(started.session_id)},
                                   json={"messages": [huge]})
        one_sentence(response, 413, "over the limit of 65536 bytes")
        assert (await client.interact(started.session_id, ping(3))).messages[0]["content"] == "pong 3"
        await client.cancel(started.session_id)
    await assert_healthy(plane.url)


async def test_unknown_route_and_wrong_method(plane):
    async with httpx.AsyncClient() as http:
        one_sentence(await http.get(f"{plane.url}/interact"), 405, "accepts POST")
        one_sentence(await http.post(f"{plane.url}/no_such_route", json={}), 404, "there is no route")
        body = json.loads((await http.get(f"{plane.url}/get_indices")).text)
        assert "name=<task>" in body["detail"]


def test_command_line_errors_are_one_sentence(plugin_env, plane):
    def agentrl(*args):
        out = subprocess.run([sys.executable, "-m", "agentrl_core.cli.main", *args], capture_output=True, text=True,
                             env={**os.environ, **plugin_env}, timeout=60)
        assert out.returncode == 1, out.stderr
        return out.stderr.strip().splitlines()[-1]

    assert "unknown environment 'nope'" in agentrl("worker", "--env", "nope", "--controller", plane.url)
    assert "has no index set 'dev'; available: std" in agentrl("worker", "--env", "cptest", "--split", "dev",
                                                                "--controller", plane.url)
    port = plane.url.rsplit(":", 1)[1].split("/")[0]
    assert f"cannot listen on 127.0.0.1:{port}" in agentrl("controller", "--port", port)
