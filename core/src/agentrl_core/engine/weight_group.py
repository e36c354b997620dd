"""The process group that carries new weights from the learner to the engines.

Both sides of ``/init_weights_update_group`` must build the group the same way, and the
way is SGLang's (so one learner talks to our HF engines and to SGLang servers alike):
a TCP rendezvous at ``tcp://master_address:master_port`` where the learner is rank 0 and
hosts the store, the store wrapped in a ``PrefixStore(group_name)``, and a process group
of ``world_size`` ranks registered with global-to-group ranks the identity, so
``torch.distributed.broadcast(t, src=0, group=group)`` works in a process that has no
default process group (an engine) and in one that has its own (an FSDP learner).

Every rank calls :func:`init_weight_update_group` at about the same time; it returns once
all ``world_size`` ranks joined. An engine joins as rank ``rank_offset`` (+ its tensor
parallel rank, for SGLang).
"""

from __future__ import annotations

import inspect
from datetime import timedelta
from typing import Any

__all__ = ["init_weight_update_group", "destroy_weight_update_group", "DEFAULT_GROUP_TIMEOUT"]

DEFAULT_GROUP_TIMEOUT = timedelta(minutes=10)


def init_weight_update_group(
    *,
    backend: str,
    master_address: str,
    master_port: int,
    world_size: int,
    rank: int,
    group_name: str,
    timeout: timedelta | None = None,
) -> Any:
    """Join (rank > 0) or host (rank 0) the weight-update group; returns the process group."""
    from torch.distributed import distributed_c10d as c10d
    from torch.distributed.rendezvous import rendezvous

    if not group_name:
        raise ValueError("the weight-update group needs a non-empty group_name")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a weight-update group of world_size {world_size}")
    timeout = timeout or DEFAULT_GROUP_TIMEOUT
    host = f"[{master_address}]" if ":" in master_address else master_address
    store, rank, world_size = next(rendezvous(f"tcp://{host}:{master_port}", rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = c10d.PrefixStore(group_name, store)
    # ``pg_options`` was renamed ``backend_options`` in torch 2.6
    helper = c10d._new_process_group_helper
    options = "backend_options" if "backend_options" in inspect.signature(helper).parameters else "pg_options"
    group, _ = helper(world_size, rank, [], c10d.Backend(backend), store, group_name=group_name,
                      timeout=timeout, **{options: None})
    c10d._world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group


def destroy_weight_update_group(group: Any) -> None:
    import torch.distributed as dist

    dist.destroy_process_group(group)
