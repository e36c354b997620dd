"""Building and running a gateway: from a config, in a thread (tests, benchmarks), as a process.

* :func:`build_gateway`: a :class:`~agentrl_core.gateway.server.GatewayServer` from a run
  config and the engine pools' URLs: the run's tokenizer (``model.path``, ``model.chat_template``),
  the chat template, tool parser and reasoning parser plugins the ``gateway`` section names,
  and the run's sampler;
* :class:`BackgroundGateway`: serve one from a thread with its own event loop;
* :func:`serve_main`: ``agentrl gateway`` (prints ``listening on URL`` once it listens, so
  :class:`~agentrl_core.processes.ServiceProcess` can start it);
* :class:`GatewayProcess`: ``agentrl train`` starts the gateway as a child process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl_core.gateway.server import GatewayServer
from agentrl_core.rollout.engine_client import LORA_SERVED_NAME

log = logging.getLogger(__name__)

__all__ = ["build_gateway", "BackgroundGateway", "GatewayProcess", "serve_main"]


def build_gateway(config: Any, pools: Mapping[str, Sequence[str]], *, registry: Any = None,
                  tokenizer: Any = None, token: str | None = None) -> GatewayServer:
    from agentrl_core.registry import Registry
    from agentrl_core.rollout.tokenizer import load_tokenizer
    from agentrl_core.types import ChatTemplateSpec, ReasoningParserSpec, SamplerSpec, ToolParserSpec

    registry = registry or Registry()
    tokenizer = tokenizer or load_tokenizer(config.model.path, config.model)
    g = config.gateway
    sampler = registry.build(SamplerSpec, config.sampler.name, config.sampler.options.get(config.sampler.name))
    return GatewayServer(
        tokenizer=tokenizer, pools=pools, config=g, rollout=config.rollout, model_path=config.model.path,
        chat_template=registry.build(ChatTemplateSpec, g.chat_template, None, tokenizer=tokenizer),
        tool_parser=registry.build(ToolParserSpec, g.tool_parser or config.model.tool_parser),
        reasoning_parser=registry.build(ReasoningParserSpec, g.reasoning_parser) if g.reasoning_parser else None,
        sampler=sampler, seed=config.run.seed, request_timeout=config.engine.request_timeout, token=token,
        lora=LORA_SERVED_NAME if config.model.lora.enabled else None,
    )


class BackgroundGateway:
    """Serve a :class:`GatewayServer` from a thread with its own event loop; ``url`` once listening."""

    def __init__(self, server: GatewayServer, host: str = "127.0.0.1", port: int = 0) -> None:
        self.server = server
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, args=(host, port), name="gateway-http", daemon=True)

    def start(self, timeout: float = 60.0) -> BackgroundGateway:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the gateway did not start listening within {timeout} s")
        if self._error is not None:
            raise RuntimeError(f"the gateway failed to start: {self._error}") from self._error
        return self

    def _main(self, host: str, port: int) -> None:
        async def run() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def listening(url: str) -> None:
                self.url = url
                self._ready.set()

            await self.server.serve(host, port, stop=self._stop, on_listening=listening)

        try:
            asyncio.run(run())
        except BaseException as exc:
            self._error = exc
            log.exception("background gateway failed")
        finally:
            self._ready.set()

    def stop(self, timeout: float = 30.0) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)

    def __enter__(self) -> BackgroundGateway:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def parse_pools(engines: Sequence[str], pool_args: Sequence[str]) -> dict[str, list[str]]:
    """``--engine URL`` (pool ``current``) and ``--pool NAME=URL[,URL]`` into ``{name: [url]}``."""
    from agentrl_core.errors import ConfigError

    pools: dict[str, list[str]] = {}
    if engines:
        pools["current"] = [u.rstrip("/") for u in engines]
    for arg in pool_args:
        name, eq, urls = arg.partition("=")
        if not eq or not name.strip() or not urls.strip():
            raise ConfigError(f"--pool {arg!r}: write NAME=URL[,URL...], e.g. --pool stale=http://127.0.0.1:30001")
        pools.setdefault(name.strip(), []).extend(u.strip().rstrip("/") for u in urls.split(",") if u.strip())
    if not pools:
        raise ConfigError("no engines: give --engine URL (an `agentrl engine serve` or SGLang server), or "
                          "--pool NAME=URL for each pool the sampler uses")
    return pools


def serve_main(config: Any, pools: Mapping[str, Sequence[str]], *, port_file: str | None = None,
               token: str | None = None) -> int:
    from agentrl_core.http.server import raise_fd_limit, run_event_loop, tune_gc

    gateway = build_gateway(config, pools, token=token)
    raise_fd_limit()

    async def main() -> None:
        def listening(url: str) -> None:
            print(f"agentrl gateway for {gateway.served_model_name} listening on {url} "
                  f"(pools: {json.dumps({n: list(u) for n, u in pools.items()})})", flush=True)
            if port_file:
                Path(port_file).write_text(json.dumps({"url": url}))
            tune_gc()

        await gateway.serve(config.gateway.host, config.gateway.port, on_listening=listening)

    run_event_loop(main)
    return 0


class GatewayProcess:
    """The gateway as a child process of ``agentrl train`` (``agentrl gateway --config ... --pool ...``)."""

    def __init__(self, config_path: str | Path, pools: Mapping[str, Sequence[str]], *, log_path: str | Path,
                 overrides: Sequence[str] = ()) -> None:
        from agentrl_core.processes import ServiceProcess, agentrl_command

        argv = agentrl_command("gateway", str(config_path))
        for name, urls in pools.items():
            argv += ["--pool", f"{name}={','.join(urls)}"]
        for assignment in overrides:
            argv += ["--set", assignment]
        self.process = ServiceProcess("gateway", argv, log_path=log_path)
        self.url: str | None = None

    def start(self, timeout: float = 120.0) -> str:
        self.url = self.process.start(timeout=timeout)
        return self.url

    def stop(self) -> None:
        self.process.stop()
