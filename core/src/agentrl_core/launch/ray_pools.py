"""Ray placement of the learner pool and the engine pools (docs/architecture.md section 6).

One placement group reserves the devices. Learner ranks are Ray actors
(:class:`LearnerRank`, a :class:`~agentrl_core.train.learner_actor.LearnerService` set up in
its own process) that a job calls through :class:`LearnerGroup`, every rank at once, with
named methods; each engine is started by a small host actor placed with the engine's devices
(so on a cluster it runs on the node that owns them).

* GPUs: one bundle per GPU. Each learner rank and each engine host is placed in the bundle
  of its (first) GPU and asks for its share of it, so Ray hands it exactly that GPU
  (``CUDA_VISIBLE_DEVICES``); a learner rank then uses ``cuda:0``. Before anything starts, a
  probe in every bundle reads which physical GPU and node Ray reserved, and an engine gets
  those physical ids (all of one node, for tensor parallelism) - never the placement's
  indices, which are not Ray's. Disjoint GPUs in async mode, shared ones when colocated.
* CPUs: one bundle per learner rank and engine with its share of the cores; the actor pins
  itself (and the engine process) to its cores, so pools run on disjoint cores in async mode.

The same code runs on one machine with a local Ray (``launch.address: null``) and on an
existing cluster (``--address``): then engines bind their node's address, and the learners'
rendezvous and the weight-update group are hosted at learner rank 0's node.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from attrs import frozen

from agentrl_core.config import Config
from agentrl_core.errors import AgentrlError
from agentrl_core.http.auth import TOKEN_ENV, env_token
from agentrl_core.http.ports import free_port
from agentrl_core.launch.placement import Placement, release_pools, shared_devices
from agentrl_core.train.learner_actor import LearnerService

log = logging.getLogger(__name__)


def init_ray(config: Config, *, num_cpus: int | None = None, num_gpus: int | None = None) -> None:
    import ray

    if ray.is_initialized():
        return
    launch = config.launch
    # the workers inherit this interpreter's environment (plugins, PYTHONPATH) and the run's token
    env_vars = {k: v for k, v in os.environ.items() if k in ("PYTHONPATH", "AGENTRL_DATA_DIR", TOKEN_ENV)}
    runtime_env = {"env_vars": env_vars} if env_vars else None
    if launch.address:
        ray.init(address=launch.address, logging_level=logging.WARNING, log_to_driver=True, runtime_env=runtime_env)
        return
    ray.init(
        num_cpus=launch.num_cpus or num_cpus,
        num_gpus=launch.num_gpus if launch.num_gpus is not None else num_gpus,
        include_dashboard=False,
        logging_level=logging.WARNING,
        runtime_env=runtime_env,
    )


def node_address() -> str:
    import ray

    return ray.util.get_node_ip_address()


def _pin(kind: str, devices: Sequence[int]) -> None:
    if kind != "cpu" or not devices or not hasattr(os, "sched_setaffinity"):
        return
    cores = [int(d) for d in devices]
    if not set(cores) <= set(range(os.cpu_count() or 1)):  # a node with other cores than the driver's
        log.warning("cores %s do not exist on this node; running unpinned", cores)
        return
    os.sched_setaffinity(0, cores)
    from agentrl_core.cpu_threads import set_torch_threads

    set_torch_threads(cores)  # its cores minus what other work keeps busy: no threads waiting on each other


class LearnerRank(LearnerService):
    """One rank of the learner (a Ray actor). Every rank gets every call, in the same order (:class:`LearnerGroup`)."""

    def __init__(self, rank: int, world_size: int, master: tuple[str, int], devices: Sequence[Any], kind: str,
                 model_path: str, config: Config) -> None:
        _pin(kind, devices)
        if kind == "cuda":
            _check_gpus(f"learner rank {rank}", devices)
        # Ray made this rank's GPU the only visible one: cuda:0 is it
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK="0",
                          MASTER_ADDR=master[0], MASTER_PORT=str(master[1]))
        from agentrl_core.train.learner import init_distributed

        _, _, device = init_distributed(config.train.device)
        super().__init__(rank, model_path, config, device)

    def ready(self) -> int:
        return self.rank

    def default_address(self) -> str:
        return node_address()


class LearnerGroup:
    """Every learner rank, called as one: each call goes to every rank (the same calls in the same
    order on each, which the ranks' collectives need) and rank 0's answer is returned.

    ``ranks`` are :class:`LearnerRank` actor handles (anything whose ``method.remote(...)``
    returns an awaitable).
    """

    def __init__(self, ranks: Sequence[Any]) -> None:
        self.ranks = list(ranks)

    async def _each(self, call: Callable[[Any], Any]) -> list[Any]:
        """Every rank's answer, once every rank answered; when one failed, the lowest rank's error
        (rank 0's says why; the others' that they stopped with it), so that a retry starts only
        after every rank left the failed call."""
        answers = await asyncio.gather(*[call(r) for r in self.ranks], return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        return list(answers)

    async def connect(self, pools: Mapping[str, list[str]], address: str | None = None,
                      ranks_per_engine: Mapping[str, int] | None = None,
                      shared_device: Mapping[str, bool] | None = None) -> None:
        await self._each(lambda r: r.connect.remote(pools, address, ranks_per_engine, shared_device))

    async def train_step(self, samples: list[Any]) -> dict[str, float]:
        return (await self._each(lambda r: r.train_step.remote(samples)))[0]

    async def take_token_logprobs(self) -> dict[int, list[float]]:
        """The last step's loss-token log-probs of every rank's samples, merged (each rank trained its own)."""
        merged: dict[int, list[float]] = {}
        for part in await self._each(lambda r: r.take_token_logprobs.remote()):
            merged.update(part)
        return merged

    async def sync(self, pools: list[str], version: int) -> dict[str, float]:
        return (await self._each(lambda r: r.sync.remote(pools, version)))[0]

    async def save_checkpoint(self, root: str, trainer_state: dict[str, Any], keep: int, hf_model: bool) -> str:
        return (await self._each(lambda r: r.save_checkpoint.remote(root, trainer_state, keep, hf_model)))[0]

    async def load_checkpoint(self, path: str) -> dict[str, Any]:
        return (await self._each(lambda r: r.load_checkpoint.remote(path)))[0]

    async def save_hf_model(self, out_dir: str) -> str | None:
        return (await self._each(lambda r: r.save_hf_model.remote(out_dir)))[0]


class EngineHost:
    """Starts and stops the engine of one placement slot (a Ray actor on the slot's node).

    ``devices`` are what the engine gets: CPU cores, or *physical* GPU ids of this node.
    """

    def __init__(self, kind: str, devices: Sequence[Any], config: Config, log_dir: str,
                 release_memory: bool = False, index: int = 0) -> None:
        from agentrl_core.rollout.drivers import build_engine_driver

        if kind == "cuda":
            _check_gpus("an engine host", devices)
        self.kind = kind
        self.devices = list(devices)
        # one machine: loopback only (the admin routes must not face the network); a cluster: this node
        self.host = node_address() if config.launch.address else "127.0.0.1"
        self.driver = build_engine_driver(config, log_dir=log_dir, host=self.host)
        if release_memory and hasattr(self.driver, "release_memory"):  # SGLang: start with --enable-memory-saver
            self.driver.release_memory = True
        # this slot's engine number in its pool: every host of a pool shares the run's log folder, so
        # their engines need distinct names (logs, port files) and seeds
        self.index = index

    def ranks_per_engine(self) -> int:
        from agentrl_core.rollout.drivers import ranks_per_engine

        return ranks_per_engine(self.driver)

    def launch(self, pool: str, model_path: str) -> list[str]:
        # first_index only when needed: a plugin driver written before it still serves one-engine pools
        numbered = {"first_index": self.index} if self.index else {}
        return self.driver.launch(pool, model_path, [self.devices], **numbered)

    def relaunch(self, pool: str, model_path: str) -> list[str]:
        """Stop whatever is left of this bundle's engine and start a fresh one."""
        self.driver.shutdown()
        return self.launch(pool, model_path)

    def shutdown(self) -> None:
        self.driver.shutdown()


def _check_gpus(who: str, expected: Sequence[Any]) -> None:
    """Ray must have handed this actor the GPU the placement reserved for it."""
    import ray

    given = [str(g) for g in ray.get_gpu_ids()]
    if given[:1] != [str(e) for e in expected[:1]]:
        raise AgentrlError(f"{who} was given GPUs {given} by Ray instead of {list(expected)}; the placement "
                           "group and the actor disagree (report this with the placement printed at start)")


@frozen
class Bundles:
    """The placement group's bundles, and where each slot (learner ranks, then engines) goes."""

    resources: list[dict[str, float]]
    slot_bundle: list[int]
    slot_resources: list[dict[str, float]]  # num_cpus / num_gpus the slot's actor asks of its bundle


def _share(amount: float) -> float:
    return math.floor(amount * 1e6 + 1e-6) / 1e6  # never above the device


def plan_bundles(placement: Placement, learner_resources: Mapping[str, float] | None = None,
                 engine_resources: Mapping[str, float] | None = None) -> Bundles:
    """Bundles for ``placement``: per GPU on ``cuda``, per slot on ``cpu``.

    A device claimed by k slots (a colocated learner and engine; a pool too small for a
    device of its own sharing another pool's) gives each of them 1/k of itself, so the
    placement group asks for exactly the devices there are and can be satisfied. A bundle
    holding a learner rank (an engine) also asks for ``learner_resources``
    (``engine_resources``): custom node resources that decide which nodes qualify.
    """
    slots = [*placement.learner, *(devs for engines in placement.pools.values() for devs in engines)]
    custom = [dict(learner_resources or {})] * len(placement.learner) + \
             [dict(engine_resources or {})] * (len(slots) - len(placement.learner))
    claims = Counter(d for devs in slots for d in devs)
    if placement.kind == "cuda":
        gpus = list(dict.fromkeys(d for devs in slots for d in devs))
        first = [gpus.index(devs[0]) for devs in slots]
        actors = Counter(first)
        resources = [{"GPU": 1.0, "CPU": float(max(1, actors[b]))} for b in range(len(gpus))]
        for slot, b in enumerate(first):
            for name, amount in custom[slot].items():
                resources[b][name] = max(resources[b].get(name, 0.0), float(amount))
        wanted = [{"num_cpus": 1.0, "num_gpus": _share(1.0 / claims[devs[0]])} for devs in slots]
        return Bundles(resources, first, wanted)
    amounts = [_share(sum(1.0 / claims[d] for d in devs)) for devs in slots]
    return Bundles([{"CPU": a, **{k: float(v) for k, v in custom[i].items()}} for i, a in enumerate(amounts)],
                   list(range(len(slots))), [{"num_cpus": a, "num_gpus": 0.0} for a in amounts])


def _where() -> tuple[str, list[str], int]:
    """Run inside a bundle: its node's address, the GPUs Ray reserved there, a free port on that node."""
    import ray

    return node_address(), [str(g) for g in ray.get_gpu_ids()], free_port("")


class RayPools:
    """The placement group, the learner ranks and the engine hosts of one run.

    ``learner_cls`` and ``host_cls`` are the actor classes (tests pass probes with the same
    constructor to check device assignment without a GPU).
    """

    def __init__(self, placement: Placement, config: Config, *, model_path: str, run_dir: Path,
                 learner_cls: type = LearnerRank, host_cls: type = EngineHost) -> None:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.placement = placement
        plan = plan_bundles(placement, config.launch.learner_resources, config.launch.engine_resources)
        self.pg = placement_group(plan.resources, strategy="PACK")
        try:
            ray.get(self.pg.ready(), timeout=float(os.environ.get("AGENTRL_PLACEMENT_TIMEOUT", "600")))
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(self.pg)
            raise AgentrlError(
                f"Ray could not reserve the placement group {plan.resources} within the timeout; the cluster has "
                f"{ray.available_resources()} available. Lower train.world_size / engine.num_engines, or start "
                "Ray with more resources."
            ) from None
        self.hosts: dict[str, list[Any]] = {}
        self.ranks: list[Any] = []
        try:
            self._start(placement, config, plan, model_path, run_dir, learner_cls, host_cls,
                        lambda b: PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=b))
        except BaseException:
            self.shutdown()
            raise

    def _start(self, placement: Placement, config: Config, plan: Bundles, model_path: str, run_dir: Path,
               learner_cls: type, host_cls: type, strategy: Any) -> None:
        import ray

        kind = placement.kind
        probe = ray.remote(num_cpus=0)(_where)
        # what Ray reserved in each bundle: the node, its physical GPU ids, a free port there
        if kind == "cuda":
            where = ray.get([probe.options(scheduling_strategy=strategy(b), num_gpus=1).remote()
                             for b in range(len(plan.resources))], timeout=120)
            gpus = list(dict.fromkeys(d for devs in (*placement.learner, *(e for es in placement.pools.values()
                                                                             for e in es)) for d in devs))
            physical = {d: where[i][1][0] for i, d in enumerate(gpus)}
            nodes = {d: where[i][0] for i, d in enumerate(gpus)}
        else:
            where = {plan.slot_bundle[0]: ray.get(probe.options(scheduling_strategy=strategy(plan.slot_bundle[0]))
                                                  .remote(), timeout=120)}
            physical, nodes = {}, {}
        # which pools share a device with the learner: same node, same physical GPU (or core)
        self.shared = shared_devices(placement, (lambda d: (nodes[d], physical[d])) if kind == "cuda" else None)

        def devices(devs: Sequence[int], who: str) -> list[Any]:
            if kind != "cuda":
                return list(devs)
            on = {nodes[d] for d in devs}
            if len(on) > 1:
                raise AgentrlError(f"{who} needs its GPUs {list(devs)} on one node, but Ray reserved them on {sorted(on)}; "
                                   "give each node a multiple of engine.sglang.tp_size GPUs")
            return [physical[d] for d in devs]

        # the run's token reaches every actor explicitly: Ray may have been started before the run set it
        token = env_token()
        actor_env = {"runtime_env": {"env_vars": {TOKEN_ENV: token}}} if token else {}

        def resources(slot: int) -> dict[str, Any]:
            return {"scheduling_strategy": strategy(plan.slot_bundle[slot]), **plan.slot_resources[slot], **actor_env}

        engine_slots = [(pool, devs) for pool, engines in placement.pools.items() for devs in engines]
        remote_host = ray.remote(host_cls)
        releasing = release_pools(config.engine.release_memory, kind, self.shared)
        for j, (pool, devs) in enumerate(engine_slots):
            slot = len(placement.learner) + j
            extra = {"release_memory": True} if pool in releasing else {}
            if self.hosts.get(pool):  # the pool's engine number k > 0 (probes in tests take no index)
                extra["index"] = len(self.hosts[pool])
            host = remote_host.options(**resources(slot)).remote(
                kind, devices(devs, f"engine {j} of pool {pool!r}"), config, str(run_dir / "logs"), **extra)
            self.hosts.setdefault(pool, []).append(host)
        self.urls: dict[str, list[str]] = {}
        self.host_of: dict[str, Any] = {}  # engine url -> the host actor that runs it
        self.model_path = model_path
        startup = config.engine.sglang.startup_timeout if config.engine.driver == "sglang" else 300.0
        launches = {pool: [h.launch.remote(pool, model_path) for h in hosts] for pool, hosts in self.hosts.items()}

        # learner rank 0 hosts the torch.distributed rendezvous and the weight-update group: its node
        address, _, port = where[plan.slot_bundle[0]]
        remote_rank = ray.remote(learner_cls)
        world = len(placement.learner)

        def start_ranks() -> None:
            self.ranks = [
                remote_rank.options(**resources(i)).remote(
                    i, world, (address, port), devices(devs, f"learner rank {i}"), kind, model_path, config)
                for i, devs in enumerate(placement.learner)
            ]

        # On separate devices the learner loads its model while the engines start (`agentrl
        # train`'s set-up on 2 CPU cores: 20.8 s -> 13.3 s); on shared ones (colocated sync) it
        # waits, so each engine sizes its memory before the learner takes any.
        learner_devices = {d for devs in placement.learner for d in devs}
        colocated = any(learner_devices & set(devs) for _, devs in engine_slots)
        if not colocated:
            start_ranks()
        for pool, refs in launches.items():
            self.urls[pool] = []
            for host, urls in zip(self.hosts[pool], ray.get(refs, timeout=startup + 60), strict=True):
                urls = [u.rstrip("/") for u in urls]
                self.urls[pool] += urls
                self.host_of.update(dict.fromkeys(urls, host))
        self.ranks_per_engine = {pool: ray.get(hosts[0].ranks_per_engine.remote(), timeout=60)
                                 for pool, hosts in self.hosts.items()}

        if colocated:
            start_ranks()
        ray.get([r.ready.remote() for r in self.ranks], timeout=startup + 60)
        self.learner = LearnerGroup(self.ranks)
        self.learner_address = address

    async def relaunch(self, pool: str, url: str) -> str:
        """Restart the engine behind ``url`` in its bundle; returns the new engine's URL."""
        host = self.host_of.pop(url.rstrip("/"))
        new_urls = [u.rstrip("/") for u in await host.relaunch.remote(pool, self.model_path)]
        self.urls[pool] = [u for u in self.urls[pool] if u != url.rstrip("/")] + new_urls
        self.host_of.update(dict.fromkeys(new_urls, host))
        return new_urls[0]

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
