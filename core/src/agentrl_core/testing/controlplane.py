"""Run a control plane on this machine, for tests: in this event loop, or as child processes.

In-process::

    async with local_control_plane(ControllerConfig(idle_session_timeout=60)) as plane:
        await plane.add_worker(env, "std", concurrency=8)   # registered when this returns
        async with ControllerClient(plane.url) as client:
            ...

As processes, exactly as a user starts them (``agentrl controller`` / ``agentrl worker``)::

    controller = spawn("controller", "--port", "0")
    worker = spawn("worker", "--env", "db", "--controller", controller.url)
    ...
    worker.stop(); controller.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from agentrl_core.config import ControllerConfig
from agentrl_core.controlplane.controller import Controller
from agentrl_core.controlplane.worker import TaskWorker
from agentrl_core.errors import EnvError
from agentrl_core.http.server import bind_socket
from agentrl_core.processes import ChildProcess, agentrl_command, popen
from agentrl_core.protocols import Environment


class LocalControlPlane:
    def __init__(self, controller: Controller, url: str, stop: asyncio.Event) -> None:
        self.controller = controller
        self.token = controller.token
        self.url = url
        self.workers: list[TaskWorker] = []
        self._stop = stop
        self._tasks: list[asyncio.Task] = []

    async def add_worker(self, env: Environment, split: str, *, heartbeat_interval: float = 8.0,
                         **options: Any) -> TaskWorker:
        """Serve ``env``'s ``split`` in this loop; returns once the controller registered it."""
        options.setdefault("token", self.token)
        worker = TaskWorker(env, split, controller_url=self.url, heartbeat_interval=heartbeat_interval, **options)
        ready = asyncio.Event()
        self._tasks.append(asyncio.ensure_future(worker.serve(stop=self._stop, on_ready=lambda _: ready.set())))
        await ready.wait()
        if not await worker.send_heartbeat():
            raise EnvError(f"worker {worker.task_name} could not register with the controller at {self.url}")
        entry = self.controller.state.find_worker(worker.task_name, worker.address or "")
        for _ in range(2000):  # its first reconciliation (one get_sessions) makes it dispatchable
            if entry is not None and entry.ready:
                break
            await asyncio.sleep(0.005)
        else:
            raise EnvError(f"worker {worker.task_name} registered but the controller could not reconcile it")
        self.workers.append(worker)
        return worker

    async def aclose(self) -> None:
        self._stop.set()
        results = await asyncio.gather(*self._tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                raise result


@contextlib.asynccontextmanager
async def local_control_plane(config: ControllerConfig | None = None, *,
                              token: str | None = None) -> AsyncIterator[LocalControlPlane]:
    """A controller serving on a free local port in the running event loop (requiring ``token`` if given)."""
    config = config or ControllerConfig()
    controller = Controller(config, token=token)
    sock = bind_socket(config.host, config.port)
    host, port = sock.getsockname()[:2]
    stop = asyncio.Event()
    plane = LocalControlPlane(controller, f"http://{host}:{port}/api", stop)
    plane._tasks.append(asyncio.ensure_future(controller.serve(sock=sock, stop=stop)))
    try:
        yield plane
    finally:
        await plane.aclose()


class Spawned(ChildProcess):
    """A child ``agentrl`` process and the URL it printed when it started listening.

    It shares the test's process group (Ctrl-C reaches it), and ``stop``/``kill`` signal
    it alone.
    """

    def __init__(self, proc: subprocess.Popen, url: str, first_line: str, name: str = "agentrl") -> None:
        super().__init__(name, proc, group=False)
        self.url = url
        self.first_line = first_line
        # Keep reading stdout so the child never blocks on a full pipe.
        threading.Thread(target=_drain, args=(proc,), daemon=True).start()

    def stop(self, timeout: float = 20.0) -> int:  # type: ignore[override]
        """SIGTERM and wait (SIGKILL after ``timeout``); returns the exit code."""
        return super().stop(timeout)  # type: ignore[return-value]


def spawn(command: str, *args: str, env: Mapping[str, str] | None = None, python: str | None = None,
          timeout: float = 60.0, extra_args: Sequence[str] = ()) -> Spawned:
    """Start ``agentrl <command> ...`` and wait until it prints its listening URL."""
    cmd = agentrl_command(*extra_args, command, *args, python=python)
    proc = popen(cmd, env={**os.environ, **(env or {})}, detach=False, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = _readline(proc, timeout)
    if "listening on" not in line:
        proc.kill()
        proc.wait()
        raise EnvError(f"agentrl {command} did not start (exit code {proc.returncode}): {line.strip() or 'no output'}")
    url = next(word for word in line.split() if word.startswith("http://"))
    return Spawned(proc, url, line, name=f"agentrl {command}")


def _drain(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ValueError, OSError):
        for _ in proc.stdout:  # type: ignore[union-attr]
            pass


def _readline(proc: subprocess.Popen, timeout: float) -> str:
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    return lines[0] if lines else ""
