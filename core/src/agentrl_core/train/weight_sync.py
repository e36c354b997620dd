"""Getting the learner's weights into the rollout engines (docs/architecture.md sections 5 and 6).

Two transports, both speaking the engine HTTP protocol of ``core/docs/engine.md`` (the
SGLang native API subset), so they work with our HF engines and with SGLang servers:

* :class:`CollectiveTransport` (``collective``): the learner's rank 0 and every engine of a
  pool form one ``torch.distributed`` group (``/init_weights_update_group``, learner rank 0,
  engines ``rank_offset`` 1..N). A sync is ``/pause_generation {mode}``, then for
  every bucket ``/update_weights_from_distributed {names, dtypes, shapes, ...}`` on all
  engines *while* rank 0 broadcasts the bucket's tensors in order, then
  ``/continue_generation``. The backend is a parameter: gloo on CPU, NCCL on GPU; the same
  code path runs under gloo here.
* :class:`DiskTransport` (``disk``): rank 0 writes a Hugging Face model directory
  (safetensors) to a shared path, atomically; then the pool is paused, every engine loads it
  with ``/update_weights_from_disk {model_path, weight_version}``, and generation continues
  (unpaused, SGLang would first wait for every running request to finish).

The pause mode is chosen once per pool at ``connect``
(:func:`~agentrl_core.rollout.engine_client.pause_mode_for`): ``retract`` when the transport
was built with ``partial_rollouts=True`` (``rollout.partial_rollouts``) and every engine of
the pool offers it (in-flight requests keep their tokens and continue under the new
weights), else ``abort``.

Tensors travel in ``weight_sync.dtype`` (:func:`transfer_dtype`: ``auto`` is the model's
compute dtype, ``model.dtype``, on GPU and float32 on CPU). Every ``connect`` and ``send``
has one deadline for the whole operation (``weight_sync.timeout_s``); past it the transport
raises :class:`WeightSyncError` instead of waiting on.

The engines of a pool see all new tensors or none: our engine refuses to continue after a
partial update, so a failed sync leaves the pool paused on a clear error (retry the sync).
:func:`iter_buckets` never skips the tensor that crosses a bucket boundary (the upstream
sender did) and gives a tensor larger than a bucket a bucket of its own.

Every learner rank takes part in gathering the full tensors (FSDP shards them), so every
rank iterates the same ``named_tensors``; only rank 0 sends. :func:`push_weights` does
that for the pools due at a step (:func:`pools_due`: every pool at start and on resume,
then each pool every ``sync_every`` steps).
"""

from __future__ import annotations

import concurrent.futures
import gc
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from agentrl_core.errors import AgentrlError
from agentrl_core.http.ports import free_port
from agentrl_core.types import PoolSpec

log = logging.getLogger(__name__)

__all__ = [
    "WeightSyncError",
    "CollectiveTransport",
    "DiskTransport",
    "iter_buckets",
    "pools_due",
    "push_weights",
    "drain",
    "release",
    "Lockstep",
    "SyncStopped",
    "write_hf_checkpoint",
    "transfer_dtype",
    "choose_backend",
]

NamedTensors = Iterable[tuple[str, torch.Tensor]]


class WeightSyncError(AgentrlError):
    """A weight sync failed; the engines of that pool stay paused until a sync succeeds."""


# ---------------------------------------------------------------------------------------
# Helpers the pipeline calls


def iter_buckets(named_tensors: NamedTensors, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group tensors in order into buckets of at most ``bucket_bytes`` (bigger ones alone)."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket size must be >= 1 byte, got {bucket_bytes}")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))  # the tensor that crossed the boundary opens the next bucket
        size += nbytes
    if bucket:
        yield bucket


def pools_due(pools: Sequence[PoolSpec], step: int, *, initial: bool = False) -> list[PoolSpec]:
    """Pools to sync after learner step ``step``: all when ``initial`` (start, resume), else
    those with ``step % sync_every == 0`` (the current pool every step, the stale pool every
    ``stale_step``)."""
    return [p for p in pools if initial or step % p.sync_every == 0]


def drain(named_tensors: NamedTensors) -> None:
    """Iterate without sending: what ranks other than 0 do during a sync."""
    for _ in named_tensors:
        pass


