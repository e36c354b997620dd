"""The ``hf`` engine driver: launches ``agentrl engine serve`` processes for a pool.

``launch(pool, model_path, devices)`` starts one engine per entry of ``devices`` and
returns their URLs once every one answers ``/health``. An entry is what the placement gives
one engine (:mod:`agentrl_core.launch.placement`): a list of CPU cores (the engine is pinned
to them and runs that many threads) or of GPU ids (``CUDA_VISIBLE_DEVICES``; the hf engine
uses the first); an int (one core or GPU) or a device string (``"cpu"``, ``"cuda:1"``) also
work. ``devices=[]`` starts ``engine.num_engines`` unpinned engines on ``engine.device``.

Each engine binds ``host`` (127.0.0.1; the node's address when the run spans a Ray
cluster) and picks a free port itself, reporting it through a port file, so parallel
launches never race for ports. Logs go to ``<log_dir>/<pool>-<i>.log``. ``shutdown()``
terminates every process it started (SIGTERM, then SIGKILL after a grace period).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from agentrl_core.config import EngineConfig, ModelConfig
from agentrl_core.errors import AgentrlError
from agentrl_core.launch.processes import detach_and_die_with_parent

log = logging.getLogger(__name__)


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
    """Engine processes started by a driver, with their logs; shared by the hf and sglang drivers."""

    def __init__(self, log_dir: str | os.PathLike | None) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="agentrl-engines-") if log_dir is None else None
        self.log_dir = Path(log_dir or self._tmp.name)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.processes: list[tuple[str, subprocess.Popen, Path]] = []

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                    preexec_fn=detach_and_die_with_parent)
        self.processes.append((name, proc, log_path))
        log.info("started engine %s (pid %d): %s", name, proc.pid, " ".join(cmd))
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


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_healthy(url: str, deadline: float, alive: Any) -> None:
    """Poll ``url/health`` until 200; ``alive()`` raises when the process died."""
    with httpx.Client(timeout=5.0, trust_env=False) as http:
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


class HFDriver:
    """Launches and stops agentrl's own engine servers (``agentrl engine serve``).

    Built by :func:`agentrl_core.rollout.drivers.build_engine_driver` with the run's
    ``engine``, ``model`` (not used: the engine reads the checkpoint's dtype, template and
    code), ``max_context``, ``seed``, ``host`` and ``log_dir``.
    """

    ranks_per_engine = 1  # weight-update group ranks one engine takes

    def __init__(self, config: EngineConfig | None = None, *, engine: EngineConfig | None = None,
                 model: ModelConfig | None = None, python: str = sys.executable, startup_timeout: float = 300.0,
                 max_context: int | None = None, log_dir: str | None = None, extra_args: Sequence[str] = (),
                 seed: int = 0, host: str = "127.0.0.1") -> None:
        # registry.build(RolloutEngineSpec, "hf", None, engine=config.engine): the spec has no schema
        self.config = config or engine or EngineConfig()
        self.python = python
        self.startup_timeout = startup_timeout
        self.max_context = max_context
        self.extra_args = list(extra_args)
        self.seed = seed
        self.host = host
        self.procs = ManagedProcesses(log_dir)
        self.urls: dict[str, list[str]] = {}

    def command(self, model_path: str, slot: dict[str, Any], port_file: Path, name: str,
                index: int = 0) -> tuple[list[str], dict]:
        hf = self.config.hf
        cmd = [self.python, "-m", "agentrl_core.cli.main", "engine", "serve", "--model", str(model_path),
               "--host", self.host, "--port", "0", "--port-file", str(port_file),
               "--max-running-requests", str(hf.max_running_requests), "--dtype", hf.dtype,
               "--served-model-name", name, "--seed", str(self.seed + index)]
        env: dict[str, str] = {}
        if slot["device"] == "cuda":
            if slot["gpus"]:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, slot["gpus"]))
            cmd += ["--device", "cuda"]
        else:
            cmd += ["--device", "cpu"]
            if slot["cpus"]:
                cmd += ["--cpus", ",".join(map(str, slot["cpus"]))]
            if hf.threads:
                cmd += ["--threads", str(hf.threads)]
        if self.max_context:
            cmd += ["--max-context", str(self.max_context)]
        return cmd + self.extra_args, env

    def launch(self, pool: str, model_path: str, devices: Sequence[Any]) -> list[str]:
        kind = resolve_device_kind(self.config.device)
        slots = engine_slots(devices, kind) or [
            {"device": kind, "cpus": [], "gpus": []} for _ in range(self.config.num_engines)]
        started = []
        for i, slot in enumerate(slots):
            name = f"{pool}-{i}"
            port_file = self.procs.log_dir / f"{name}.port.json"
            port_file.unlink(missing_ok=True)
            cmd, env = self.command(model_path, slot, port_file, name, i)
            proc, log_path = self.procs.start(name, cmd, env)
            started.append((name, proc, log_path, port_file))
        deadline = time.monotonic() + self.startup_timeout
        urls = []
        try:
            for name, proc, log_path, port_file in started:
                def alive(name=name, proc=proc, log_path=log_path):
                    self.procs.check_alive(name, proc, log_path)

                while not port_file.exists():
                    alive()
                    if time.monotonic() > deadline:
                        raise EngineLaunchError(f"engine {name} did not start listening within "
                                                f"{self.startup_timeout:.0f} s; see {log_path}")
                    time.sleep(0.2)
                url = json.loads(port_file.read_text())["url"]
                wait_healthy(url, deadline, alive)
                urls.append(url)
        except BaseException:
            self.shutdown()
            raise
        self.urls[pool] = urls
        log.info("pool %s: %d hf engine(s) at %s", pool, len(urls), ", ".join(urls))
        return urls

    def shutdown(self) -> None:
        self.procs.terminate()
        self.urls.clear()

    def __enter__(self) -> HFDriver:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
        self.procs.cleanup()
