"""Adapter-only weight sync (``model.lora``): the engines serve versioned adapters, the base stays.

With LoRA the learner never changes the base weights, so a sync need not move them: rank 0
writes the adapter alone as a PEFT folder, ``<root>/<name>@v<N>`` (a few percent of the
model's bytes; every sync reports ``bytes_fraction``), and every engine of the pool loads it
with SGLang's ``/load_lora_adapter {lora_name, lora_path}`` under the new name ``<name>@vN``.
Nothing pauses: requests already running keep the adapter version they were admitted with
(their tokens keep its version), and requests that name the bare ``<name>`` get the newest
version loaded at their admission (core/docs/lora.md).

The pool keeps ``keep`` versions loaded (``rollout.staleness_bound + 1``, at least
:data:`MIN_KEEP`): after a load, the oldest beyond ``keep`` are unloaded. An engine that
refuses an unload because a request still runs with that version (409) keeps it, and the
next sync tries again; so a running request never loses its adapter. SGLang's unload waits
for those requests instead: the sync does not wait for its answer (a request held by a paused
pool would wait for the sync in turn), and the folder goes once SGLang answered. A request that names an adapter its
engine does not hold fails loudly (400), never silently on the base model.

A new transport (the learner restarted, or a pool reconnected after an engine restart) takes
over the ``<name>@vN`` versions the engines list, and a version an engine already holds is
not loaded again (the same step's adapter). Engines that take exact names only (SGLang: its
``/get_model_info`` lists no ``lora_adapters``) also get ``/update_weight_version N`` after a
load: their clients name ``<name>@v<the server's version>``.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from agentrl_core.rollout.engine_client import LORA_SERVED_NAME
from agentrl_core.train.weight_sync import NamedTensors, WeightSyncError, _Deadline, _Engines, release

log = logging.getLogger(__name__)

__all__ = ["MIN_KEEP", "SERVED_NAME", "AdapterTransport", "adapter_versions_kept"]

SERVED_NAME = LORA_SERVED_NAME  # the engines serve the trained adapter as policy@v<N>
MIN_KEEP = 2  # versions loaded at least: the newest, and the one requests still running started on


def adapter_versions_kept(staleness_bound: int | None) -> int:
    """Versions an engine keeps loaded: ``staleness_bound + 1`` (a trajectory may start on a version
    that old and still be trained), at least :data:`MIN_KEEP`; :data:`MIN_KEEP` + 2 without a bound
    (older versions stay loaded as long as a request runs with them, bound or not)."""
    if staleness_bound is None:
        return MIN_KEEP + 2
    return max(staleness_bound + 1, MIN_KEEP)


class AdapterTransport:
    """Sync the LoRA adapter alone to one pool (``send`` on learner rank 0).

    Keywords: ``root`` (a folder every engine can read), ``lora`` (``model.lora``),
    ``model_dir`` (the base model, named in ``adapter_config.json``), ``keep`` (versions
    loaded), ``full_bytes`` (the bytes a full-weight sync would send, for ``bytes_fraction``),
    ``dtype`` (the adapter's dtype on the way; None: as trained), ``timeout_s``,
    ``name`` (the served name, :data:`SERVED_NAME`).
    """

    name = "adapter"

    def __init__(self, *, root: str | Path, lora: Any, model_dir: str | Path, keep: int = MIN_KEEP,
                 full_bytes: int = 0, dtype: torch.dtype | None = None, timeout_s: float = 600.0,
                 name: str = SERVED_NAME) -> None:
        if keep < 1:
            raise ValueError(f"an adapter transport keeps at least one version loaded, not {keep}")
        self.root = Path(root)
        self.lora = lora
        self.model_dir = model_dir
        self.keep = keep
        self.full_bytes = int(full_bytes)
        self.dtype = dtype
        self.timeout_s = float(timeout_s)
        self.served = name
        self.engines: _Engines | None = None
        self.exact: list[str] = []  # engines that take exact adapter names only (set by connect)
        self.loaded: list[str] = []  # names loaded by this transport, oldest first
        self.retiring: list[str] = []  # beyond keep, still in use on some engine: unloaded at a later sync
        self._waiting: list[tuple[str, Any]] = []  # unloads not answered yet (SGLang's wait for their requests)

    def connect(self, learner_rank0: str | None, engines: Sequence[str]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.engines = _Engines(engines, self.timeout_s)
        infos = self.engines.call("model_info", _Deadline(self.timeout_s, "asking the engines about adapters",
                                                          "no sync ran"))
        # engines that take exact adapter names only (SGLang) learn the newest one from their weight version
        self.exact = [url for url, info in zip(self.engines.urls, infos, strict=True)
                      if not (isinstance(info, dict) and "lora_adapters" in info)]
        # versions the engines already serve (from before a restart of the learner or of this transport):
        # unloaded in turn like the ones this transport loads
        held = {n for info in infos if isinstance(info, dict) for n in info.get("lora_adapters") or []
                if n.startswith(f"{self.served}@v") and n.rpartition("@v")[2].isdigit()}
        self.loaded = sorted(held | set(self.loaded), key=lambda n: int(n.rpartition("@v")[2]))

    def send(self, named_tensors: NamedTensors, version: int) -> dict[str, float]:
        from agentrl_core.train.lora import write_adapter

        if self.engines is None:
            raise WeightSyncError("connect() the adapter transport before send()")
        start = time.perf_counter()
        name = f"{self.served}@v{version}"
        deadline = _Deadline(self.timeout_s, f"the adapter sync of {name} to {len(self.engines.urls)} engines",
                             "the engines keep serving the adapters they hold")
        tensors = iter(named_tensors)
        counted: dict[str, int] = {"bytes": 0, "tensors": 0}

        def cast() -> NamedTensors:
            for key, tensor in tensors:
                tensor = tensor.to(self.dtype) if self.dtype is not None else tensor
                counted["bytes"] += tensor.numel() * tensor.element_size()
                counted["tensors"] += 1
                yield key, tensor

        try:
            path = write_adapter(cast(), self.root / name, self.lora, self.model_dir)
        except BaseException:
            release(tensors)
            raise
        written = time.perf_counter()
        self._load(name, path, deadline)
        if self.exact:
            self._each(self.exact, "update_weight_version", deadline, version)
        if name not in self.loaded:
            self.loaded.append(name)
        self.retiring += self.loaded[: -self.keep]
        self.loaded = self.loaded[-self.keep:]
        leaving, self.retiring = self.retiring, []
        self.retiring = self._unload(leaving, deadline)
        stats = {"bytes": counted["bytes"], "tensors": counted["tensors"], "write_seconds": written - start,
                 "adapters_loaded": len(self.loaded) + len(self.retiring), "seconds": time.perf_counter() - start}
        if self.full_bytes:
            stats["full_bytes"] = self.full_bytes
            stats["bytes_fraction"] = counted["bytes"] / self.full_bytes
        log.info("adapter %s synced to %d engines: %.2f MiB (%.2f %% of the full weights) in %.2f s",
                 name, len(self.engines.urls), counted["bytes"] / 2**20, 100 * stats.get("bytes_fraction", 0.0),
                 stats["seconds"])
        return stats

    def _load(self, name: str, path: Path, deadline: _Deadline) -> None:
        """Load ``name`` on every engine. An engine that holds it already (the same version synced
        again: to a restarted engine's pool, or after a resume, both at the step the adapter was
        saved at) keeps its copy; it answers 409 (hf, vllm) or 400 "already exists" (SGLang)."""
        from agentrl_core.rollout.engine_client import EngineError

        assert self.engines is not None
        clients = self.engines.clients

        async def load_all() -> list[str]:
            import anyio

            errors: list[str] = []

            async def one(client: Any) -> None:
                try:
                    with anyio.fail_after(deadline.left()):
                        await client.load_lora_adapter(name, str(path))
                except EngineError as exc:
                    if exc.status != 409 and "already exists" not in str(exc):
                        errors.append(str(exc))
                except TimeoutError:
                    errors.append(f"{client.url}: loading {name} did not finish in time")

            async with anyio.create_task_group() as tg:
                for client in clients:
                    tg.start_soon(one, client)
            return errors

        errors = self.engines.portal.call(load_all)
        if errors:
            raise WeightSyncError(f"loading adapter {name} failed on {len(errors)} of {len(clients)} engines: "
                                  f"{'; '.join(errors[:6])}")

    def _unload(self, names: list[str], deadline: _Deadline) -> list[str]:
        """Unload ``names`` from every engine; returns those some engine still uses (409).

        An engine that does not hold a name (400: restarted, or unloaded before) is fine. An
        engine that takes exact names (SGLang) answers an unload only once the requests running
        with the adapter finished; it is not waited for (a request held by a paused pool would
        wait for this very sync), and the adapter's folder goes once it answered.
        """
        from agentrl_core.rollout.engine_client import EngineError

        assert self.engines is not None
        engines = self.engines
        self._sweep()

        async def unload_all() -> list[str]:
            import anyio

            busy: set[str] = set()
            errors: list[str] = []

            async def one(client: Any, name: str) -> None:
                try:
                    with anyio.fail_after(deadline.left()):
                        await client.unload_lora_adapter(name)
                except EngineError as exc:
                    if exc.status == 409:
                        busy.add(name)
                    elif exc.status != 400:
                        errors.append(str(exc))
                except TimeoutError:
                    errors.append(f"{client.url}: unloading {name} did not finish in time")

            async with anyio.create_task_group() as tg:
                for client in engines.clients:
                    if client.url not in self.exact:
                        for name in names:
                            tg.start_soon(one, client, name)
            if errors:
                raise WeightSyncError(f"unloading old adapters failed: {'; '.join(errors[:6])}")
            return [n for n in names if n in busy]

        busy = engines.portal.call(unload_all) if names else []
        for client in engines.clients:
            if client.url in self.exact:
                for name in names:
                    self._waiting.append((name, engines.portal.start_task_soon(client.unload_lora_adapter, name)))
        for name in names:
            if name not in busy:
                self._forget(name)
        if busy:
            log.info("adapters %s are still in use; unloaded at a later sync", busy)
        return busy

    def _sweep(self) -> None:
        """Unloads answered since the last sync (SGLang's): log failures, delete what is free."""
        done = [(n, f) for n, f in self._waiting if f.done()]
        self._waiting = [(n, f) for n, f in self._waiting if not f.done()]
        for name, future in done:
            error = future.exception()
            if error is not None and getattr(error, "status", None) != 400:
                log.warning("unloading adapter %s failed: %s", name, error)
            self._forget(name)

    def _forget(self, name: str) -> None:
        """Delete the folder of ``name`` once no engine can need it any more."""
        if name not in self.loaded and name not in self.retiring and all(n != name for n, _ in self._waiting):
            shutil.rmtree(self.root / name, ignore_errors=True)

    def _each(self, urls: list[str], method: str, deadline: _Deadline, *args: Any) -> None:
        assert self.engines is not None
        engines = self.engines
        clients = [c for c in engines.clients if c.url in urls]

        async def run() -> None:
            import anyio

            with anyio.fail_after(deadline.left()):
                async with anyio.create_task_group() as tg:
                    for client in clients:
                        tg.start_soon(getattr(client, method), *args)

        try:
            engines.portal.call(run)
        except Exception as exc:
            raise WeightSyncError(f"{method} failed on the engines {urls}: {exc}") from None

    def close(self) -> None:
        for _, future in self._waiting:  # SGLang's unloads still waiting for their requests: not waited for
            future.cancel()
        self._waiting = []
        if self.engines is not None:
            self.engines.close()
            self.engines = None
