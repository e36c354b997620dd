"""Start the environment control plane locally: one controller and a task worker per task.

``agentrl train`` and ``agentrl eval`` use this when ``controller.url`` is not set
("embedded" mode). In production, run ``agentrl controller`` and ``agentrl worker``
yourself (on other machines) and set ``controller.url``.

The processes inherit this process's ``AGENTRL_TOKEN`` (``agentrl train`` and ``agentrl
eval`` set one per run), so the controller and the workers require it and send it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from agentrl_core.config import ControllerConfig, TaskConfig
from agentrl_core.http.auth import authorization_header, env_token
from agentrl_core.processes import ServiceError, ServiceProcess, agentrl_command

log = logging.getLogger(__name__)

_TIMEOUT_FIELDS = (
    "unresponsive_after", "remove_after", "idle_session_timeout", "request_timeout", "start_timeout",
    "cancel_timeout", "connect_timeout", "reconcile_interval", "cancel_notice_timeout",
)


class EmbeddedControlPlane:
    """A controller plus one worker per distinct task, as child processes."""

    def __init__(
        self,
        tasks: Sequence[TaskConfig],
        controller: ControllerConfig,
        *,
        run_dir: str | Path,
        config_path: str | Path | None = None,
        worker_concurrency: int | None = None,
    ) -> None:
        self.controller_config = controller
        self.run_dir = Path(run_dir)
        self.config_path = config_path
        self.worker_concurrency = worker_concurrency
        seen: dict[str, TaskConfig] = {}
        for task in tasks:
            seen.setdefault(task.task_name, task)
        self.tasks = list(seen.values())
        self.controller: ServiceProcess | None = None
        self.workers: dict[str, list[ServiceProcess]] = {}
        self.url: str | None = None

    def __enter__(self) -> EmbeddedControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 300.0) -> str:
        c = self.controller_config
        argv = agentrl_command("controller", "--host", c.host, "--port", str(c.port))
        for name in _TIMEOUT_FIELDS:
            argv += [f"--{name.replace('_', '-')}", str(getattr(c, name))]
        if c.unauthenticated_workers:
            argv.append("--unauthenticated-workers")
        self.controller = ServiceProcess("controller", argv, log_path=self.run_dir / "logs" / "controller.log")
        try:
            self.url = self.controller.start()
            for task in self.tasks:
                for i in range(c.workers_per_env):
                    self.start_worker(task, i)
            self.wait_registered(timeout)
        except BaseException:
            self.stop()
            raise
        return self.url

    def start_worker(self, task: TaskConfig, number: int = 0) -> ServiceProcess:
        assert self.url is not None
        argv = agentrl_command(
            "worker", "--env", task.env, "--split", task.split, "--controller", self.url,
            "--task-name", task.task_name, "--heartbeat-interval", str(self.controller_config.heartbeat_interval),
        )
        if self.config_path is not None:
            argv += ["--config", str(self.config_path)]
        if self.worker_concurrency is not None:
            argv += ["--concurrency", str(self.worker_concurrency)]
        worker = ServiceProcess(
            f"worker {task.task_name}#{number}", argv,
            log_path=self.run_dir / "logs" / f"worker-{task.task_name}-{number}.log",
        )
        worker.start(timeout=600.0)  # environments may build indices or images on first start
        self.workers.setdefault(task.task_name, []).append(worker)
        return worker

    def wait_registered(self, timeout: float) -> None:
        """Wait until every task has as many live workers as were started."""
        assert self.url is not None
        deadline = time.monotonic() + timeout
        wanted = {name: len(ws) for name, ws in self.workers.items()}
        while True:
            try:
                response = httpx.get(f"{self.url}/list_workers", timeout=5.0,
                                     headers=authorization_header(env_token()))
                response.raise_for_status()
                registered = _count_workers(response.json())
            except httpx.HTTPError as exc:
                registered, last_error = {}, exc
            else:
                last_error = None
            if all(registered.get(name, 0) >= n for name, n in wanted.items()):
                return
            if time.monotonic() > deadline:
                missing = {n: w for n, w in wanted.items() if registered.get(n, 0) < w}
                raise ServiceError(
                    f"workers did not register with the controller within {timeout:.0f} s: {missing}"
                    + (f" (last error: {last_error})" if last_error else "")
                )
            for workers in self.workers.values():
                for w in workers:
                    if not w.alive():
                        raise ServiceError(f"{w.name} exited; see {w.log_path}:\n{w.tail()}")
            time.sleep(0.2)

    def stop(self) -> None:
        for workers in self.workers.values():
            for w in workers:
                w.stop()
        if self.controller is not None:
            self.controller.stop()


def _count_workers(payload: object) -> dict[str, int]:
    """Alive workers per task from ``GET /api/list_workers`` ({task: {"workers": {id: info}}})."""
    counts: dict[str, int] = {}
    if isinstance(payload, dict):
        for task, entry in payload.items():
            workers = entry.get("workers", {}) if isinstance(entry, dict) else {}
            counts[task] = sum(1 for w in workers.values() if isinstance(w, dict) and w.get("state") == "alive")
    return counts
