"""``vllm_nccl``: learner weights to vllm engines over vLLM's own NCCL weight transfer (GPU).

vLLM's workers join a trainer through ``StatelessProcessGroup`` + ``PyNcclCommunicator``
(``vllm.distributed.weight_transfer.nccl_common``), not through a ``torch.distributed``
group, so core's ``collective`` transport cannot reach them. This transport is rank 0's
side of vLLM's protocol, driven through the engines' fronts (which pass vLLM's routes
through) and framed like core's transports:

1. connect: every engine ``POST /init_weight_transfer_engine`` (engine ``i`` takes ranks from
   ``1 + i * ranks_per_engine`` of ``1 + N * ranks_per_engine``: vLLM adds each worker's
   parallel rank; unpacked broadcasts) while this process opens rank 0 with vLLM's
   ``trainer_init``;
2. send: ``/pause_generation {mode}`` on every engine (``retract`` with
   ``partial_rollouts=True``: in-flight requests keep their tokens and continue; else ``abort``), ``/start_weight_update``, then per
   bucket (core's :func:`~agentrl_core.train.weight_sync.iter_buckets`) ``/update_weights
   {names, dtype_names, shapes}`` on every engine *while* rank 0 broadcasts the bucket's
   tensors in order, cast to ``weight_sync.dtype`` (bf16 for a bf16 model: fp32 master
   weights would double the bytes), ``/finish_weight_update {weight_version}``, an optional bit-exact check
   (``verify: true``: sha256 of every tensor sent against the engine's ``/weight_digests``),
   and ``/continue_generation``.

**Not run on hardware:** written against vLLM 0.32's source (``nccl_engine.py``,
``nccl_common.py``, ``entrypoints/rl/online/api_router.py``), without a GPU to test it on.
On CPU use ``weight_sync.transport: disk`` (the engines reload the learner's saved weights in
place, tested against a real vLLM server).
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from agentrl_core.http.ports import free_port
from agentrl_core.rollout.engine_client import pause_mode_for
from agentrl_core.train.weight_sync import WeightSyncError, drain, iter_buckets, release

log = logging.getLogger(__name__)


def join_payloads(address: str, port: int, engines: int, ranks_per_engine: int = 1) -> list[dict[str, Any]]:
    """What each engine's ``/init_weight_transfer_engine`` carries (before vLLM's wrapping):
    engine ``i`` takes ranks ``1 + i * ranks_per_engine`` on (vLLM adds each worker's
    tensor/pipeline-parallel rank to ``rank_offset``), of ``1 + engines * ranks_per_engine``."""
    if ranks_per_engine < 1:
        raise WeightSyncError(f"ranks_per_engine must be >= 1, got {ranks_per_engine}")
    world_size = 1 + engines * ranks_per_engine
    return [dict(master_address=address, master_port=port, rank_offset=1 + i * ranks_per_engine,
                 world_size=world_size) for i in range(engines)]


def prepared(tensors: Iterable[tuple[str, Any]], dtype: Any = None, device: Any = "cuda") -> Iterator[tuple[str, Any]]:
    """The tensors as they go on the wire: in ``dtype`` (``weight_sync.dtype``; None: as they
    are), on ``device``, contiguous."""
    for name, tensor in tensors:
        tensor = tensor.detach()
        if dtype is not None:
            tensor = tensor.to(dtype)
        yield name, tensor.to(device).contiguous()


def update_info(bucket: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """vLLM's ``/update_weights`` description of one bucket (unpacked: one broadcast per tensor)."""
    return {"names": [n for n, _ in bucket], "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
            "shapes": [list(t.shape) for _, t in bucket]}


