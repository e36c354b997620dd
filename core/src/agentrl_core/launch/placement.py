"""Which devices (GPUs, or CPU cores on a CPU-only machine) each pool gets.

* ``async`` mode (the paper's design): the learner and the rollout engines run on
  *disjoint* devices; ``engine.rollout_ratio`` (0.5) of them generate. The rollout share
  is split between the sampler's pools by their ``device_share`` (cross sampling: 0.75
  current, 0.25 stale).
* ``sync`` mode (the baseline): everything is colocated; all devices generate the whole
  batch, then all train.

On CPU a "device" is a core: an engine gets a set of cores (its threads are pinned to
them) and the learner ranks split theirs. On GPU one engine gets ``tp_size`` GPUs and one
learner rank one GPU.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Hashable, Sequence

from attrs import frozen

from agentrl_core.errors import ConfigError
from agentrl_core.types import PoolSpec

log = logging.getLogger(__name__)


@frozen
class Placement:
    kind: str  # "cpu" or "cuda"
    learner: list[list[int]]  # devices of each learner rank
    pools: dict[str, list[list[int]]]  # pool -> devices of each engine
    colocated: bool

    def describe(self) -> str:
        unit = "cores" if self.kind == "cpu" else "GPUs"
        parts = [f"learner {self.learner}"] + [f"{name} {engines}" for name, engines in self.pools.items()]
        return f"{unit}: " + "; ".join(parts) + (" (colocated)" if self.colocated else "")


def available_devices(kind: str, limit: int | None = None) -> list[int]:
    if kind == "cuda":
        import torch

        devices = list(range(torch.cuda.device_count()))
    else:
        devices = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return devices[:limit] if limit else devices


def split_devices(devices: Sequence[int], parts: int) -> list[list[int]]:
    """Split devices into ``parts`` contiguous, nearly equal, non-empty groups."""
    parts = max(1, min(parts, len(devices)))
    size, extra = divmod(len(devices), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(list(devices[start:end]))
        start = end
    return out


def plan_placement(
    devices: Sequence[int],
    pools: Sequence[PoolSpec],
    *,
    kind: str,
    mode: str,
    rollout_ratio: float,
    learner_ranks: int,
    engines_per_pool: int | None = None,
    tp_size: int = 1,
) -> Placement:
    """Assign devices to learner ranks and to the engines of each pool."""
    devices = list(devices)
    if not devices:
        raise ConfigError("no devices available to place the learner and the engines")
    if mode == "sync" or len(devices) == 1:
        if mode == "async":
            log.warning("only one %s device: async mode runs learner and engines colocated", kind)
        learner = split_devices(devices, learner_ranks)
        pool_devices = {p.name: devices for p in pools}
        colocated = True
    else:
        n_rollout = min(len(devices) - 1, max(1, round(len(devices) * rollout_ratio)))
        rollout, learner_devs = devices[:n_rollout], devices[n_rollout:]
        learner = split_devices(learner_devs, learner_ranks)
        pool_devices = _share(rollout, pools)
        colocated = False
    if len(learner) < learner_ranks:
        raise ConfigError(
            f"train.world_size={learner_ranks} needs at least {learner_ranks} learner {kind} devices, "
            f"got {sum(len(d) for d in learner)}"
        )
    placed: dict[str, list[list[int]]] = {}
    for pool in pools:
        devs = pool_devices[pool.name]
        if kind == "cuda":
            n = len(devs) // tp_size
            if n < 1:
                raise ConfigError(f"pool {pool.name!r} has {len(devs)} GPUs, fewer than engine tp_size={tp_size}")
            placed[pool.name] = [devs[i * tp_size:(i + 1) * tp_size] for i in range(n)]
        else:
            placed[pool.name] = split_devices(devs, engines_per_pool or 1)
            if engines_per_pool and len(placed[pool.name]) < engines_per_pool:
                log.warning("pool %r: engine.num_engines=%d, but its engines have %d CPU core(s), one engine per "
                            "core: starting %d (train.mode sync gives the engines every core)", pool.name,
                            engines_per_pool, len(devs), len(placed[pool.name]), len(placed[pool.name]))
    return Placement(kind, learner, placed, colocated)


def _share(rollout: list[int], pools: Sequence[PoolSpec]) -> dict[str, list[int]]:
    """Split rollout devices by pool device_share; pools that get none share the last device."""
    total = sum(p.device_share for p in pools)
    counts = [max(1, round(len(rollout) * p.device_share / total)) for p in pools]
    while sum(counts) > len(rollout) and max(counts) > 1:
        counts[counts.index(max(counts))] -= 1
    out, start = {}, 0
    for pool, count in zip(pools, counts):
        if start + count <= len(rollout):
            out[pool.name] = rollout[start:start + count]
            start += count
        else:
            log.warning("pool %r gets no device of its own: it shares %s", pool.name, rollout[-1:])
            out[pool.name] = rollout[-1:]
    return out


def shared_devices(placement: Placement, where: Callable[[int], Hashable] | None = None) -> dict[str, dict[str, bool]]:
    """For each pool: does an engine share a device with learner rank 0 (``rank0``), with any learner rank (``any_rank``)?

    Two slots share a device when they are on the same node and hold the same GPU (or CPU
    core) id. ``where`` maps a placement index to that identity, e.g. ``(node address,
    physical GPU id)`` as Ray reserved it; by default the index itself (the placement's
    indices are global: index ``d`` is one device of one node).

    ``rank0`` decides the weight-sync backend (NCCL refuses two ranks of a group on one GPU:
    :func:`agentrl_core.train.weight_sync.choose_backend`); ``any_rank`` decides whether the
    engines release their memory while the learner trains (``engine.release_memory``).
    """
    ident = where or (lambda d: d)
    rank0 = {ident(d) for d in (placement.learner[0] if placement.learner else [])}
    learner = {ident(d) for devs in placement.learner for d in devs}
    out = {}
    for pool, engines in placement.pools.items():
        engine = {ident(d) for devs in engines for d in devs}
        out[pool] = {"rank0": bool(engine & rank0), "any_rank": bool(engine & learner)}
    return out


def release_pools(setting: bool | None, kind: str, shared: dict[str, dict[str, bool]]) -> list[str]:
    """The pools whose engines release their memory around each learner step: with
    ``engine.release_memory`` unset (auto), those sharing a GPU with a learner rank; ``true``:
    every pool sharing a device (on CPU too: the hf engine then frees its KV cache); ``false``: none."""
    if setting is False:
        return []
    return [pool for pool, where in shared.items() if where["any_rank"] and (setting or kind == "cuda")]
