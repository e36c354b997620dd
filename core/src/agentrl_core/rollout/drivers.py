"""The engine-driver kit: building the configured driver, and what every driver shares.

A driver (``agentrl_rollout_engines``) starts engine processes and returns their URLs; the
built-in ``hf`` and ``sglang`` drivers and plugin drivers (``agentrl-engine-vllm``) are built
from the same parts: :class:`ManagedProcesses` (the engine processes and their logs),
:func:`engine_slots` and :func:`resolve_device_kind` (what the placement gives each engine),
:func:`wait_healthy` and :class:`EngineLaunchError`. The low-level process helpers are in
:mod:`agentrl_core.processes`, the HTTP kit for an engine front in :mod:`agentrl_core.http`.


A driver factory (``agentrl_rollout_engines``) is called as::

    factory(None, engine=config.engine, model=config.model, max_context=config.rollout.max_total_len,
            seed=config.run.seed, host=HOST, log_dir=DIR)

``model`` carries ``dtype``, ``tool_parser``, ``chat_template`` and ``trust_remote_code``;
``max_context`` bounds prompt plus completion (the agent loop never needs more); ``host`` is
the address the engines bind and are reached at (127.0.0.1 on one machine, the node's
address on a Ray cluster). A driver tells how many ranks of the learner's weight-update
group one of its engines takes with ``ranks_per_engine`` (1 unless the engine is tensor
parallel; SGLang: ``engine.sglang.tp_size``).
"""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from agentrl_core.config import Config
from agentrl_core.errors import AgentrlError
from agentrl_core.http.auth import authorization_header, env_token
from agentrl_core.processes import popen, tail
from agentrl_core.types import RolloutEngineSpec

__all__ = [
    "EngineLaunchError",
    "ManagedProcesses",
    "build_engine_driver",
    "engine_slots",
    "ranks_per_engine",
    "redact",
    "resolve_device_kind",
    "wait_healthy",
]

log = logging.getLogger(__name__)


def build_engine_driver(config: Config, *, registry: Any = None, log_dir: str | None = None,
                        host: str = "127.0.0.1") -> Any:
    """The driver named by ``engine.driver``, given the run's options."""
    if registry is None:
        from agentrl_core.registry import Registry

        registry = Registry()
    return registry.build(RolloutEngineSpec, config.engine.driver, None, engine=config.engine, model=config.model,
                          max_context=config.rollout.max_total_len, seed=config.run.seed, host=host, log_dir=log_dir)


def ranks_per_engine(driver: Any) -> int:
    """Weight-update group ranks one engine of ``driver`` takes (1 when the driver does not say)."""
    return int(getattr(driver, "ranks_per_engine", 1))


class EngineLaunchError(AgentrlError):
    """An engine process exited or did not become healthy."""


def resolve_device_kind(device: str) -> str:
    if device == "auto":
        try:
            import torch

            return "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            return "cpu"
    return "cuda" if device.startswith("cuda") else "cpu"


def engine_slots(devices: Sequence[Any], kind: str) -> list[dict[str, Any]]:
    """Normalize the per-engine device entries to ``{"device": str, "cpus"|"gpus": [int]}``."""
    slots = []
    for entry in devices:
        if isinstance(entry, str):
            if entry.startswith("cuda"):
                index = entry.partition(":")[2]
                slots.append({"device": "cuda", "gpus": [int(index or 0)]})
            else:
                slots.append({"device": "cpu", "cpus": []})
            continue
        ids = [int(entry)] if isinstance(entry, int) else [int(i) for i in entry]
        slots.append({"device": "cuda", "gpus": ids} if kind == "cuda" else {"device": "cpu", "cpus": ids})
    return slots


class ManagedProcesses:
    """Engine processes started by a driver, with their logs; shared by the hf, sglang and vllm drivers.

    Each engine runs detached (:func:`agentrl_core.processes.popen`) with its output in
    ``<log_dir>/<name>.log`` (a temporary folder when ``log_dir`` is None). ``terminate``
    signals each engine process itself, not its group: SGLang stops its tensor-parallel
    workers on its own.
    """

    def __init__(self, log_dir: str | os.PathLike | None) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="agentrl-engines-") if log_dir is None else None
        self.log_dir = Path(log_dir or self._tmp.name)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.processes: list[tuple[str, subprocess.Popen, Path]] = []

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as out:
            proc = popen(cmd, env={**os.environ, **(env or {})}, detach=True, stdout=out, stderr=subprocess.STDOUT)
        self.processes.append((name, proc, log_path))
        log.info("started engine %s (pid %d): %s", name, proc.pid, " ".join(redact(cmd)))
        return proc, log_path

    def check_alive(self, name: str, proc: subprocess.Popen, log_path: Path) -> None:
        if proc.poll() is not None:
            raise EngineLaunchError(f"engine {name} exited with code {proc.returncode} during startup; the end of "
                                    f"its log {log_path}:\n{tail(log_path)}")

    def terminate(self, grace: float = 10.0) -> None:
        for _, proc, _ in self.processes:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + grace
        for name, proc, _ in self.processes:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("engine %s did not stop within %.0f s; killing it", name, grace)
                proc.kill()
                proc.wait(5)
        self.processes.clear()

    def cleanup(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def redact(cmd: Sequence[str]) -> list[str]:
    """``cmd`` with the value of every ``--api-key``/``--token`` replaced, for logs."""
    out = list(cmd)
    for i, arg in enumerate(out[:-1]):
        if arg in ("--api-key", "--token"):
            out[i + 1] = "***"
    return out


def wait_healthy(url: str, deadline: float, alive: Any, *, token: str | None = None) -> None:
    """Poll ``url/health`` until 200; ``alive()`` raises when the process died.

    Sends ``token`` (default: the process's ``AGENTRL_TOKEN``) as a bearer token.
    """
    with httpx.Client(timeout=5.0, trust_env=False, headers=authorization_header(token or env_token())) as http:
        while True:
            alive()
            try:
                if http.get(url + "/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise EngineLaunchError(f"the engine at {url} did not become healthy in time")
            time.sleep(0.5)
