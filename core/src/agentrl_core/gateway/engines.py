"""The gateway's side of the engines: pool choice, weight-update windows, aborted turns.

Each call goes to the pool the run's sampler picks for that turn (``current``, or ``stale``
with the cross sampler; the same :class:`~agentrl_core.types.TurnContext` as the chat loop
uses), and within it to the session's sticky engine (its prefix is cached there).

A weight update pauses the engines: a running request ends with ``finish_reason: abort``,
keeping nothing usable, and new requests queue until the update is done. With
``on_weight_update: hold`` (the default) the gateway sends an aborted call again from its
start (so each reply has one policy version), up to ``max_abort_retries`` times, and the
client only sees a slower answer. With ``reject`` it answers 429 with ``Retry-After``,
which the OpenAI SDK waits out and retries by itself; calls that arrive while the trainer
has announced an update (``POST /admin/pause``) are answered 429 at once. Never a 5xx.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl_core.gateway.protocol import OpenAIError
from agentrl_core.rollout.engine_client import EngineError, EnginePool, EngineUnavailable, GenerateResult
from agentrl_core.rollout.sampler import CurrentSampler, turn_rng
from agentrl_core.types import TurnContext

log = logging.getLogger(__name__)

__all__ = ["EngineRouter", "Generated"]


class Generated:
    """A finished generation and where it came from."""

    __slots__ = ("result", "pool", "retries", "seconds")

    def __init__(self, result: GenerateResult, pool: str, retries: int, seconds: float) -> None:
        self.result = result
        self.pool = pool
        self.retries = retries
        self.seconds = seconds


class EngineRouter:
    def __init__(self, pools: Mapping[str, Sequence[str]], *, sampler: Any = None, seed: int = 0,
                 on_weight_update: str = "hold", retry_after_s: float = 2.0, max_abort_retries: int = 100,
                 request_timeout: float | None = None) -> None:
        self.sampler = sampler or CurrentSampler()
        self.seed = seed
        self.on_weight_update = on_weight_update
        self.retry_after_s = retry_after_s
        self.max_abort_retries = max_abort_retries
        self.request_timeout = request_timeout
        self.pools: dict[str, EnginePool] = {}
        self.set_pools(pools)
        self.paused = False
        self._resumed = asyncio.Event()  # the gateway serves on asyncio (uvicorn)
        self._resumed.set()
        self.global_step = 0
        self.aborted_calls = 0
        self.rejected_calls = 0

    def set_pools(self, pools: Mapping[str, Sequence[str]]) -> None:
        """Replace the engines (an engine restarted at a new URL keeps serving its pool)."""
        missing = {p.name for p in self.sampler.pools()} - set(pools)
        if missing:
            raise ValueError(f"the sampler needs engine pools {sorted(missing)}, got {sorted(pools)}")
        old = self.pools
        self.pools = {}
        for name, urls in pools.items():
            pool = old.get(name)
            if pool is not None and pool.urls == [u.rstrip("/") for u in urls]:
                self.pools[name] = pool
            else:
                self.pools[name] = EnginePool(name, list(urls), timeout=self.request_timeout)
        self._retired = [p for name, p in old.items() if self.pools.get(name) is not p]

    async def aclose(self) -> None:
        for pool in [*self.pools.values(), *getattr(self, "_retired", [])]:
            await pool.aclose()

    # -- weight-update windows (announced by the trainer) ----------------------------------

    def pause(self) -> None:
        if not self.paused:
            self.paused = True
            self._resumed.clear()

    def resume(self, global_step: int | None = None) -> None:
        if global_step is not None:
            self.global_step = int(global_step)
        self.paused = False
        self._resumed.set()

    def _reject(self) -> OpenAIError:
        self.rejected_calls += 1
        seconds = max(1, round(self.retry_after_s))
        return OpenAIError(429, f"the model's weights are being updated; retry in {seconds} s",
                           type="rate_limit_error", code="weights_updating",
                           headers=[(b"retry-after", str(seconds).encode()),
                                    (b"retry-after-ms", str(int(self.retry_after_s * 1000)).encode())])

    # -- generation ----------------------------------------------------------------------

    def choose_pool(self, *, group_id: str, sample: int, turn: int, task: str) -> str:
        context = TurnContext(group_id=group_id, sample=sample, turn=turn, task=task,
                              rng=turn_rng(self.seed, group_id, sample, turn), global_step=self.global_step)
        return self.sampler.choose(context)

    async def generate(self, key: str, input_ids: Sequence[int], params: Mapping[str, Any], *, pool_name: str,
                       wait_limit: float) -> Generated:
        """One reply from the engines; 429 or holding during weight updates, 503 when no engine answers."""
        pool = self.pools.get(pool_name)
        if pool is None:
            raise OpenAIError(500, f"the sampler chose engine pool {pool_name!r}, which does not exist",
                              type="server_error")
        start = time.monotonic()
        for retry in range(self.max_abort_retries + 1):
            if self.paused:
                if self.on_weight_update == "reject":
                    raise self._reject()
                try:
                    await asyncio.wait_for(self._resumed.wait(), wait_limit)
                except asyncio.TimeoutError:
                    log.warning("the weight update announced %.0f s ago has not ended; generating anyway",
                                wait_limit)
            try:
                result = await pool.generate(key, input_ids, params)
            except EngineUnavailable as exc:
                raise OpenAIError(503, f"no engine of pool {pool_name!r} can be reached ({exc})", type="server_error",
                                  code="engine_unavailable", headers=[(b"retry-after", b"5")]) from None
            except EngineError as exc:
                status = exc.status if exc.status in (400, 413) else 502
                raise OpenAIError(status, f"the engine failed this call: {exc}",
                                  type="invalid_request_error" if status < 500 else "server_error") from None
            if not result.aborted:
                return Generated(result, pool_name, retry, time.monotonic() - start)
            self.aborted_calls += 1
            if self.on_weight_update == "reject":
                raise self._reject()
        raise OpenAIError(429, f"this call was interrupted by {self.max_abort_retries + 1} weight updates in a row; "
                          "retry it", type="rate_limit_error", code="weights_updating",
                          headers=[(b"retry-after", str(max(1, round(self.retry_after_s))).encode())])
