"""The ``sglang`` engine driver: SGLang 0.5.x servers on GPUs, spoken to by the same client.

``launch(pool, model_path, devices)`` starts ``python -m sglang.launch_server`` once per
entry of ``devices`` (a list of GPU ids per engine: ``CUDA_VISIBLE_DEVICES`` and
``--tp-size len(ids)``), waits for ``/health`` and ``/get_model_info``, and returns the URLs.
Weight updates use SGLang's own endpoints (``/pause_generation``,
``/init_weights_update_group``, ``/update_weights_from_distributed``,
``/continue_generation``), which our HF server implements identically, so the learner's
transport and :class:`~agentrl_core.rollout.engine_client.EnginePool` do not care which
driver started the engines. :meth:`SGLangDriver.init_weight_update_group` joins every
engine of a pool to the learner's group (engine ``i`` holds ranks
``rank_base + i * tp_size ...``; SGLang adds its tensor-parallel rank itself).

Command line (argument names checked against SGLang 0.5.x ``server_args`` and its
``arg_groups/fields``)::

    python -m sglang.launch_server --model-path PATH --host 127.0.0.1 --port P --tp-size N
        --weight-version 0 --served-model-name POOL-I --random-seed S --skip-server-warmup
        [--dtype D] [--mem-fraction-static F] [--context-length C] [--tool-call-parser qwen25]
        [--trust-remote-code] [extra_args...]

SGLang cannot run on CPU-only machines, so its HTTP handling is tested against a labelled
test double (``tests/core/sglang_double.py``); the GPU check script is
``benchmarks/gpu/check.py``.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Sequence
from typing import Any

from agentrl_core.config import EngineConfig
from agentrl_core.rollout.hf_driver import EngineLaunchError, ManagedProcesses, wait_healthy

log = logging.getLogger(__name__)

SGLANG_TOOL_PARSERS = {"qwen25": "qwen25", "hermes": "qwen25"}  # agentrl parser -> --tool-call-parser


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class SGLangDriver:
    """Launches and stops SGLang servers; everything else goes through the common client."""

    def __init__(self, config: EngineConfig | None = None, *, engine: EngineConfig | None = None,
                 host: str = "127.0.0.1", log_dir: str | None = None, dtype: str | None = None,
                 context_length: int | None = None, tool_call_parser: str | None = None,
                 trust_remote_code: bool = False, seed: int = 0) -> None:
        # registry.build("rollout_engine", "sglang", None, engine=config.engine): the spec has no schema
        self.config = config or engine or EngineConfig(driver="sglang")
        self.host = host
        self.dtype = dtype
        self.context_length = context_length
        self.tool_call_parser = tool_call_parser
        self.trust_remote_code = trust_remote_code
        self.seed = seed
        self.procs = ManagedProcesses(log_dir)
        self.urls: dict[str, list[str]] = {}
        self.tp_sizes: dict[str, int] = {}

    def command(self, model_path: str, port: int, tp_size: int, name: str, index: int) -> list[str]:
        opts = self.config.sglang
        cmd = [opts.python, "-m", "sglang.launch_server", "--model-path", str(model_path), "--host", self.host,
               "--port", str(port), "--tp-size", str(tp_size), "--weight-version", "0",
               "--served-model-name", name, "--random-seed", str(self.seed + index), "--skip-server-warmup"]
        if self.dtype:
            cmd += ["--dtype", self.dtype]
        if opts.mem_fraction_static is not None:
            cmd += ["--mem-fraction-static", str(opts.mem_fraction_static)]
        if self.context_length:
            cmd += ["--context-length", str(self.context_length)]
        if self.tool_call_parser:
            cmd += ["--tool-call-parser", SGLANG_TOOL_PARSERS.get(self.tool_call_parser, self.tool_call_parser)]
        if self.trust_remote_code:
            cmd += ["--trust-remote-code"]
        return cmd + list(opts.extra_args)

    def gpu_groups(self, devices: Sequence[Any]) -> list[list[int]]:
        tp = self.config.sglang.tp_size
        if not devices:
            return [list(range(i * tp, (i + 1) * tp)) for i in range(self.config.num_engines)]
        groups = []
        for entry in devices:
            if isinstance(entry, str):
                entry = [int(entry.partition(":")[2] or 0)]
            ids = [int(entry)] if isinstance(entry, int) else [int(i) for i in entry]
            if len(ids) != tp:
                raise EngineLaunchError(f"an SGLang engine with engine.sglang.tp_size={tp} needs {tp} GPUs, "
                                        f"the placement gave it {ids}")
            groups.append(ids)
        return groups

    def launch(self, pool: str, model_path: str, devices: Sequence[Any]) -> list[str]:
        started = []
        for i, gpus in enumerate(self.gpu_groups(devices)):
            name = f"{pool}-{i}"
            port = free_port(self.host)
            cmd = self.command(model_path, port, len(gpus), name, i)
            proc, log_path = self.procs.start(name, cmd, {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))})
            host = f"[{self.host}]" if ":" in self.host else self.host
            started.append((name, proc, log_path, f"http://{host}:{port}"))
        deadline = time.monotonic() + self.config.sglang.startup_timeout
        urls = []
        try:
            for name, proc, log_path, url in started:
                wait_healthy(url, deadline, lambda n=name, p=proc, lp=log_path: self.procs.check_alive(n, p, lp))
                urls.append(url)
        except BaseException:
            self.shutdown()
            raise
        self.urls[pool] = urls
        self.tp_sizes[pool] = self.config.sglang.tp_size
        log.info("pool %s: %d SGLang server(s) at %s", pool, len(urls), ", ".join(urls))
        return urls

    async def init_weight_update_group(self, pool: str, *, master_address: str, master_port: int,
                                       group_name: str = "weight_update_group", backend: str = "nccl",
                                       rank_base: int = 1, world_size: int | None = None) -> dict[str, Any]:
        """Join every engine of ``pool`` to the learner's group (run concurrently with the learner's own join)."""
        from agentrl_core.rollout.engine_client import EnginePool

        async with EnginePool(pool, self.urls[pool]) as engines:
            return await engines.init_weights_update_group(
                master_address=master_address, master_port=master_port, group_name=group_name, backend=backend,
                rank_base=rank_base, ranks_per_engine=self.tp_sizes[pool], world_size=world_size)

    def shutdown(self) -> None:
        self.procs.terminate(grace=30.0)
        self.urls.clear()

    def __enter__(self) -> SGLangDriver:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
        self.procs.cleanup()
