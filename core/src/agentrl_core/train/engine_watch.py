"""Engine health during training: find engines that stopped answering and have them restarted.

:class:`EngineWatchdog` asks every engine's ``/health`` every ``engine.health_check_interval``
seconds; one that fails ``engine.unhealthy_checks`` times in a row is handed to ``restart``
(the trainer relaunches it in its bundle, swaps it into its pool and gives it the weights).

SGLang's ``/health`` generates a token, so it waits while generation is paused and answers
503 after 20 s: a weight sync pauses every engine of a pool on purpose. The watchdog
therefore does not probe while a sync holds :meth:`suspended`, and after a failed sync (the
pool is left paused) :meth:`check` asks ``alive`` (``/get_model_info``, no generation)
instead. A probe waits ``engine.health_timeout`` seconds (30, past SGLang's own 20).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import anyio

from agentrl_core.errors import AgentrlError

log = logging.getLogger(__name__)

__all__ = ["EngineWatchdog"]


class EngineWatchdog:
    def __init__(self, pools: Mapping[str, Any], *, restart: Callable[[str, str], Awaitable[str]],
                 interval: float, unhealthy_checks: int, max_restarts: int) -> None:
        self.pools = pools
        self.restart = restart
        self.interval = interval
        self.unhealthy_checks = unhealthy_checks
        self.max_restarts = max_restarts
        self.failures: dict[str, int] = {}
        self.restarts = 0
        self.skipped = 0  # rounds not probed because a sync was running
        self._suspended = 0
        self._lock = anyio.Lock()  # the loop and a failed sync must not restart one engine twice

    @contextlib.asynccontextmanager
    async def suspended(self) -> AsyncIterator[None]:
        """No health probes while inside (a weight sync pauses the engines on purpose)."""
        self._suspended += 1
        try:
            yield
        finally:
            self._suspended -= 1

    async def run(self) -> None:
        """Probe every ``interval`` seconds until cancelled."""
        while True:
            await anyio.sleep(self.interval)
            if self._suspended:
                self.skipped += 1
                continue  # a probe now would wait on a paused engine and call it dead
            await self.check(checks_needed=self.unhealthy_checks)

    async def check(self, *, checks_needed: int, probe: str = "health") -> bool:
        """Probe every engine once (``health``, or ``alive`` for paused pools); restart those that
        failed ``checks_needed`` times in a row. True if one was restarted."""
        async with self._lock:
            restarted = False
            for name, pool in self.pools.items():
                status = await getattr(pool, probe)()
                if self._suspended and probe == "health":
                    return restarted  # a sync began meanwhile: these answers say nothing
                for url, ok in list(status.items()):
                    self.failures[url] = 0 if ok else self.failures.get(url, 0) + 1
                    if self.failures[url] < checks_needed:
                        continue
                    if self.restarts >= self.max_restarts:
                        raise AgentrlError(f"engine {url} of pool {name!r} is down and engine.max_restarts "
                                           f"({self.max_restarts}) restarts were already used")
                    self.restarts += 1
                    self.failures.pop(url, None)
                    log.warning("engine %s of pool %s is not answering; restarting it", url, name)
                    await self.restart(name, url)
                    restarted = True
            return restarted
