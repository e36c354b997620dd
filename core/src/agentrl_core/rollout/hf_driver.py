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
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl_core.config import EngineConfig, ModelConfig
from agentrl_core.processes import agentrl_command
from agentrl_core.rollout.drivers import (
    EngineLaunchError,
    ManagedProcesses,
    engine_slots,
    resolve_device_kind,
    wait_healthy,
)

log = logging.getLogger(__name__)


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
        cmd = agentrl_command("engine", "serve", "--model", str(model_path), "--host", self.host, "--port", "0",
                              "--port-file", str(port_file), "--max-running-requests", str(hf.max_running_requests),
                              "--dtype", hf.dtype, "--served-model-name", name, "--seed", str(self.seed + index),
                              python=self.python)
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

    def launch(self, pool: str, model_path: str, devices: Sequence[Any], *, first_index: int = 0) -> list[str]:
        kind = resolve_device_kind(self.config.device)
        slots = engine_slots(devices, kind) or [
            {"device": kind, "cpus": [], "gpus": []} for _ in range(self.config.num_engines)]
        started = []
        for i, slot in enumerate(slots, start=first_index):
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
