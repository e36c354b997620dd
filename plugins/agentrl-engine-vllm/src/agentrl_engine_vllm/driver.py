"""The ``vllm`` engine driver: one vLLM server per engine, each behind agentrl's engine protocol.

``launch(pool, model_path, devices)`` starts ``python -m agentrl_engine_vllm.serve`` once
per entry of ``devices`` (the same entries as the hf driver: a list of CPU cores, pinned,
or of GPU ids, ``CUDA_VISIBLE_DEVICES``; ``[]`` starts ``engine.num_engines`` unpinned
engines). Each front starts its vLLM server, waits for it, and announces its own URL in a
port file; the URLs it returns are the fronts', so :class:`~agentrl_core.rollout.engine_client.EnginePool`,
the agent loop and the learner's ``disk`` transport talk to vLLM exactly as to the hf engine.
``shutdown()`` stops the fronts, and each front stops its vLLM process group.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from agentrl_core.config import EngineConfig
from agentrl_core.rollout.drivers import (
    EngineLaunchError,
    ManagedProcesses,
    engine_slots,
    resolve_device_kind,
    wait_healthy,
)
from agentrl_engine_vllm.front import NO_CPU_SLEEP
from agentrl_engine_vllm.options import VLLMOptions, options_from
from agentrl_engine_vllm.serve import MISSING_VLLM

log = logging.getLogger(__name__)


def require_vllm(python: str) -> None:
    """A clear error now, instead of a dead engine later, when this interpreter lacks vLLM."""
    if python == sys.executable and importlib.util.find_spec("vllm") is None:
        raise EngineLaunchError(MISSING_VLLM.format(python=python))


# vLLM's --max-lora-rank takes one of these (vllm/config/lora.py, MaxLoRARanks)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_rank(rank: int) -> int:
    """The smallest rank vLLM accepts that holds an adapter of ``rank``."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise EngineLaunchError(f"model.lora.rank {rank} is above vLLM's largest LoRA rank ({VLLM_LORA_RANKS[-1]})")


class VLLMDriver:
    """Launches and stops vLLM engines; everything else goes through the common client."""

    ranks_per_engine = 1  # of the learner's weight-update group (core/src/agentrl_core/rollout/drivers.py)

    def __init__(self, config: VLLMOptions | None = None, *, engine: EngineConfig | None = None,
                 model: Any = None, max_context: int | None = None, seed: int = 0, host: str = "127.0.0.1",
                 log_dir: str | None = None, weight_version: int = 0) -> None:
        # built by agentrl_core.rollout.drivers.build_engine_driver: the positional config is the
        # schema's defaults; engine.vllm (engine.options["vllm"]) is the user's
        self.engine = engine or EngineConfig(driver="vllm")
        self.options = options_from(self.engine, config)
        self.model = model
        self.max_context = max_context
        self.seed = seed
        self.host = host
        self.python = self.options.python or sys.executable
        self.weight_version = weight_version
        self.procs = ManagedProcesses(log_dir)
        self.urls: dict[str, list[str]] = {}
        # set by the engine host when the pool shares the learner's GPU (engine.release_memory): the
        # engines start with vLLM's sleep mode, which /release_memory_occupation uses
        self.release_memory = False

    def engine_options(self, device: str, index: int) -> dict[str, Any]:
        """engine.vllm with the run's values filled in where it leaves them open."""
        options = attrs.asdict(self.options)
        if options["dtype"] == "auto":  # CPU: float32, as the learner computes there; GPU: model.dtype
            options["dtype"] = getattr(self.model, "dtype", "auto") if device == "cuda" else "float32"
        if options["max_model_len"] is None and self.max_context:
            options["max_model_len"] = int(self.max_context)
        options["seed"] = self.options.seed + self.seed + index
        if getattr(self.model, "trust_remote_code", False):
            options["extra_args"] = ["--trust-remote-code", *options["extra_args"]]
        if self.release_memory:
            options["extra_args"] = ["--enable-sleep-mode", *options["extra_args"]]
        lora = getattr(self.model, "lora", None)
        if lora is not None and lora.enabled:  # served adapters: serve.py turns on vLLM's LoRA
            options["lora"] = {"max_loras": self.options.max_loras, "max_lora_rank": vllm_lora_rank(lora.rank)}
        return options

    def command(self, model_path: str, slot: dict[str, Any], port_file: Path, name: str,
                index: int = 0) -> tuple[list[str], dict]:
        options = self.engine_options(slot["device"], index)
        cmd = [self.python, "-m", "agentrl_engine_vllm.serve", "--model", str(model_path), "--host", self.host,
               "--port", "0", "--port-file", str(port_file), "--served-model-name", name,
               "--device", slot["device"], "--weight-version", str(self.weight_version),
               "--python", self.python, "--options", json.dumps(options)]
        env: dict[str, str] = {}
        if slot["device"] == "cuda":
            if slot["gpus"]:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, slot["gpus"]))
        elif slot["cpus"]:
            cmd += ["--cpus", ",".join(map(str, slot["cpus"]))]
        return cmd, env

    def launch(self, pool: str, model_path: str, devices: Sequence[Any], *, first_index: int = 0) -> list[str]:
        kind = resolve_device_kind(self.engine.device)
        slots = engine_slots(devices, kind) or [
            {"device": kind, "cpus": [], "gpus": []} for _ in range(self.engine.num_engines)]
        if self.release_memory and any(slot["device"] != "cuda" for slot in slots):
            raise EngineLaunchError(NO_CPU_SLEEP)
        require_vllm(self.python)
        for slot in slots:
            if slot["device"] == "cuda" and len(slot["gpus"]) > 1:
                raise EngineLaunchError(f"the vllm driver runs one GPU per engine (tensor parallel size 1); the "
                                        f"placement gave an engine {slot['gpus']}")
        started = []
        for i, slot in enumerate(slots, start=first_index):
            name = f"{pool}-{i}"
            port_file = self.procs.log_dir / f"{name}.port.json"
            port_file.unlink(missing_ok=True)
            cmd, env = self.command(model_path, slot, port_file, name, i)
            proc, log_path = self.procs.start(name, cmd, env)
            started.append((name, proc, log_path, port_file))
        deadline = time.monotonic() + self.options.startup_timeout
        urls = []
        try:
            for name, proc, log_path, port_file in started:
                def alive(name=name, proc=proc, log_path=log_path):
                    self.procs.check_alive(name, proc, log_path)

                while not port_file.exists():
                    alive()
                    if time.monotonic() > deadline:
                        raise EngineLaunchError(f"vllm engine {name} did not start within "
                                                f"{self.options.startup_timeout:.0f} s; see {log_path}")
                    time.sleep(0.5)  # polling the child's port file, with a deadline
                url = json.loads(port_file.read_text())["url"]
                wait_healthy(url, deadline, alive)
                urls.append(url)
        except BaseException:
            self.shutdown()
            raise
        self.urls[pool] = urls
        log.info("pool %s: %d vllm engine(s) at %s", pool, len(urls), ", ".join(urls))
        return urls

    def shutdown(self) -> None:
        self.procs.terminate(grace=30.0)
        self.urls.clear()

    def __enter__(self) -> VLLMDriver:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
        self.procs.cleanup()
