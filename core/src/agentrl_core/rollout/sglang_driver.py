"""The ``sglang`` engine driver: SGLang 0.5.x servers on GPUs, spoken to by the same client.

``launch(pool, model_path, devices)`` starts ``python -m sglang.launch_server`` once per
entry of ``devices`` (a list of GPU ids per engine: ``CUDA_VISIBLE_DEVICES`` and
``--tp-size len(ids)``), waits for ``/health``, and returns the URLs. The run's options
reach the command line: ``model.dtype`` (``--dtype``), ``rollout.max_total_len`` capped at
the model's positions (``--context-length``), ``model.tool_parser``, ``model.chat_template``,
``model.trust_remote_code`` and ``run.seed``. ``SGLANG_RETURN_ORIGINAL_LOGPROB`` is pinned
off in the server's environment: with it SGLang reports log-probs before temperature
scaling, while the learner's ratio needs ``log_softmax(logits / temperature)``.
Weight updates use SGLang's own endpoints (``/pause_generation``,
``/init_weights_update_group``, ``/update_weights_from_distributed``,
``/continue_generation``), which our HF server implements identically, so the learner's
transport and :class:`~agentrl_core.rollout.engine_client.EnginePool` do not care which
driver started the engines. Each engine holds ``tp_size`` ranks of the learner's
weight-update group (``ranks_per_engine``: engine ``i`` joins at ``rank_offset = 1 + i *
tp_size``, and SGLang adds its tensor-parallel rank itself).

Command line (argument names checked against SGLang 0.5.x ``server_args`` and its
``arg_groups/fields``)::

    python -m sglang.launch_server --model-path PATH --host 127.0.0.1 --port P --tp-size N
        --weight-version 0 --served-model-name POOL-I --random-seed S --skip-server-warmup
        [--dtype D] [--mem-fraction-static F] [--context-length C] [--tool-call-parser qwen25]
        [--chat-template FILE] [--trust-remote-code] [--enable-memory-saver]
        [--enable-lora --max-lora-rank R --lora-target-modules M... --max-loras-per-batch K
         --max-loaded-loras K+1] [--api-key TOKEN] [extra_args...]

``--enable-lora`` and its sizes come with ``model.lora`` (``engine.sglang.max_loras``): the
learner then loads each synced adapter as ``policy@vN`` with ``/load_lora_adapter`` and
points the server's weight version at it (``/update_weight_version``); SGLang takes exact
adapter names only, so the client names ``policy@v<the server's version>``
(:class:`~agentrl_core.rollout.engine_client.EngineClient`).

``--enable-memory-saver`` is added when the engines share a GPU with the learner and release
their memory while it trains (``engine.release_memory``; ``/release_memory_occupation`` frees
nothing without it; SGLang then needs the ``torch-memory-saver`` package).

``--api-key`` is the run's token (``AGENTRL_TOKEN``, see :mod:`agentrl_core.http.auth`):
SGLang then answers 401 to a request without ``Authorization: Bearer TOKEN``, which every
agentrl client sends; the logged command line shows it as ``***``.

SGLang cannot run on CPU-only machines, so its HTTP handling is tested against a labelled
test double (``tests/core/sglang_double.py``); the GPU check script is
``benchmarks/gpu/check.py``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl_core.config import EngineConfig, ModelConfig
from agentrl_core.http.auth import env_token
from agentrl_core.http.ports import free_port
from agentrl_core.rollout.drivers import EngineLaunchError, ManagedProcesses, wait_healthy

log = logging.getLogger(__name__)

SGLANG_TOOL_PARSERS = {"qwen25": "qwen25", "hermes": "qwen25"}  # agentrl parser -> --tool-call-parser


class SGLangDriver:
    """Launches and stops SGLang servers; everything else goes through the common client.

    Built by :func:`agentrl_core.rollout.drivers.build_engine_driver` with the run's
    ``engine``, ``model``, ``max_context`` (``rollout.max_total_len``), ``seed``, ``host`` and
    ``log_dir``; the explicit ``dtype``/``context_length``/``tool_call_parser``/
    ``trust_remote_code``/``chat_template`` keywords override what ``model`` says.
    """

    def __init__(self, config: EngineConfig | None = None, *, engine: EngineConfig | None = None,
                 model: ModelConfig | None = None, host: str = "127.0.0.1", log_dir: str | None = None,
                 max_context: int | None = None, seed: int = 0, dtype: str | None = None,
                 context_length: int | None = None, tool_call_parser: str | None = None,
                 trust_remote_code: bool | None = None, chat_template: str | None = None) -> None:
        # registry.build(RolloutEngineSpec, "sglang", None, engine=config.engine): the spec has no schema
        self.config = config or engine or EngineConfig(driver="sglang")
        self.host = host
        self.dtype = dtype or (model.dtype if model is not None else None)
        self.context_length = context_length or max_context
        self.tool_call_parser = tool_call_parser or (model.tool_parser if model is not None else None)
        self.trust_remote_code = bool(trust_remote_code if trust_remote_code is not None
                                      else model is not None and model.trust_remote_code)
        self.chat_template = chat_template or (model.chat_template if model is not None else None)
        self.lora = model.lora if model is not None and model.lora.enabled else None
        self.seed = seed
        self.procs = ManagedProcesses(log_dir)
        self.urls: dict[str, list[str]] = {}
        # the engines share a GPU with the learner and release their memory while it trains
        # (agentrl_core.train.engine_memory): SGLang frees nothing without its memory saver
        self.release_memory = False

    @property
    def ranks_per_engine(self) -> int:
        """Weight-update group ranks one engine takes: one per tensor-parallel rank."""
        return self.config.sglang.tp_size

    def environment(self, gpus: Sequence[int]) -> dict[str, str]:
        """What the server's environment gets over this process's."""
        return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)),
                # the learner's ratio needs log_softmax(logits / temperature), SGLang's default;
                # a user's shell must not switch the server to pre-temperature log-probs
                "SGLANG_RETURN_ORIGINAL_LOGPROB": "false"}

    def command(self, model_path: str, port: int, tp_size: int, name: str, index: int) -> list[str]:
        opts = self.config.sglang
        cmd = [opts.python, "-m", "sglang.launch_server", "--model-path", str(model_path), "--host", self.host,
               "--port", str(port), "--tp-size", str(tp_size), "--weight-version", "0",
               "--served-model-name", name, "--random-seed", str(self.seed + index), "--skip-server-warmup"]
        if self.dtype:
            cmd += ["--dtype", self.dtype]
        if opts.mem_fraction_static is not None:
            cmd += ["--mem-fraction-static", str(opts.mem_fraction_static)]
        context = _capped_context(model_path, self.context_length)
        if context:
            cmd += ["--context-length", str(context)]
        if self.tool_call_parser:
            cmd += ["--tool-call-parser", SGLANG_TOOL_PARSERS.get(self.tool_call_parser, self.tool_call_parser)]
        if self.chat_template:
            cmd += ["--chat-template", self._chat_template_file()]
        if self.trust_remote_code:
            cmd += ["--trust-remote-code"]
        if self.release_memory:
            cmd += ["--enable-memory-saver"]
        if self.lora is not None:  # served adapters, loaded at run time (/load_lora_adapter, core/docs/lora.md)
            modules = list(self.lora.target_modules)
            cmd += ["--enable-lora", "--max-lora-rank", str(self.lora.rank), "--lora-target-modules",
                    *(["all"] if modules == ["all-linear"] else modules),
                    "--max-loras-per-batch", str(opts.max_loras), "--max-loaded-loras", str(opts.max_loras + 1)]
        token = env_token()
        if token is not None:  # the run's token (agentrl_core.http.auth): SGLang checks it as its API key
            cmd += ["--api-key", token]
        return cmd + list(opts.extra_args)

    def _chat_template_file(self) -> str:
        """``model.chat_template`` as SGLang takes it: a file (an inline template is written to one)."""
        template = str(self.chat_template)
        if "{%" not in template and "{{" not in template:
            return template  # a path or one of SGLang's template names
        path = self.procs.log_dir / "chat_template.jinja"
        path.write_text(template)
        return str(path)

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

    def launch(self, pool: str, model_path: str, devices: Sequence[Any], *, first_index: int = 0) -> list[str]:
        started = []
        for i, gpus in enumerate(self.gpu_groups(devices), start=first_index):
            name = f"{pool}-{i}"
            port = free_port(self.host)
            cmd = self.command(model_path, port, len(gpus), name, i)
            proc, log_path = self.procs.start(name, cmd, self.environment(gpus))
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
        log.info("pool %s: %d SGLang server(s) at %s", pool, len(urls), ", ".join(urls))
        return urls

    def shutdown(self) -> None:
        self.procs.terminate(grace=30.0)
        self.urls.clear()

    def __enter__(self) -> SGLangDriver:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
        self.procs.cleanup()


def _capped_context(model_path: str, wanted: int | None) -> int | None:
    """``wanted`` capped at the model's ``max_position_embeddings`` (SGLang refuses a longer context)."""
    if not wanted:
        return None
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return wanted  # a hub name or an unreadable directory: SGLang checks it
    longest = config.get("max_position_embeddings")
    return min(wanted, int(longest)) if isinstance(longest, int) and longest > 0 else wanted