class VLLMNCCLTransport:
    """Args (keywords; a WeightSyncConfig positionally or as ``weight_sync=``): ``bucket_mb``,
    ``timeout_s``, ``dtype`` (``weight_sync.dtype``: a torch dtype or a name, ``auto`` the
    model's compute dtype; the learner passes the resolved one), ``ranks_per_engine`` (the
    group ranks one engine takes: its tensor x pipeline parallel size), ``verify`` (default
    False: hashing every tensor on both sides costs seconds per GB), ``partial_rollouts``
    (``rollout.partial_rollouts``: pause with ``retract``)."""

    name = "vllm_nccl"

    def __init__(self, config: Any = None, **kwargs: Any) -> None:
        from agentrl_core.train.weight_sync import transfer_dtype

        section = kwargs.pop("weight_sync", None) or config
        self.bucket_bytes = int(float(kwargs.get("bucket_mb") or getattr(section, "bucket_mb", 512.0)) * 2**20)
        self.timeout_s = float(kwargs.get("timeout_s") or getattr(section, "timeout_s", 600.0))
        dtype = kwargs.get("dtype") or getattr(section, "dtype", None)
        self.dtype = transfer_dtype(dtype, model_dtype=kwargs.get("model_dtype") or "bfloat16", device_kind="cuda")
        self.ranks_per_engine = int(kwargs.get("ranks_per_engine") or 1)
        self.verify = bool(kwargs.get("verify", False))
        self.partial_rollouts = bool(kwargs.get("partial_rollouts", False))
        self.pause_mode = "abort"
        self.urls: list[str] = []
        self.group: Any = None
        self.http: Any = None
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="vllm-nccl")
        self.dtypes: dict[str, Any] = {}

    # ------------------------------------------------------------------------------

    def _post(self, url: str, path: str, payload: Any = None) -> Any:
        response = self.http.post(url + path, json=payload)
        if response.status_code != 200:
            raise WeightSyncError(f"{url}{path} answered {response.status_code}: {response.text[:300]}")
        return response.json() if response.content else None

    def _all(self, path: str, payloads: Sequence[Any] | None = None) -> concurrent.futures.Future:
        """``path`` on every engine concurrently; a future that raises WeightSyncError naming the failures."""
        futures = [self.pool.submit(self._post, url, path, payloads[i] if payloads else None)
                   for i, url in enumerate(self.urls)]

        def gather() -> list[Any]:
            results, errors = [], []
            for future in futures:
                try:
                    results.append(future.result(self.timeout_s))
                except Exception as exc:  # every engine's error is reported, not only the first
                    errors.append(str(exc))
            if errors:
                raise WeightSyncError(f"{path} failed on {len(errors)} of {len(futures)} engines: {'; '.join(errors)}")
            return results

        return self.pool.submit(gather)

    def connect(self, learner_rank0: str | None, engines: Sequence[str]) -> None:
        import httpx
        import torch

        if self.group is not None:
            raise WeightSyncError("this transport is already connected; close() it first")
        if not torch.cuda.is_available():
            raise WeightSyncError("weight_sync.transport vllm_nccl needs CUDA on the learner; on CPU use "
                                  "weight_sync.transport: disk")
        from vllm.distributed.weight_transfer.nccl_common import (
            NCCLWeightTransferInitInfo,
            trainer_init,
            worker_init_payload,
        )

        self.urls = [u.rstrip("/") for u in engines]
        from agentrl_core.http.auth import authorization_header, env_token

        # the fronts require the run's token (AGENTRL_TOKEN, which agentrl train gives every process it starts)
        self.http = httpx.Client(timeout=httpx.Timeout(self.timeout_s, connect=10.0), trust_env=False,
                                 headers=authorization_header(env_token()))
        address = learner_rank0 or "127.0.0.1"
        port = free_port(address)
        payloads = join_payloads(address, port, len(self.urls), self.ranks_per_engine)
        joins = self._all("/init_weight_transfer_engine", [
            {"init_info": worker_init_payload(NCCLWeightTransferInitInfo(**p, packed=False))} for p in payloads])
        self.group = trainer_init({"master_address": address, "master_port": port,
                                   "world_size": payloads[0]["world_size"]})
        joins.result(self.timeout_s)
        if self.partial_rollouts:  # retract (keep in-flight requests) when every front offers it
            infos = [self.http.get(url + "/get_model_info").json() for url in self.urls]
            self.pause_mode = pause_mode_for(infos, self.partial_rollouts)
        if self.verify:
            digests = self.http.get(self.urls[0] + "/weight_digests").json()["digests"]
            self.dtypes = {name: getattr(torch, d["dtype"]) for name, d in digests.items()}
        log.info("vLLM NCCL weight transfer: learner + %d engines at %s:%d", len(self.urls), address, port)

    def send(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> dict[str, float]:
        """Pause, broadcast every bucket, finish with ``version``, check, continue (always drains the iterator)."""
        if self.group is None:
            raise WeightSyncError("connect() the vllm_nccl transport before send()")
        tensors = iter(named_tensors)
        try:
            stats = self._send(tensors, version)
        except BaseException:
            release(tensors)  # the other learner ranks stop with this one (or gather to the end)
            raise
        drain(tensors)
        return stats

    def _send(self, tensors: Iterator[tuple[str, Any]], version: int) -> dict[str, float]:
        import torch

        from agentrl_engine_vllm.digests import compare_digests, tensor_digest

        start = time.perf_counter()
        self._all("/pause_generation", [{"mode": self.pause_mode}] * len(self.urls)).result()
        self._all("/start_weight_update").result()
        sent: dict[str, str] = {}
        n_tensors = n_bytes = n_buckets = 0
        stream = torch.cuda.current_stream()
        for bucket in iter_buckets(prepared(tensors, self.dtype), self.bucket_bytes):
            info = update_info(bucket)
            receiving = self._all("/update_weights", [{"update_info": info}] * len(self.urls))
            for name, tensor in bucket:
                if receiving.done() and receiving.exception() is not None:
                    break  # an engine refused the bucket: it will not join the broadcast
                self.group.broadcast(tensor, src=0, stream=stream)
                n_bytes += tensor.numel() * tensor.element_size()
                if self.verify:
                    dtype = self.dtypes.get(name, tensor.dtype)
                    sent[name] = tensor_digest(tensor.to(dtype))
            try:
                receiving.result()
            except WeightSyncError as exc:
                raise WeightSyncError(f"weight version {version}, bucket {n_buckets}: {exc}") from None
            n_tensors += len(bucket)
            n_buckets += 1
        stream.synchronize()
        self._all("/finish_weight_update", [{"weight_version": str(version)}] * len(self.urls)).result()
        if self.verify:
            for url in self.urls:
                problems = compare_digests(sent, self.http.get(url + "/weight_digests").json()["digests"])
                if problems:
                    raise WeightSyncError(f"{url}: after version {version} the engine's weights differ from the "
                                          f"learner's: {'; '.join(problems[:3])}")
        self._all("/continue_generation", [{}] * len(self.urls)).result()
        seconds = time.perf_counter() - start
        log.info("synced %d tensors (%.1f MiB, %d buckets) to %d vllm engines over NCCL in %.2f s (version %d)",
                 n_tensors, n_bytes / 2**20, n_buckets, len(self.urls), seconds, version)
        return {"tensors": n_tensors, "buckets": n_buckets, "bytes": n_bytes, "seconds": seconds}

    def close(self) -> None:
        if self.group is not None:
            try:
                self._all("/shutdown_weight_transfer_engine").result(60)
            except WeightSyncError as exc:
                log.warning("engines could not shut their weight transfer down: %s", exc)
            self.group = None
        if self.http is not None:
            self.http.close()
            self.http = None
        self.pool.shutdown(wait=False)
