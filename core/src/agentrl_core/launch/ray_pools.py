"""Ray placement of the learner pool and the engine pools (docs/architecture.md section 6).

One placement group reserves a bundle per learner rank and per engine. Learner ranks are
Ray actors running the FSDP2 :class:`~agentrl_core.train.learner.Learner`; each engine is
started by a small host actor placed in the engine's bundle (so on a cluster it runs on
the node that owns those devices). On a machine without GPUs a bundle is a set of CPU
cores: the actor pins itself (and the engine process) to them, so pools really run on
disjoint cores in async mode. The same code runs on one machine with a local Ray
(``launch.address: null``) and on an existing cluster (``--address``).
"""

from __future__ import annotations

import logging
import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl_core.config import Config
from agentrl_core.errors import AgentrlError
from agentrl_core.launch.placement import Placement

log = logging.getLogger(__name__)


def init_ray(config: Config, *, num_cpus: int | None = None, num_gpus: int | None = None) -> None:
    import ray

    if ray.is_initialized():
        return
    launch = config.launch
    if launch.address:
        ray.init(address=launch.address, logging_level=logging.WARNING, log_to_driver=True)
        return
    ray.init(
        num_cpus=launch.num_cpus or num_cpus,
        num_gpus=launch.num_gpus if launch.num_gpus is not None else num_gpus,
        include_dashboard=False,
        logging_level=logging.WARNING,
        # the workers inherit this interpreter's environment (plugins, PYTHONPATH)
        runtime_env={"env_vars": {k: v for k, v in os.environ.items() if k in ("PYTHONPATH", "AGENTRL_DATA_DIR")}},
    )


def _pin(kind: str, devices: Sequence[int]) -> None:
    if kind == "cpu" and devices and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, list(devices))
        import torch

        torch.set_num_threads(len(devices))


class LearnerRank:
    """One rank of the learner (a Ray actor). Every rank gets every call, in the same order."""

    def __init__(self, rank: int, world_size: int, master: tuple[str, int], devices: Sequence[int], kind: str,
                 model_path: str, config: Config) -> None:
        _pin(kind, devices)
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK="0",
                          MASTER_ADDR=master[0], MASTER_PORT=str(master[1]))
        from agentrl_core.registry import Registry
        from agentrl_core.train.learner import Learner, init_distributed

        self.rank = rank
        self.config = config
        self.model_path = model_path
        _, _, device = init_distributed(config.train.device)
        self.registry = Registry()
        loss_fn = self.registry.build("policy_loss", config.loss.name)
        self.learner = Learner(model_path, train=config.train, optim=config.optim, loss=config.loss,
                               temperature=config.rollout.temperature, loss_fn=loss_fn, device=device)
        self.transports: dict[str, Any] = {}

    def ready(self) -> int:
        return self.rank

    def connect(self, pools: Mapping[str, list[str]], address: str) -> None:
        """Rank 0 forms one weight-sync transport per pool with that pool's engines (again, after a restart)."""
        if self.rank != 0:
            return
        ws = self.config.weight_sync
        for pool, urls in pools.items():
            old = self.transports.pop(pool, None)
            if old is not None:
                try:
                    old.close()
                except Exception as exc:  # its engine is gone; the group is replaced anyway
                    log.warning("closing the old weight-sync transport of %s: %s", pool, exc)
            transport = self.registry.build("weight_sync_transport", ws.transport, None, weight_sync=ws,
                                            model_dir=self.model_path)
            transport.connect(address, urls)
            self.transports[pool] = transport

    def train_step(self, samples: list[Any]) -> dict[str, float]:
        return self.learner.train_step(samples)

    def sync(self, pools: list[str], version: int) -> dict[str, float]:
        from agentrl_core.train.weight_sync import push_weights

        return push_weights(self.learner.named_full_tensors, self.transports, pools, version, rank=self.rank)

    def save_checkpoint(self, root: str, trainer_state: dict[str, Any], keep: int, hf_model: bool) -> str:
        from agentrl_core.train.checkpoint import save_checkpoint

        return str(save_checkpoint(root, self.learner, trainer_state, keep=keep, hf_model=hf_model))

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        from agentrl_core.train.checkpoint import load_checkpoint

        return load_checkpoint(path, self.learner)

    def save_hf_model(self, out_dir: str) -> str | None:
        from agentrl_core.train.checkpoint import save_hf_model

        path = save_hf_model(self.learner, out_dir)
        return str(path) if path is not None else None

    def shutdown(self) -> None:
        for transport in self.transports.values():
            try:
                transport.close()
            except Exception as exc:  # closing is best effort; the process exits next
                log.warning("closing a weight-sync transport failed: %s", exc)
        self.learner.close()
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class EngineHost:
    """Starts and stops the engines of one bundle (a Ray actor on the bundle's node)."""

    def __init__(self, kind: str, devices: Sequence[int], config: Config, log_dir: str) -> None:
        from agentrl_core.registry import Registry

        self.kind = kind
        self.devices = list(devices)
        self.driver = Registry().build("rollout_engine", config.engine.driver, None, engine=config.engine,
                                       log_dir=log_dir)

    def launch(self, pool: str, model_path: str) -> list[str]:
        return self.driver.launch(pool, model_path, [self.devices])

    def relaunch(self, pool: str, model_path: str) -> list[str]:
        """Stop whatever is left of this bundle's engine and start a fresh one."""
        self.driver.shutdown()
        return self.driver.launch(pool, model_path, [self.devices])

    def shutdown(self) -> None:
        self.driver.shutdown()


