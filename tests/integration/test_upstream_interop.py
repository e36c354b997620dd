"""Wire compatibility with the real upstream packages from PyPI (docs/architecture.md section 4).

* the upstream task worker (agentrl-worker 0.4.0) registers with our controller and serves
  sessions unchanged, with the controller requiring the run's token of everyone else
  (``--unauthenticated-workers``: the upstream worker cannot send it);
* the upstream evaluation client (agentrl-eval 0.1.2) plays episodes through our controller;
* our worker registers with, and serves, a controller that follows the documented upstream
  behaviour (a test double in ``upstream/reference_controller.py``: the Go controller is
  not on PyPI).

The upstream packages live in their own virtual environment (they own the ``agentrl``
namespace and pin pydantic, grpcio, ...), created on first use under
``~/.cache/agentrl`` or at ``$AGENTRL_UPSTREAM_VENV``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agentrl_core.controlplane.client import ControllerClient, NoCapacity
from agentrl_core.env import Status, assistant_tool_call
from agentrl_core.testing.controlplane import Spawned, spawn

pytestmark = [pytest.mark.upstream, pytest.mark.processes, pytest.mark.anyio]

HELPERS = Path(__file__).resolve().parent / "upstream"
UPSTREAM = ["agentrl-worker==0.4.0", "agentrl-eval==0.1.2"]
CHECK = ("from importlib.metadata import version; "
         "assert version('agentrl-worker') == '0.4.0' and version('agentrl-eval') == '0.1.2'; "
         "import agentrl.worker.task_worker, agentrl.eval.session.workflow")


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="session")
def upstream_python() -> str:
    """The python of a virtual environment with the upstream packages (created if needed)."""
    default = Path.home() / ".cache" / "agentrl" / "upstream-worker-0.4.0-eval-0.1.2"
    root = Path(os.environ.get("AGENTRL_UPSTREAM_VENV", default))
    python = root / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", CHECK], capture_output=True).returncode == 0:
        return str(python)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(root)], check=True, capture_output=True)
    out = subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *UPSTREAM],
                         capture_output=True, text=True, timeout=1200)
    if out.returncode != 0 or subprocess.run([python, "-c", CHECK], capture_output=True).returncode != 0:
        pytest.fail(f"could not install {' and '.join(UPSTREAM)} from PyPI into {root}; point AGENTRL_UPSTREAM_VENV "
                    f"at a virtual environment that has them. pip said: {out.stderr[-1500:]}")
    return str(python)


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> dict[str, str]:
    """PYTHONPATH for our processes: the ``interop`` environment as an installed plugin."""
    root = tmp_path_factory.mktemp("interop_plugin")
    info = root / "agentrl_interop_env-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: agentrl-interop-env\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[agentrl]\ninterop = interop_env\n")
    return {"PYTHONPATH": os.pathsep.join([str(root), str(HELPERS)])}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(probe, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = probe()
        except httpx.HTTPError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


TOKEN = "interop-run-token"


def alive_workers(url: str, task: str) -> list[dict]:
    headers = {"Authorization": f"Bearer {TOKEN}"}  # ignored by a controller without a token
    workers = httpx.get(f"{url}/list_workers", timeout=5, headers=headers).json().get(task, {}).get("workers", {}).values()
    return [w for w in workers if w["state"] == "alive"]


def start_upstream_worker(python: str, controller_url: str, log: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    args = [python, "-m", "agentrl.worker", "echo-upstream", "--config", str(HELPERS / "echo_task.yaml"),
            "--controller", controller_url, "--self", f"http://127.0.0.1:{port}/api", "--host", "127.0.0.1",
            "--port", str(port), "--log-level", "WARNING"]
    env = {**os.environ, "PYTHONPATH": str(HELPERS)}
    env.pop("AGENTRL_TOKEN", None)  # an upstream worker knows nothing of the token
    return subprocess.Popen(args, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=HELPERS), port


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def call(messages_or_name, **arguments):
    return assistant_tool_call(messages_or_name, arguments, call_id=f"call_{messages_or_name}")


async def test_upstream_worker_registers_with_our_controller_and_serves_sessions(upstream_python, tmp_path):
    controller = spawn("controller", "--port", "0", "--cancel-timeout", "10", "--unauthenticated-workers",
                       env={"AGENTRL_TOKEN": TOKEN})
    worker, _ = start_upstream_worker(upstream_python, controller.url, tmp_path / "upstream-worker.log")
    try:
        wait_for(lambda: alive_workers(controller.url, "echo-upstream"), 90,
                 f"the upstream worker to register (log: {tmp_path / 'upstream-worker.log'})")
        assert httpx.get(f"{controller.url}/list_workers").status_code == 401  # the clients' routes still need it
        async with ControllerClient(controller.url, token=TOKEN) as client:
            assert await client.get_indices("echo-upstream") == [0, 1, 2, 3, 4]
            started = await client.start("echo-upstream", 3)
            assert started.messages == [{"role": "user", "content": "upstream task 3"}]
            assert [t["function"]["name"] for t in started.tools] == ["ping", "finish"]
            assert started.status is Status.RUNNING and not started.finish
            pong = await client.interact(started.session_id, call("ping", n=5))
            assert pong.messages == [{"role": "tool", "tool_call_id": "call_ping", "content": "pong 5"}]
            done = await client.interact(started.session_id, call("finish"))
            assert done.status is Status.COMPLETED and done.finish and done.reward == 1.0
            assert done.metrics == {"turns": 2}  # the worker's "metric", renamed for the client

            first, second = await client.start("echo-upstream", 0), await client.start("echo-upstream", 1)
            with pytest.raises(NoCapacity, match="full"):  # the upstream task's concurrency is 2
                await client.start("echo-upstream", 2)
            assert await client.cancel(first.session_id) is True  # cancel_with_notice, then its cancel notice
            wait_for(lambda: alive_workers(controller.url, "echo-upstream")[0]["current"] == 1, 30,
                     "the upstream worker's cancel notice to free the slot")
            again = await client.start("echo-upstream", 2)
            assert again.status is Status.RUNNING
            assert set(await client.list_sessions()) == {str(second.session_id), str(again.session_id)}
            assert (await client.cancel_all("echo-upstream"))["cancelled"] == 2
    finally:
        stop(worker)
        controller.stop()


async def test_upstream_eval_client_plays_through_our_controller(upstream_python, plugin_env):
    controller = spawn("controller", "--port", "0")
    worker = spawn("worker", "--env", "interop", "--controller", controller.url, "--heartbeat-interval", "0.2",
                   env=plugin_env)
    try:
        wait_for(lambda: alive_workers(controller.url, "interop-std"), 30, "our worker to register")
        out = subprocess.run([upstream_python, str(HELPERS / "eval_episode.py"), controller.url, "interop-std", "0", "3"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        report = json.loads(out.stdout.strip().splitlines()[-1])
        assert report["indices"] == [0, 1, 2, 3, 4]
        for index, result in zip([0, 3], report["results"], strict=True):
            assert result["status"] == "completed" and result["reward"] == 1.0, result
            assert result["index"] == index and isinstance(result["session_id"], int)
            assert result["metrics"] == {"rounds": 3, "invalid_turns": 0, "index": index}
            contents = [m.get("content") for m in result["raw_trace"] if m.get("role") == "tool"]
            assert contents == ["pong 1", "pong 2", "bye"], result["raw_trace"]
        assert httpx.get(f"{controller.url}/list_sessions").json() == {}
    finally:
        worker.stop()
        controller.stop()


def test_our_worker_serves_a_controller_with_upstream_behaviour(upstream_python, plugin_env, tmp_path):
    port = free_port()
    log = tmp_path / "reference-controller.log"
    reference = subprocess.Popen([upstream_python, str(HELPERS / "reference_controller.py"), str(port)],
                                 stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/api"
    workers: list[Spawned] = []
    try:
        wait_for(lambda: httpx.get(f"{url}/heartbeats").status_code == 200, 60, f"the reference controller ({log})")
        workers.append(spawn("worker", "--env", "interop", "--controller", url, "--heartbeat-interval", "0.2",
                             env=plugin_env))
        workers.append(spawn("worker", "--env", "interop", "--split", "named", "--task-name", "dbbench-named",
                             "--controller", url, "--heartbeat-interval", "0.2", env=plugin_env))
        beats = wait_for(lambda: {b["name"]: b for b in httpx.get(f"{url}/heartbeats").json()}.keys() >= {
            "interop-std", "dbbench-named"} and {b["name"]: b for b in httpx.get(f"{url}/heartbeats").json()}, 30,
            "both workers' heartbeats")
        assert beats["interop-std"] == {"name": "interop-std", "address": workers[0].url, "concurrency": 2,
                                        "indices": [0, 1, 2, 3, 4]}
        assert beats["dbbench-named"]["indices"] == ["alpha", "beta"]

        with httpx.Client(base_url=url + "/", timeout=30) as http:
            assert http.get("get_indices", params={"name": "interop-std"}).json() == [0, 1, 2, 3, 4]
            response = http.post("start_sample", json={"name": "interop-std", "index": 2})
            assert response.status_code == 200 and response.headers["session_id"] == "0"
            body = response.json()
            assert body["status"] == "running" and body["finish"] is False and body["metric"] == {
                "rounds": 0, "invalid_turns": 0}
            assert [m["role"] for m in body["messages"]] == ["system", "user"] and len(body["tools"]) == 2
            out = http.post("interact", headers={"session_id": "0"}, json={"messages": [call("ping", n=4)]}).json()
            assert out["messages"][0]["content"] == "pong 4" and out["status"] == "running"
            out = http.post("interact", headers={"session_id": "0"}, json={"messages": [call("finish")]}).json()
            assert out["status"] == "completed" and out["finish"] and out["reward"] == 1.0
            assert out["metric"] == {"rounds": 2, "invalid_turns": 0, "index": 2}

            named = http.post("start_sample", json={"name": "dbbench-named", "index": 1})  # int onto string indices
            assert named.json()["messages"][1]["content"] == "task beta"
            for index in (0, 1):
                assert http.post("start_sample", json={"name": "interop-std", "index": index}).status_code == 200
            full = http.post("start_sample", json={"name": "interop-std", "index": 4})
            assert full.status_code == 406
            assert http.post("cancel", headers={"session_id": "2"}).json() == {"session_id": 2}
            assert http.get("worker_sessions", params={"address": workers[0].url}).json() == {"3": 1}
    finally:
        for worker in workers:
            worker.stop()
        stop(reference)