def release(named_tensors: NamedTensors) -> None:
    """After a failed send: stop every rank at once when the tensors are a :class:`Lockstep`
    stream, else drain them (the other ranks gather the same tensors and need a partner)."""
    if isinstance(named_tensors, Lockstep):
        named_tensors.settle(failed=True)
    else:
        drain(named_tensors)


class SyncStopped(WeightSyncError):
    """Another learner rank stopped the sync (its own error says why)."""


class Lockstep:
    """The full tensors of one pool's sync on one learner rank, in step with the other ranks.

    Before each tensor (each gather: FSDP's ``full_tensor`` is a collective) every rank adds
    a flag to an all-reduce (max) over the learner's process group: 0 goes on, 1 stops. A
    rank whose part failed calls :meth:`settle` with ``failed=True``: mid-stream it raises
    the flag at the next agreement, and every rank stops there (the others raise
    :class:`SyncStopped`); after the last tensor, one more agreement carries the outcome.
    So every rank leaves a failed sync after the same collective, and the next sync starts
    with the same call on all of them (before, rank 0 left while the others went on gathering
    for the next pool without a partner until the group timed out).

    Every rank must call :meth:`settle` once per stream, failed or not (:func:`push_weights`
    does).
    """

    def __init__(self, named_tensors: NamedTensors, group: Any = None, what: str = "the weight sync") -> None:
        import torch.distributed as dist

        self._it = iter(named_tensors)
        self._group = group
        self._what = what
        device = torch.device("cpu")
        if dist.get_backend(group) == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        self._flag = torch.zeros(1, dtype=torch.int32, device=device)
        self.state = "open"  # then "done" (every tensor), "stopped" (a rank raised the flag), "broken", "settled"
        self.agreements = 0

    def __iter__(self) -> Lockstep:
        return self

    def _agree(self, stop: bool) -> bool:
        """True when some rank asked to stop."""
        import torch.distributed as dist

        self._flag.fill_(int(stop))
        dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self._group)
        self.agreements += 1
        return bool(self._flag.item())

    def __next__(self) -> tuple[str, torch.Tensor]:
        if self.state != "open":
            raise StopIteration
        if self._agree(False):
            self.state = "stopped"
            raise SyncStopped(f"{self._what} was stopped by another learner rank (that rank's error says why)")
        try:
            return next(self._it)
        except StopIteration:
            self.state = "done"
            raise
        except BaseException:
            self.state = "broken"  # the gather itself failed: the group cannot be trusted with one more collective
            raise

    def settle(self, failed: bool) -> None:
        """This rank is done with the stream; raises :class:`SyncStopped` if another rank failed."""
        if self.state == "open" and not failed:  # a transport that did not read to the end
            try:
                drain(self)
            except SyncStopped:
                self.state = "settled"
                raise
        state, self.state = self.state, "settled"
        if state == "open":  # failed mid-stream: the others stop at their next agreement
            self._agree(True)
            return
        if state != "done":  # stopped: every rank saw the flag at the same agreement; broken; settled
            return
        if self._agree(failed) and not failed:
            raise SyncStopped(f"{self._what} failed on another learner rank (that rank's error says why)")


def push_weights(
    named_tensors: Callable[[], NamedTensors],
    transports: Mapping[str, Any],
    pools: Sequence[PoolSpec | str],
    version: int,
    *,
    rank: int = 0,
    group: Any = None,
) -> dict[str, float]:
    """Sync ``pools`` one after the other; call on every learner rank.

    ``named_tensors`` makes a fresh iterator of full tensors (e.g.
    ``learner.named_full_tensors``); ``transports`` maps pool names to connected
    transports (used on rank 0 only). Returns ``weight_sync/<pool>/seconds`` etc.

    With ``torch.distributed`` initialized and more than one rank in ``group`` (default: the
    learner's default group), the ranks gather in :class:`Lockstep`: when the sync of a pool
    fails, every rank raises (rank 0 its transport's error, the others :class:`SyncStopped`)
    after the same collective and the pools after it are not synced, so a retry starts clean.
    """
    import torch.distributed as dist

    lockstep = dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1
    metrics: dict[str, float] = {}
    for pool in pools:
        name = pool.name if isinstance(pool, PoolSpec) else pool
        start = time.perf_counter()
        tensors: Any = iter(named_tensors())
        if lockstep:
            tensors = Lockstep(tensors, group, f"the weight sync of version {version} to pool {name!r}")
        failed = True
        try:
            if rank == 0:
                stats = transports[name].send(tensors, version)
                metrics.update({f"weight_sync/{name}/{k}": float(v) for k, v in stats.items()})
            else:
                drain(tensors)
            failed = False
        finally:
            if lockstep:
                tensors.settle(failed)
        metrics[f"weight_sync/{name}/seconds"] = time.perf_counter() - start
    return metrics


