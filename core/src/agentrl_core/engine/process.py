"""Running an HF engine: the ``agentrl engine serve`` process, or a thread (tests, benchmarks)."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from agentrl_core.engine.server import EngineServer

log = logging.getLogger(__name__)


class BackgroundEngine:
    """Serve an :class:`EngineServer` from a thread with its own event loop; ``url`` once listening."""

    def __init__(self, server: EngineServer, host: str = "127.0.0.1", port: int = 0) -> None:
        self.server = server
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.url = ""
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, args=(host, port), name="engine-http", daemon=True)

    def start(self, timeout: float = 60.0) -> BackgroundEngine:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the engine did not start listening within {timeout} s")
        if self._error is not None:
            raise RuntimeError(f"the engine failed to start: {self._error}") from self._error
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
            log.exception("background engine failed")
        finally:
            self._ready.set()

    def stop(self, timeout: float = 30.0) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)

    def __enter__(self) -> BackgroundEngine:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve_main(args: Any) -> int:
    """Entry of ``agentrl engine serve`` (arguments parsed by ``agentrl_core.cli.engine``)."""
    import torch

    from agentrl_core.http.server import run_event_loop

    if args.cpus:
        cores = sorted({int(c) for c in str(args.cpus).split(",") if c.strip()})
        os.sched_setaffinity(0, cores)
        from agentrl_core.cpu_threads import set_torch_threads

        set_torch_threads(cores, threads=args.threads)
    elif args.threads:
        torch.set_num_threads(args.threads)
    version: Any = args.weight_version
    if isinstance(version, str) and version.lstrip("-").isdigit():
        version = int(version)
    server = EngineServer(
        args.model, device=args.device, dtype=args.dtype, max_running_requests=args.max_running_requests,
        max_context=args.max_context, max_prefill_tokens=args.max_prefill_tokens, tool_parser=args.tool_call_parser,
        weight_version=version, seed=args.seed, served_model_name=args.served_model_name,
        prefix_cache=not args.no_prefix_cache, token=args.token,
    )

    # the start-up objects (transformers, the model) live as long as the process: keep them out of
    # every collection, including the one at exit (seconds on a busy machine, past a driver's grace)
    gc.freeze()

    def listening(url: str) -> None:
        print(f"agentrl engine listening on {url}", flush=True)
        if args.port_file:
            tmp = Path(f"{args.port_file}.tmp")
            tmp.write_text(json.dumps({"url": url, "pid": os.getpid()}))
            tmp.replace(args.port_file)

    run_event_loop(lambda: server.serve(args.host, args.port, on_listening=listening))
    return 0