def bundle_resources(placement: Placement) -> list[dict[str, float]]:
    """Ray resources of each bundle: the learner ranks' first, then every engine's, pool by pool.

    A device claimed by k bundles (a colocated learner and engine; a pool too small for a
    device of its own sharing another pool's) gives each of them 1/k of itself, so the
    placement group asks for exactly the devices there are and can be satisfied.
    """
    slots = [*placement.learner, *(devs for engines in placement.pools.values() for devs in engines)]
    claims = Counter(d for devs in slots for d in devs)
    out = []
    for devices in slots:
        amount = math.floor(sum(1.0 / claims[d] for d in devices) * 1e6 + 1e-6) / 1e6  # never above the device
        out.append({"GPU": amount, "CPU": 1} if placement.kind == "cuda" else {"CPU": amount})
    return out


class RayPools:
    """The placement group, the learner ranks and the engine hosts of one run."""

    def __init__(self, placement: Placement, config: Config, *, model_path: str, run_dir: Path) -> None:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.placement = placement
        kind = placement.kind
        engine_slots = [(pool, devs) for pool, engines in placement.pools.items() for devs in engines]
        bundles = bundle_resources(placement)
        self.pg = placement_group(bundles, strategy="PACK")
        try:
            ray.get(self.pg.ready(), timeout=float(os.environ.get("AGENTRL_PLACEMENT_TIMEOUT", "600")))
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(self.pg)
            raise AgentrlError(
                f"Ray could not reserve the placement group {bundles} (learner ranks first, then engines) "
                f"within the timeout; the cluster has {ray.available_resources()} available. "
                "Lower train.world_size / engine.num_engines, or start Ray with more resources."
            ) from None

        def strategy(i: int) -> PlacementGroupSchedulingStrategy:
            return PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i)

        def resources(i: int) -> dict[str, Any]:
            return {"num_cpus": bundles[i].get("CPU", 0), "num_gpus": bundles[i].get("GPU", 0)}

        self.hosts: dict[str, list[Any]] = {}
        host_cls = ray.remote(EngineHost)
        for j, (pool, devs) in enumerate(engine_slots):
            slot = len(placement.learner) + j
            host = host_cls.options(scheduling_strategy=strategy(slot), **resources(slot)).remote(
                kind, devs, config, str(run_dir / "logs"))
            self.hosts.setdefault(pool, []).append(host)
        self.urls: dict[str, list[str]] = {}
        self.host_of: dict[str, Any] = {}  # engine url -> the host actor that runs it
        self.model_path = model_path
        launches = {pool: [h.launch.remote(pool, model_path) for h in hosts] for pool, hosts in self.hosts.items()}
        for pool, refs in launches.items():
            self.urls[pool] = []
            for host, urls in zip(self.hosts[pool], ray.get(refs)):
                urls = [u.rstrip("/") for u in urls]
                self.urls[pool] += urls
                self.host_of.update(dict.fromkeys(urls, host))

        master = (ray.util.get_node_ip_address(), _free_port())
        rank_cls = ray.remote(LearnerRank)
        world = len(placement.learner)
        self.ranks = [
            rank_cls.options(scheduling_strategy=strategy(i), **resources(i)).remote(
                i, world, master, devs, kind, model_path, config)
            for i, devs in enumerate(placement.learner)
        ]
        ray.get([r.ready.remote() for r in self.ranks])
        self.learner_address = master[0]

    async def relaunch(self, pool: str, url: str) -> str:
        """Restart the engine behind ``url`` in its bundle; returns the new engine's URL."""
        host = self.host_of.pop(url.rstrip("/"))
        new_urls = [u.rstrip("/") for u in await host.relaunch.remote(pool, self.model_path)]
        self.urls[pool] = [u for u in self.urls[pool] if u != url.rstrip("/")] + new_urls
        self.host_of.update(dict.fromkeys(new_urls, host))
        return new_urls[0]

    async def all_ranks(self, method: str, *args: Any) -> list[Any]:
        import asyncio

        return list(await asyncio.gather(*[getattr(r, method).remote(*args) for r in self.ranks]))

    def shutdown(self) -> None:
        import ray

        for refs in ([r.shutdown.remote() for r in self.ranks], [h.shutdown.remote() for hs in self.hosts.values() for h in hs]):
            try:
                ray.get(refs, timeout=60)
            except Exception as exc:  # the processes are killed below anyway
                log.warning("shutdown: %s", exc)
        for actor in [*self.ranks, *[h for hs in self.hosts.values() for h in hs]]:
            ray.kill(actor)
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(self.pg)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