def _settings(config: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Merge a WeightSyncConfig (positional or ``weight_sync=``) with explicit overrides."""
    section = kwargs.pop("weight_sync", None) or config
    out = {}
    if section is not None:
        keys = ("backend", "bucket_mb", "disk_path", "timeout_s", "dtype")
        out = {k: getattr(section, k) for k in keys if hasattr(section, k)}
    out.update({k: v for k, v in kwargs.items() if v is not None})
    return out


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def transfer_dtype(setting: str | torch.dtype | None, *, model_dtype: str = "bfloat16",
                   device_kind: str = "cuda") -> torch.dtype | None:
    """The dtype weights travel in: ``auto`` is ``model_dtype`` on GPU (what the engines compute
    in; fp32 master weights would double the bytes) and the learner's float32 on CPU (CPU
    learners and engines compute in fp32, a cast would only lose precision). ``None``: as they are."""
    if setting is None or isinstance(setting, torch.dtype):
        return setting
    if setting == "auto":
        return _DTYPES[model_dtype] if device_kind == "cuda" else torch.float32
    if setting not in _DTYPES:
        raise WeightSyncError(f"weight_sync.dtype {setting!r} is not one of auto, {', '.join(_DTYPES)}")
    return _DTYPES[setting]


def choose_backend(setting: str, *, cuda: bool, shared_device: bool, pool: str = "the pool") -> tuple[str, str]:
    """The collective backend for one pool, and why (the log and the docs say it).

    ``auto`` picks NCCL only when it can work: on GPU, with no engine of the pool on learner
    rank 0's GPU (NCCL refuses two ranks of one group on one device; colocated placements,
    ``train.mode: sync`` or async on one GPU, put them there). Otherwise gloo, which moves
    the tensors through host memory and works on a shared device. An explicit ``nccl`` on a
    shared device cannot work and is refused.
    """
    if setting not in ("auto", "gloo", "nccl"):
        raise WeightSyncError(f"weight_sync.backend {setting!r} is not one of auto, gloo, nccl")
    if setting == "nccl" and shared_device:
        raise WeightSyncError(f"weight_sync.backend nccl cannot work for {pool}: an engine shares learner rank 0's "
                              "GPU and NCCL refuses two ranks of one group on one device; set weight_sync.backend "
                              "to auto (gloo there) or gloo")
    if setting != "auto":
        return setting, "set by weight_sync.backend"
    if not cuda:
        return "gloo", "no CUDA on learner rank 0"
    if shared_device:
        return "gloo", "an engine shares learner rank 0's GPU, where NCCL refuses a second rank"
    return "nccl", "the engines are on GPUs of their own"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class _Deadline:
    """One deadline for a whole operation; ``left()`` raises WeightSyncError once it passed."""

    def __init__(self, seconds: float, what: str, consequence: str = "the engines stay paused until a sync "
                 "succeeds") -> None:
        self.seconds = seconds
        self.what = what
        self.consequence = consequence
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        remaining = self.end - time.monotonic()
        if remaining <= 0:
            raise WeightSyncError(f"{self.what} did not finish within {self.seconds:g} s (weight_sync.timeout_s); "
                                  f"{self.consequence}. Raise the timeout for a large model, or look for a stuck "
                                  "engine in the run's logs/.")
        return remaining


class _Engines:
    """The engines of one pool, called concurrently from synchronous code.

    The async :class:`~agentrl_core.rollout.engine_client.EngineClient` runs in a private
    event-loop thread (an anyio blocking portal), so HTTP requests stay in flight while the
    calling thread broadcasts tensors.
    """

    def __init__(self, urls: Sequence[str], timeout_s: float) -> None:
        import anyio.from_thread

        from agentrl_core.rollout.engine_client import EngineClient, make_http_client

        if not urls:
            raise ValueError("a weight-sync transport needs at least one engine URL")
        self.urls = list(urls)
        self._stack = ExitStack()
        self.portal = self._stack.enter_context(anyio.from_thread.start_blocking_portal())

        async def make() -> list[Any]:
            self._http = make_http_client(timeout=timeout_s)
            return [EngineClient(u, http=self._http) for u in self.urls]

        self.clients = self.portal.call(make)

    async def _all(self, method: str, kwargs_per_engine: Sequence[dict[str, Any]], seconds: float,
                   errors: list[str] | None = None, failed: threading.Event | None = None,
                   gone_ok: bool = False, deadline: _Deadline | None = None) -> list[Any]:
        import anyio

        from agentrl_core.rollout.engine_client import EngineUnavailable

        results: list[Any] = [None] * len(self.clients)
        errors = [] if errors is None else errors

        def error(message: str) -> None:
            errors.append(message)
            if failed is not None:
                failed.set()

        async def one(i: int) -> None:
            try:
                with anyio.fail_after(seconds):
                    results[i] = await getattr(self.clients[i], method)(**kwargs_per_engine[i])
            except TimeoutError:
                if deadline is not None and deadline.end - time.monotonic() < 0.05:
                    # the call's time was what the whole operation had left: say it is the deadline
                    error(f"{self.urls[i]}: {deadline.what} did not finish within {deadline.seconds:g} s "
                          "(weight_sync.timeout_s)")
                else:
                    error(f"{self.urls[i]}: no answer within {seconds:.3g} s")
            except EngineUnavailable as exc:
                if not gone_ok:
                    error(f"{self.urls[i]}: {exc}")
                else:  # a process that is gone took its side of whatever was asked of it along
                    log.info("%s on %s: the engine is gone (%s)", method, self.urls[i], exc)
            except Exception as exc:
                error(f"{self.urls[i]}: {exc}")

        async with anyio.create_task_group() as tg:
            for i in range(len(self.clients)):
                tg.start_soon(one, i)
        if errors:
            raise WeightSyncError(f"{method} failed on {len(errors)} of {len(self.clients)} engines: {'; '.join(errors)}")
        return results

    def start(self, method: str, deadline: _Deadline, per_engine: Sequence[dict[str, Any]] | None = None,
              errors: list[str] | None = None, failed: threading.Event | None = None,
              gone_ok: bool = False, **kwargs: Any) -> concurrent.futures.Future:
        """Call ``method`` on every engine concurrently within ``deadline``; a future of the answers.

        The future completes once every engine answered; ``failed`` is set (and ``errors``
        grows) as soon as one engine fails, while others may still be waiting.

        ``gone_ok``: an engine no connection can be made to is skipped (answer ``None``), not an error.
        """
        per_engine = per_engine or [kwargs] * len(self.clients)
        return self.portal.start_task_soon(self._all, method, per_engine, deadline.left(), errors, failed, gone_ok,
                                           deadline)

    def call(self, method: str, deadline: _Deadline, gone_ok: bool = False, **kwargs: Any) -> list[Any]:
        return wait(self.start(method, deadline, gone_ok=gone_ok, **kwargs), deadline)

    def choose_pause_mode(self, partial_rollouts: bool, deadline: _Deadline) -> str:
        """``retract`` or ``abort`` for this pool (see the module docstring)."""
        from agentrl_core.rollout.engine_client import pause_mode_for

        if not partial_rollouts:
            return "abort"
        return pause_mode_for(self.call("model_info", deadline), partial_rollouts)

    def pause(self, mode: str, deadline: _Deadline) -> dict[str, float]:
        """Pause every engine; how many running requests were retracted or aborted (when they say)."""
        answers = self.call("pause_generation", deadline, mode=mode)
        counts = {"retracted_requests": 0.0, "aborted_requests": 0.0}
        for answer in answers:
            if isinstance(answer, dict):
                counts["retracted_requests"] += float(answer.get("retracted") or 0)
                counts["aborted_requests"] += float(answer.get("aborted") or 0)
        return counts

    def close(self) -> None:
        try:
            self.portal.call(self._http.aclose)
        finally:
            self._stack.close()


def _until_done(future: concurrent.futures.Future, failed: threading.Event, deadline: _Deadline) -> None:
    """Until every engine answered, or one failed (the others may wait for it forever)."""
    while not future.done() and not failed.is_set():
        concurrent.futures.wait([future], timeout=min(0.01, deadline.left()))


def wait(future: concurrent.futures.Future, deadline: _Deadline) -> Any:
    """The future's result, within what is left of ``deadline``."""
    try:
        return future.result(deadline.left())
    except concurrent.futures.TimeoutError:
        future.cancel()
        deadline.left()  # raises the deadline's error
        raise


