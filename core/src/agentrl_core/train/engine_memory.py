"""Engines that share a device with the learner give their memory back while it trains.

In a colocated placement (``train.mode: sync``, or async on one GPU: docs/architecture.md
section 6) the engines' KV cache and weights sit on the learner's GPUs. Around each learner
step :class:`EngineMemory` does, for every pool that shares a device (``engine.release_memory``):

1. ``release``: ``/pause_generation`` (``abort``, or ``retract`` where the pool's weight sync
   retracts: the same rule, :func:`~agentrl_core.rollout.engine_client.pause_mode_for`),
   then ``/release_memory_occupation {tags}``: ``kv_cache`` always, and ``weights`` when the
   pool gets new weights after this step (SGLang's released weights hold no values until a
   weight update writes them; a pool synced only every ``stale_step`` keeps its weights).
2. the learner step;
3. ``resume``: ``/resume_memory_occupation {tags}`` with the same tags. Generation stays
   paused: the weight sync that follows (pause, all buckets, continue) continues the pools
   it updates, and :meth:`EngineMemory.continue_unsynced` the others.

With ``model.lora`` (``adapters=True``) the weights are never released: the adapter sync
loads adapters and never writes the base weights (SGLang's released weights would keep no
values), and it does not pause, so every resumed pool is continued by
:meth:`EngineMemory.continue_unsynced`.

SGLang (0.5.x) requires this order: its scheduler asserts that no request runs when memory
is released, and a request that reached a released engine would touch freed memory; a
paused engine holds new requests back, so they wait instead. The request bodies are
SGLang's (``{"tags": [...]}``, answered ``null``); the hf engine serves the same routes and
the vllm front maps them to vLLM's ``/sleep`` and ``/wake_up``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl_core.rollout.engine_client import pause_mode_for

log = logging.getLogger(__name__)

__all__ = ["EngineMemory", "release_tags"]


def release_tags(pool: str, due: Sequence[str], adapters: bool = False) -> list[str]:
    """What a pool gives up during a learner step: its KV cache, and its weights when a sync refills
    them (never under ``model.lora``: an adapter sync leaves the base weights as they are)."""
    return ["kv_cache", "weights"] if pool in due and not adapters else ["kv_cache"]


class EngineMemory:
    """Release and resume the memory of the engines of ``pools`` (pool name -> ``EnginePool``)."""

    def __init__(self, pools: Mapping[str, Any], *, partial_rollouts: bool = False, adapters: bool = False) -> None:
        self.pools = dict(pools)
        self.partial_rollouts = partial_rollouts
        self.adapters = adapters  # model.lora: syncs load adapters, without pausing or writing the weights
        self.released: dict[str, list[str]] = {}
        self._modes: dict[str, str] = {}
        self._resumed: list[str] = []

    async def _mode(self, name: str) -> str:
        if name not in self._modes:
            infos = (await self.pools[name].model_info()).values() if self.partial_rollouts else []
            self._modes[name] = pause_mode_for(infos, self.partial_rollouts)
        return self._modes[name]

    async def release(self, due: Sequence[str]) -> dict[str, float]:
        """Pause every pool and release its memory; ``due``: the pools synced after the step.

        One pool after the other (each call reaches every engine of a pool at once).
        """
        start = time.monotonic()
        for name, pool in self.pools.items():
            tags = release_tags(name, due, self.adapters)
            await pool.pause_generation(await self._mode(name))
            await pool.release_memory_occupation(tags)
            self.released[name] = tags
        seconds = time.monotonic() - start
        log.info("released %s in %.2f s", ", ".join(f"{p} ({'+'.join(t)})" for p, t in self.released.items()), seconds)
        return {"time/engine_release_s": seconds}

    async def resume(self) -> dict[str, float]:
        """Take the released memory back; generation stays paused until a sync or :meth:`continue_unsynced`."""
        start = time.monotonic()
        released, self.released = self.released, {}
        for name, tags in released.items():
            await self.pools[name].resume_memory_occupation(tags)
        self._resumed = list(released)
        return {"time/engine_resume_s": time.monotonic() - start}

    async def continue_unsynced(self, synced: Sequence[str]) -> None:
        """Continue the resumed pools that no weight sync continued (every one after adapter syncs)."""
        for name in self._resumed:
            if name not in synced or self.adapters:
                await self.pools[name].continue_generation()
        self._resumed = []