# ---------------------------------------------------------------------------------------
# collective


class CollectiveTransport:
    """``collective``: bucketed ``torch.distributed`` broadcast from learner rank 0 to a pool.

    Args (keywords, after the positional config which may be ``None`` or a
    :class:`~agentrl_core.config.WeightSyncConfig`; ``weight_sync=`` works too):
        backend: ``gloo``, ``nccl`` or ``auto`` (:func:`choose_backend`: NCCL when CUDA is
            available and no engine shares learner rank 0's GPU, else gloo).
        shared_device: an engine of this pool is on learner rank 0's GPU (the placement says).
        bucket_mb: bucket size in MiB.
        dtype: cast tensors to this dtype before sending: a torch dtype, a name, or ``auto``
            (:func:`transfer_dtype` on this machine's device; default: as they are).
        ranks_per_engine: process-group ranks one engine takes (SGLang's tp size; 1 for hf).
        timeout_s: the deadline of a whole ``connect`` or ``send`` (and of each collective).
    """

    name = "collective"

    def __init__(self, config: Any = None, **kwargs: Any) -> None:
        s = _settings(config, kwargs)
        self.shared_device = bool(s.get("shared_device", False))
        self.backend, self.backend_reason = choose_backend(
            s.get("backend", "auto"), cuda=torch.cuda.is_available(), shared_device=self.shared_device,
            pool=s.get("pool") or "this pool")
        self.bucket_bytes = int(float(s.get("bucket_mb", 512.0)) * 2**20)
        self.dtype = transfer_dtype(s.get("dtype"), model_dtype=s.get("model_dtype", "bfloat16"),
                                    device_kind="cuda" if torch.cuda.is_available() else "cpu")
        self.ranks_per_engine = int(s.get("ranks_per_engine", 1))
        self.timeout_s = float(s.get("timeout_s", 600.0))
        self.group_name = s.get("group_name") or f"agentrl_weights_{uuid.uuid4().hex[:8]}"
        self._group_base = self.group_name
        self.partial_rollouts = bool(s.get("partial_rollouts", False))
        self.pause_mode = "abort"
        self.group: Any = None
        self.engines: _Engines | None = None
        self._joined: tuple[str | None, list[str]] | None = None  # what connect was given
        self.abandoned = 0  # groups given up after a failed bucket (formed again at the next send)
        self._forms = 0

    def connect(self, learner_rank0: str | None, engines: Sequence[str]) -> None:
        """Form the group: ``learner_rank0`` is the address engines reach this process at."""
        from agentrl_core.engine.weight_group import init_weight_update_group

        if self.group is not None:
            raise WeightSyncError("this transport is already connected; close() it first")
        self._joined = (learner_rank0, list(engines))
        address = learner_rank0 or "127.0.0.1"
        port = free_port(address)
        deadline = _Deadline(self.timeout_s, f"forming the weight-update group with {len(engines)} engines",
                             "no group was formed")
        self.engines = _Engines(engines, self.timeout_s)
        try:
            self.pause_mode = self.engines.choose_pause_mode(self.partial_rollouts, deadline)
        except WeightSyncError:
            self.engines.close()
            self.engines = None
            raise
        world_size = 1 + len(engines) * self.ranks_per_engine
        joins = self.engines.start(
            "init_weights_update_group", deadline,
            per_engine=[
                dict(master_address=address, master_port=port, rank_offset=1 + i * self.ranks_per_engine,
                     world_size=world_size, group_name=self.group_name, backend=self.backend)
                for i in range(len(engines))
            ],
        )
        result: dict[str, Any] = {}

        def host() -> None:
            try:
                result["group"] = init_weight_update_group(
                    backend=self.backend, master_address=address, master_port=port, world_size=world_size,
                    rank=0, group_name=self.group_name, timeout=timedelta(seconds=self.timeout_s))
            except BaseException as exc:  # reported below
                result["error"] = exc

        hosting = threading.Thread(target=host, name="weight-group-host", daemon=True)
        hosting.start()
        try:
            try:
                wait(joins, deadline)
            except WeightSyncError as exc:
                raise WeightSyncError(f"engines could not join the weight-update group {self.group_name!r}: "
                                      f"{exc}") from None
            hosting.join(deadline.left())
            if "error" in result or "group" not in result:
                raise WeightSyncError(f"hosting the weight-update group failed: {result.get('error', 'timed out')}")
        except WeightSyncError:
            self._abandon(result.get("group"))
            raise
        self.group = result["group"]
        log.info("weight-update group %s: learner + %d engines over %s (%s) at %s:%d; syncs pause with %s",
                 self.group_name, len(engines), self.backend, self.backend_reason, address, port, self.pause_mode)

    def send(self, named_tensors: NamedTensors, version: int) -> dict[str, float]:
        """Pause the pool, broadcast every bucket, continue with ``version``.

        The iterator is always consumed to the end, because the other learner ranks are
        gathering the same tensors; on failure a :class:`Lockstep` stream is stopped on every
        rank instead (:func:`release`).
        """
        if self.group is None and self._joined is not None and self.abandoned:
            self._form_again()
        if self.group is None or self.engines is None:
            raise WeightSyncError("connect() the collective transport before send()")
        tensors = iter(named_tensors)
        try:
            stats = self._send(tensors, version)
        except BaseException:
            release(tensors)
            raise
        drain(tensors)
        return stats

    def _send(self, tensors: Iterator[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        assert self.engines is not None
        start = time.perf_counter()
        deadline = _Deadline(self.timeout_s, f"the weight sync of version {version} to {len(self.engines.urls)} engines")
        paused = self.engines.pause(self.pause_mode, deadline)
        n_tensors = n_buckets = n_bytes = 0
        for bucket in iter_buckets(self._prepared(tensors), self.bucket_bytes):
            refusals: list[str] = []
            refused = threading.Event()
            receiving = self.engines.start(
                "update_weights_from_distributed", deadline, errors=refusals, failed=refused,
                names=[n for n, _ in bucket], dtypes=[_dtype_name(t.dtype) for _, t in bucket],
                shapes=[list(t.shape) for _, t in bucket], group_name=self.group_name,
                weight_version=version, flush_cache=True,
            )
            try:
                for _, tensor in bucket:
                    if not self._broadcast(tensor, refused, deadline):
                        break  # an engine refused the bucket: it will never join this broadcast
                    n_bytes += tensor.numel() * tensor.element_size()
                else:
                    _until_done(receiving, refused, deadline)
            except WeightSyncError as exc:  # the deadline passed, or a broadcast failed (an engine left)
                refusals.append(f"rank 0: {exc}")
            if refused.is_set() or refusals:
                # An engine that refused never joined the broadcast: the others wait in it for
                # tensors that cannot come, and (gloo) bytes meant for it may sit in its sockets.
                self._abandon_group(receiving, refusals)
                raise WeightSyncError(f"weight version {version}, bucket {n_buckets}: {'; '.join(refusals[:6])}. The "
                                      "weight-update group was left on every side, which releases the engines "
                                      "waiting in the broadcast; the next sync forms a new one") from None
            receiving.result()
            n_tensors += len(bucket)
            n_buckets += 1
        self.engines.call("continue_generation", deadline)
        seconds = time.perf_counter() - start
        log.info("synced %d tensors (%.1f MiB) in %d buckets to %d engines in %.2f s (version %d)",
                 n_tensors, n_bytes / 2**20, n_buckets, len(self.engines.urls), seconds, version)
        return {"tensors": n_tensors, "buckets": n_buckets, "bytes": n_bytes, "seconds": seconds, **paused}

    def _broadcast(self, tensor: torch.Tensor, refused: threading.Event, deadline: _Deadline) -> bool:
        """Broadcast one tensor; False as soon as an engine refused the bucket (the broadcast
        may then never finish), WeightSyncError past the deadline or when the broadcast failed."""
        import torch.distributed as dist

        work = dist.broadcast(tensor, src=0, group=self.group, async_op=True)
        pause = 0.0002
        while not work.is_completed():
            if refused.is_set():
                return False
            deadline.left()
            refused.wait(pause)
            pause = min(2 * pause, 0.01)
        try:
            work.wait()
        except RuntimeError as exc:
            raise WeightSyncError(f"the broadcast failed: {exc}") from None
        return True

    def _abandon_group(self, receiving: concurrent.futures.Future, refusals: list[str]) -> None:
        """A bucket that not every engine takes part in cannot finish: leave the group on every
        side. An engine that refused (it is idle) leaves at once, and with it the connections
        the engines waiting in the broadcast wait on (gloo), and rank 0 leaves its side; those
        engines' updates then fail and they answer. Over NCCL, an engine already inside the
        broadcast is released by its collective timeout instead. ``send`` forms a new group."""
        from agentrl_core.engine.weight_group import destroy_weight_update_group

        assert self.engines is not None
        grace = _Deadline(min(30.0, self.timeout_s), "releasing the engines of an abandoned weight-update group",
                          "they stay in the broadcast until their collective timeout")
        leaving = self.engines.start("destroy_weights_update_group", grace, group_name=self.group_name)
        group, self.group = self.group, None
        destroy_weight_update_group(group)
        del group
        gc.collect()  # gloo closes the group's connections when the object is freed, not when destroyed
        self.abandoned += 1
        for what, future in (("the bucket", receiving), ("leaving the group", leaving)):
            try:
                wait(future, grace)
            except WeightSyncError as exc:
                log.info("after an abandoned bucket, %s: %s", what, exc)
        log.warning("weight-update group %s abandoned after a failed bucket: %s", self.group_name, "; ".join(refusals))

    def _form_again(self) -> None:
        """After an abandoned group: the same engines join a new one (under a new name: an engine
        still inside the old broadcast has not left it yet)."""
        assert self._joined is not None
        if self.engines is not None:
            self.engines.close()
            self.engines = None
        self._forms += 1
        self.group_name = f"{self._group_base}_{self._forms}"
        self.connect(*self._joined)

    def _prepared(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        want_cuda = self.backend == "nccl"
        for name, tensor in tensors:
            if self.dtype is not None:
                tensor = tensor.to(self.dtype)
            if want_cuda and not tensor.is_cuda:
                tensor = tensor.cuda()
            elif not want_cuda and tensor.device.type != "cpu":
                tensor = tensor.cpu()
            yield name, tensor.contiguous()

    def _abandon(self, group: Any) -> None:
        """A group that did not form: the engines that joined it leave it (the others say it does not exist)."""
        assert self.engines is not None
        try:
            self.engines.call("destroy_weights_update_group", _Deadline(min(30.0, self.timeout_s), "leaving a "
                              "half-formed weight-update group"), group_name=self.group_name)
        except WeightSyncError as exc:
            log.debug("after a failed connect: %s", exc)
        if group is not None:
            from agentrl_core.engine.weight_group import destroy_weight_update_group

            destroy_weight_update_group(group)
        self.engines.close()
        self.engines = None

    def close(self) -> None:
        """Leave the group on both sides and close the HTTP clients.

        An engine that is gone (a restarted one's predecessor, or one stopped first at the end
        of a run) left the group with its process: that is no failure and says nothing.
        """
        if self.engines is not None and self.group is not None:
            try:
                self.engines.call("destroy_weights_update_group", _Deadline(min(30.0, self.timeout_s), "leaving the "
                                  "weight-update group"), gone_ok=True, group_name=self.group_name)
            except WeightSyncError as exc:
                log.warning("engines could not destroy the weight-update group: %s", exc)
        if self.group is not None:
            from agentrl_core.engine.weight_group import destroy_weight_update_group

            destroy_weight_update_group(self.group)
            self.group = None
        if self.engines is not None:
            self.engines.close()
            self.engines = None


# ---------------------------------------------------------------------------------------
# disk

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def write_hf_checkpoint(
    named_tensors: NamedTensors, out_dir: str | os.PathLike, model_dir: str | os.PathLike | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write a Hugging Face model directory atomically (``out_dir.tmp`` then rename).

    Weights go to ``model.safetensors``; every other file of ``model_dir`` (config,
    tokenizer, chat template, generation config) is copied, so the result loads with
    ``from_pretrained`` and serves as an engine's ``--model``.
    """
    from safetensors.torch import save_file

    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if model_dir is not None:
        for item in Path(model_dir).iterdir():
            if item.is_file() and not item.name.endswith(_WEIGHT_SUFFIXES) and not item.name.endswith(".index.json"):
                shutil.copy2(item, tmp / item.name)
    tensors = {name: t.detach().to("cpu", dtype=dtype).contiguous() for name, t in named_tensors}
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    with open(tmp / "model.safetensors", "rb") as f:
        os.fsync(f.fileno())
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


class DiskTransport:
    """``disk``: write safetensors to a shared path, then ``/update_weights_from_disk``.

    Args (keywords): ``disk_path`` (a directory every engine can read; required),
    ``model_dir`` (the model the run started from: config and tokenizer files are copied
    from it), ``keep`` (versions kept on disk, default 2), ``dtype`` (as the collective
    transport's), ``timeout_s`` (the deadline of a whole ``send``).

    A send pauses the pool (``retract`` or ``abort``, chosen at ``connect`` as for the
    collective transport), loads the new directory on every engine, and continues:
    unpaused, SGLang would wait for every running request to finish first, and a failed
    load leaves the pool paused.
    """

    name = "disk"

    def __init__(self, config: Any = None, **kwargs: Any) -> None:
        s = _settings(config, kwargs)
        if not s.get("disk_path"):
            raise WeightSyncError("the disk weight-sync transport needs weight_sync.disk_path (a directory the engines can read)")
        self.root = Path(s["disk_path"])
        self.model_dir = s.get("model_dir")
        self.keep = max(int(s.get("keep", 2)), 1)
        self.timeout_s = float(s.get("timeout_s", 600.0))
        self.dtype = transfer_dtype(s.get("dtype"), model_dtype=s.get("model_dtype", "bfloat16"),
                                    device_kind="cuda" if torch.cuda.is_available() else "cpu")
        self.partial_rollouts = bool(s.get("partial_rollouts", False))
        self.pause_mode = "abort"
        self.engines: _Engines | None = None
        self._written: list[Path] = []

    def connect(self, learner_rank0: str | None, engines: Sequence[str]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.engines = _Engines(engines, self.timeout_s)
        self.pause_mode = self.engines.choose_pause_mode(
            self.partial_rollouts, _Deadline(self.timeout_s, "asking the engines how they pause", "no sync ran"))

    def send(self, named_tensors: NamedTensors, version: int) -> dict[str, float]:
        if self.engines is None:
            raise WeightSyncError("connect() the disk transport before send()")
        start = time.perf_counter()
        deadline = _Deadline(self.timeout_s, f"the disk weight sync of version {version} to {len(self.engines.urls)} engines")
        tensors = iter(named_tensors)
        try:
            path = write_hf_checkpoint(tensors, self.root / f"weights_v{version}", self.model_dir, self.dtype)
        except BaseException:
            release(tensors)
            raise
        written = time.perf_counter()
        paused = self.engines.pause(self.pause_mode, deadline)
        self.engines.call("update_weights_from_disk", deadline, model_path=str(path), weight_version=version)
        self.engines.call("continue_generation", deadline)
        if path not in self._written:
            self._written.append(path)
        while len(self._written) > self.keep:
            shutil.rmtree(self._written.pop(0), ignore_errors=True)
        nbytes = (path / "model.safetensors").stat().st_size
        return {"bytes": nbytes, "write_seconds": written - start, "seconds": time.perf_counter() - start, **paused}

    def close(self) -> None:
        if self.engines is not None:
            self.engines.close()
            self.engines = None
