"""``agentrl train``: the training loop, asynchronous (the paper's design) or synchronous.

One step, read top to bottom in :meth:`Trainer._step`:

    batch   = await buffer.get(...)                 # whole groups (1.7x on the first async step)
    adv     = estimator + normalizers               # GRPO, then e.g. task normalization
    metrics = learner ranks .train_step(samples)    # reference log-probs, dual-clip PPO, AdamW
    sync    = pools due (current: every step; stale: every stale_step)
    log, validate, checkpoint

In ``async`` mode the rollout manager keeps generating on its own devices while the
learner trains (rollout never stops; engines pause only while new weights arrive, and the
turns in flight continue under the new weights: ``rollout.partial_rollouts``). In ``sync``
mode all devices generate one batch, then train, then sync. See docs/architecture.md
section 6.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import signal
import threading
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import attrs
import yaml

from agentrl_core.config import Config, config_to_dict
from agentrl_core.errors import AgentrlError, ConfigError
from agentrl_core.jobs.progress import EpisodeProgress, TrainProgress, where_to_look
from agentrl_core.registry import Registry
from agentrl_core.train.engine_watch import EngineWatchdog
from agentrl_core.train.rollout_manager import RolloutManager, default_max_consecutive_drops, warmup_minimum
from agentrl_core.train.step_metrics import (
    batch_metrics,
    lag_histogram,
    pool_busy_metrics,
    rollout_waste_metrics,
    sample_rollouts,
)
from agentrl_core.types import (
    AgentLoopSpec,
    LoggerSpec,
    SamplerSpec,
    ToolParserSpec,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


class Trainer:
    def __init__(self, config: Config, *, resume: bool = False, registry: Registry | None = None,
                 echo: Any = print) -> None:
        self.config = config
        self.registry = registry or Registry()
        self.resume = resume
        self.echo = echo
        self.run_dir = config.run.dir
        self.step = 0
        self.stop_requested = False  # first SIGINT/SIGTERM: finish cleanly after this step
        self.aborted = False  # second signal: tear down now
        self._wait_scope: anyio.CancelScope | None = None
        self._waiting: tuple[float, int] | None = None  # while the learner waits for rollouts: (since, groups needed)
        self.history: list[dict[str, Any]] = []
        self.progress: TrainProgress | None = None
        self.store: Any = None  # the trajectory store (train.trajstore), when logging.trajectory_store
        self._engine_busy: dict[str, tuple[float, float]] = {}
        self._said_no_signal = False  # the note on a step with no learning signal is said once a run
        self._validate_config()

    # -- set-up ---------------------------------------------------------------------------

    def _validate_config(self) -> None:
        c = self.config
        if not c.model.path:
            raise ConfigError("model.path is empty: point it at a Hugging Face model directory "
                              "(agentrl model init --out DIR makes a tiny one)")
        if not c.tasks:
            raise ConfigError("no training tasks: set tasks, e.g. [{env: calc, split: train}]")
        if c.agent.name is not None and c.rollout.agent_loop != "chat":
            raise ConfigError(f"agent ({c.agent.name!r}) and rollout.agent_loop ({c.rollout.agent_loop!r}) both choose "
                              "how episodes are played; an agent program runs through the gateway: unset one of them")
        if c.rollout.dynamic_sampling.enabled and c.rollout.n_samples < 2:
            raise ConfigError("rollout.dynamic_sampling.enabled needs rollout.n_samples >= 2: a group of one sample "
                              "always has equal rewards, so every group would be filtered")
        if c.rollout.n_samples == 1 and c.advantage.estimator == "grpo":
            raise ConfigError("rollout.n_samples is 1 with advantage.estimator grpo: GRPO compares the samples of a "
                              "group, so a group of one has advantage 0 everywhere and nothing is learned; set "
                              "rollout.n_samples to 2 or more (the paper uses 8)")
        sampler = self.build_sampler()
        bound = c.rollout.staleness_bound
        minimum = getattr(sampler, "min_staleness_bound", lambda: None)()
        if bound is not None and minimum is not None and bound < minimum:
            raise ConfigError(
                f"rollout.staleness_bound={bound} is below {minimum} = stale_step + 2, the lag the "
                f"{c.sampler.name!r} sampler's stale pool needs by design; raise it or unset it"
            )
        if c.model.lora.enabled and c.engine.driver == "sglang":
            from agentrl_core.train.adapter_sync import adapter_versions_kept

            kept = adapter_versions_kept(bound)
            if kept > c.engine.sglang.max_loras:  # SGLang refuses a load with --max-loaded-loras (max_loras + 1) registered
                raise ConfigError(f"engine.sglang.max_loras={c.engine.sglang.max_loras} is too small for model.lora: the "
                                  f"learner keeps {kept} adapter versions loaded (rollout.staleness_bound + 1, at least "
                                  f"2), and SGLang loads a new one only below max_loras + 1 registered; set engine.sglang.max_loras to {kept} or more")

    def build_sampler(self) -> Any:
        c = self.config
        return self.registry.build(SamplerSpec, c.sampler.name, c.sampler.options.get(c.sampler.name))

    def write_config(self) -> Path:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / "config.yaml"
        path.write_text(yaml.safe_dump(config_to_dict(self.config), sort_keys=False))
        return path

    def run(self) -> dict[str, Any]:
        """Set up every process, train, tear everything down; returns the final summary.

        The run has one token (``AGENTRL_TOKEN``, generated unless the user set one): every
        process it starts inherits it (Ray actors through ``runtime_env``), every service
        requires it and every client sends it (:mod:`agentrl_core.http.auth`).
        """
        from agentrl_core.http.auth import run_token

        with run_token():
            return self._run()

    def _run(self) -> dict[str, Any]:
        from agentrl_core.controlplane.embedded import EmbeddedControlPlane
        from agentrl_core.launch.placement import plan_placement
        from agentrl_core.launch.ray_pools import RayPools, init_ray

        c = self.config
        config_path = self.write_config()
        self.echo(f"run folder: {self.run_dir} (metrics.jsonl, trajectories.sqlite, logs/)")
        sampler = self.build_sampler()
        self.pool_specs = sampler.pools()
        kind, devices = self.devices()
        placement = plan_placement(
            devices, self.pool_specs, kind=kind, mode=c.train.mode, rollout_ratio=c.engine.rollout_ratio,
            learner_ranks=c.train.world_size, engines_per_pool=c.engine.num_engines,
            tp_size=c.engine.sglang.tp_size if c.engine.driver == "sglang" else 1,
        )
        self.echo(f"placement: {placement.describe()}")
        self._plan_colocation(placement)
        control = None
        pools = None
        self.gateway_process = None
        t0 = time.monotonic()
        try:
            url = c.controller.url
            if url is None:
                tasks = [*c.tasks, *c.train.eval_tasks]
                control = EmbeddedControlPlane(tasks, c.controller, run_dir=self.run_dir, config_path=config_path)
                url = control.start()
            init_ray(c, num_cpus=len(devices) if kind == "cpu" else None)
            pools = RayPools(placement, c, model_path=c.model.path, run_dir=self.run_dir)
            if c.agent.name is not None:  # an agent program: it reaches the engines through the gateway
                from agentrl_core.gateway.process import GatewayProcess

                self.gateway_process = GatewayProcess(config_path, pools.urls, log_path=self.run_dir / "logs" / "gateway.log")
                self.echo(f"gateway for agent program {c.agent.name!r} at {self.gateway_process.start()}")
            self.echo(f"set-up done in {time.monotonic() - t0:.1f} s (controller {url}, engines {pools.urls}, "
                      f"learner rank 0 at {pools.learner_address})")
            try:
                summary = anyio.run(self._main, url, pools, sampler)
            except Exception as exc:  # task groups wrap errors: report ours as the one sentence it is
                inner = _single_error(exc)
                if inner is not exc and isinstance(inner, AgentrlError):
                    raise inner from None
                raise
            if self.aborted:
                raise KeyboardInterrupt
            return summary
        finally:
            if self.gateway_process is not None:
                self.gateway_process.stop()
            if pools is not None:
                pools.shutdown()
            if control is not None:
                control.stop()

    def _plan_colocation(self, placement: Any) -> None:
        """Say (and check) how weights reach the pools that share a device with the learner, and
        which pools release their memory while it trains (docs/architecture.md section 6)."""
        from agentrl_core.launch.placement import release_pools, shared_devices
        from agentrl_core.train.weight_sync import WeightSyncError, choose_backend

        c = self.config
        shared = shared_devices(placement)
        if c.weight_sync.transport == "collective":
            for pool, where in shared.items():
                try:
                    backend, why = choose_backend(c.weight_sync.backend, cuda=placement.kind == "cuda",
                                                  shared_device=where["rank0"], pool=f"pool {pool!r}")
                except WeightSyncError as exc:
                    raise ConfigError(str(exc)) from None
                self.echo(f"weight sync to {pool}: collective over {backend} ({why})")
        self.release_pools = release_pools(c.engine.release_memory, placement.kind, shared)
        if self.release_pools:
            self.echo(f"engines of {', '.join(self.release_pools)} release their memory while the learner trains "
                      f"(engine.release_memory: {c.engine.release_memory})")

    def devices(self) -> tuple[str, list[int]]:
        """The device kind and the devices to place on: this machine's, or on a Ray cluster the
        cluster's GPUs (the driver may run on a node without any)."""
        from agentrl_core.launch.placement import available_devices

        c = self.config
        if c.launch.address and c.train.device != "cpu":
            import ray

            from agentrl_core.launch.ray_pools import init_ray

            init_ray(c)
            gpus = int(ray.cluster_resources().get("GPU", 0))
            if c.train.device == "cuda" or gpus:
                return "cuda", list(range(gpus))[: c.launch.num_gpus or None]
        kind = _device_kind(c.train.device)
        return kind, available_devices(kind, c.launch.num_gpus if kind == "cuda" else c.launch.num_cpus)

    # -- the loop ---------------------------------------------------------------------------

    async def _main(self, url: str, pools: Any, sampler: Any) -> dict[str, Any]:
        from agentrl_core.controlplane.client import ControllerClient
        from agentrl_core.rollout.agent_loop import LoopSettings
        from agentrl_core.rollout.engine_client import LORA_SERVED_NAME, EnginePool
        from agentrl_core.rollout.tokenizer import load_tokenizer
        from agentrl_core.train.advantages import build_advantage_fns
        from agentrl_core.train.task_stream import StreamTask, TaskStream

        c = self.config
        self.pools = pools
        self.learner_lock = anyio.Lock()  # one learner call at a time: ranks must see the same order
        self.tokenizer = load_tokenizer(c.model.path, c.model)
        shared = getattr(pools, "shared", {})
        await self._bounded(pools.learner.connect(pools.urls, pools.learner_address, pools.ranks_per_engine,
                                                  {p: s["rank0"] for p, s in shared.items()}),
                            what="forming the weight-update groups")
        async with ControllerClient(url) as client:
            self.client = client
            # model.lora: every request runs with the served adapter, the newest policy@vN at its admission
            lora = LORA_SERVED_NAME if c.model.lora.enabled else None
            self.engine_pools = {name: EnginePool(name, urls, timeout=c.engine.request_timeout,
                                                  health_timeout=c.engine.health_timeout, lora=lora)
                                 for name, urls in pools.urls.items()}
            self.engine_memory = self._engine_memory()
            self.watchdog = EngineWatchdog(self.engine_pools, restart=self._restart_engine,
                                           interval=c.engine.health_check_interval,
                                           unhealthy_checks=c.engine.unhealthy_checks, max_restarts=c.engine.max_restarts)
            tasks = [StreamTask.from_config(t, await client.get_indices(t.task_name)) for t in c.tasks]
            from agentrl_core.eval.runner import task_indices

            for task in c.train.eval_tasks:  # a wrong index fails now, not at the first validation steps later
                await task_indices(client, task)
            self.stream = TaskStream(tasks, c.rollout.n_samples, seed=c.run.seed)
            await self._maybe_resume()
            self.metrics_out = self._loggers()
            self.store = self._open_store()
            sync = await self._bounded(pools.learner.sync([p.name for p in self.pool_specs], self.step),
                                       what="the initial weight sync")
            self.echo(f"initial weights synced to {', '.join(p.name for p in self.pool_specs)} "
                      f"({sync.get('weight_sync/current/seconds', 0.0):.2f} s)")
            settings = LoopSettings.from_rollout_config(c.rollout)
            self.gateway = None
            if self.gateway_process is not None:
                agent_loop = self._agent_program_loop(client)
            else:
                agent_loop = self.registry.build(
                    AgentLoopSpec, c.rollout.agent_loop, c.rollout.agent_loop_options or None,
                    tokenizer=self.tokenizer, env_client=client,
                    pools=self.engine_pools, sampler=sampler,
                    tool_parser=self.registry.build(ToolParserSpec, c.model.tool_parser),
                    settings=settings, seed=c.run.seed, global_step=lambda: self.step,
                )
            self.sampler = sampler
            self._build_rollout(agent_loop)
            self.estimator, self.normalizers = build_advantage_fns(c.advantage, self.registry)
            try:
                self.progress = TrainProgress(c.train.total_steps, self._snapshot, echo=self.echo) \
                    if c.logging.progress else None
                summary: dict[str, Any] = {}  # set by _finish; an aborted run raises instead
                async with anyio.create_task_group() as watch:
                    watch.start_soon(self.watchdog.run)
                    if threading.current_thread() is threading.main_thread():
                        watch.start_soon(self._watch_signals, watch.cancel_scope)
                    if self.progress is not None:
                        watch.start_soon(self.progress.run)
                    if c.logging.stall_report > 0:
                        watch.start_soon(self._report_stalls, c.logging.stall_report)
                    if c.train.mode == "async":
                        await self._run_async()
                    else:
                        await self._run_sync()
                    summary = await self._finish()
                    watch.cancel_scope.cancel()
            finally:
                for pool in self.engine_pools.values():
                    await pool.aclose()
                if self.gateway is not None:
                    await self.gateway.aclose()
                for logger in self.metrics_out:
                    logger.close()
                if self.store is not None:
                    self.store.close()
        return summary

    def _engine_memory(self) -> Any:
        """The release/resume of the colocated pools' engine memory (None when no pool releases)."""
        from agentrl_core.train.engine_memory import EngineMemory

        names = getattr(self, "release_pools", [])
        if not names:
            return None
        return EngineMemory({n: self.engine_pools[n] for n in names}, partial_rollouts=self.config.rollout.partial_rollouts,
                            adapters=self.config.model.lora.enabled)

    def _build_rollout(self, agent_loop: Any) -> None:
        """The buffer and the rollout manager that fills it (``self.stream`` is set)."""
        from agentrl_core.train.buffer import GroupBuffer

        c = self.config
        batch_traj = c.rollout.batch_size * c.rollout.n_samples
        dynamic = c.rollout.dynamic_sampling
        self.buffer = GroupBuffer(c.rollout.n_samples, max(batch_traj, math.ceil(c.rollout.buffer_max_factor * batch_traj)),
                                  max_infra_retries=c.rollout.max_infra_retries,
                                  filter_equal_rewards=dynamic.enabled, fallback=dynamic.fallback,
                                  max_extra_groups=dynamic.max_extra_groups(c.rollout.batch_size))
        self.agent_loop = agent_loop
        self.manager = RolloutManager(
            agent_loop=agent_loop, buffer=self.buffer, stream=self.stream, concurrency=c.rollout.concurrency,
            batch_groups=c.rollout.batch_size, staleness_bound=c.rollout.staleness_bound,
            learner_step=lambda: self.step,
            max_consecutive_drops=c.rollout.max_consecutive_dropped_groups or default_max_consecutive_drops(
                c.rollout.batch_size, c.rollout.concurrency, c.rollout.n_samples),
        )

    def _agent_program_loop(self, env_client: Any) -> Any:
        """The gateway-backed agent loop that runs ``agent``'s program (docs/architecture.md section 5)."""
        from agentrl_core.gateway.client import GatewayClient
        from agentrl_core.gateway.loop import GatewayAgentLoop, load_program

        c = self.config
        assert self.gateway_process is not None and self.gateway_process.url is not None
        self.gateway = GatewayClient(self.gateway_process.url)
        program = load_program(c.agent.name, registry=self.registry, options=c.agent.options.get(c.agent.name))
        return GatewayAgentLoop(program=program, gateway=self.gateway, env_client=env_client,
                                incomplete_punishment=c.rollout.incomplete_punishment,
                                timeout=c.gateway.max_duration, threads=c.agent.threads,
                                options=c.agent.options.get(c.agent.name))

    async def _run_async(self) -> None:
        c = self.config
        batch = c.rollout.batch_size * c.rollout.n_samples
        first = True
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._produce, tg.cancel_scope)
            while self.step < c.train.total_steps and not self.stop_requested:
                t0 = time.monotonic()
                minimum = warmup_minimum(batch, c.rollout.warmup_factor, c.rollout.n_samples) if first else batch
                self._waiting = (t0, minimum // c.rollout.n_samples)
                with anyio.CancelScope() as self._wait_scope:
                    trajectories = await self.buffer.get(minimum)
                self._waiting = None
                if self._wait_scope.cancel_called:
                    break
                first = False
                await self._step(trajectories, wait_s=time.monotonic() - t0)
                self.manager.notify_step()
            tg.cancel_scope.cancel()
        self.buffer.close()
        if self.manager.circuit_error is not None:
            raise self.manager.circuit_error

    async def _produce(self, learner_scope: anyio.CancelScope) -> None:
        """The rollout manager beside the learner; when its circuit opens, the learner stops waiting too."""
        from agentrl_core.train.rollout_manager import RolloutCircuitOpen

        try:
            await self.manager.run_forever()
        except RolloutCircuitOpen:
            learner_scope.cancel()  # _run_async raises it once the task group is done

    async def _run_sync(self) -> None:
        c = self.config
        while self.step < c.train.total_steps and not self.stop_requested:
            t0 = time.monotonic()
            self._waiting = (t0, c.rollout.batch_size)
            with anyio.CancelScope() as self._wait_scope:  # groups cut short are issued again on resume
                await self.manager.run_batch(c.rollout.batch_size)
            self._waiting = None
            if self._wait_scope.cancel_called:
                break
            # every ready group (dynamic sampling's rounds may bring a few more useful ones than the
            # batch); short of the batch after those rounds, the fallback fills it
            trajectories = self.buffer.take_ready(c.rollout.batch_size * c.rollout.n_samples)
            if not trajectories:
                log.warning("every group of this batch was dropped (infrastructure failures); generating again")
                continue
            await self._step(trajectories, wait_s=time.monotonic() - t0)

    async def _step(self, trajectories: list[Any], *, wait_s: float) -> None:
        from agentrl_core.train.advantages import compute_advantages
        from agentrl_core.train.batching import train_samples
        from agentrl_core.train.weight_sync import pools_due

        c = self.config
        t0 = time.monotonic()
        adv = compute_advantages(trajectories, self.estimator, self.normalizers,
                                 {t.task_name: t.reward_scale for t in c.tasks if t.reward_scale != 1.0})
        samples = train_samples(trajectories, adv.advantages)
        learning_signal = float(adv.advantages.abs().sum()) > 0.0
        if not learning_signal and not self._said_no_signal:
            self._said_no_signal = True
            self.echo(no_signal_note(trajectories, self.step + 1))
        t_adv = t_advantages = time.monotonic()
        token_logprobs = None
        memory = getattr(self, "engine_memory", None)  # colocated engines give their memory back meanwhile
        memory_metrics: dict[str, float] = {}
        async with contextlib.AsyncExitStack() as held:
            if memory is not None:  # no health probes while the engines are paused and released
                await held.enter_async_context(self.watchdog.suspended())
                memory_metrics.update(await memory.release([p.name for p in pools_due(self.pool_specs, self.step + 1)]))
                t_adv = time.monotonic()  # the learner's time starts once the engines made room
            async with self.learner_lock:
                learner_metrics = await self.pools.learner.train_step(samples)
                t_train = time.monotonic()
                if self.store is not None:  # the learner's log-probs of this step's loss tokens, for the store
                    token_logprobs = await self.pools.learner.take_token_logprobs()
            t_fetch = time.monotonic() - t_train
            if memory is not None:
                memory_metrics.update(await memory.resume())
            version = self.step  # the weights being updated; the batch's lag is measured against them
            self.step += 1
            trained = sorted({t.group_id for t in trajectories})
            self.stream.mark_done(trained)
            self.stream.mark_done(self.buffer.take_spent())  # filtered by dynamic sampling, never to be trained
            with open(self.run_dir / "trained_groups.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": self.step, "groups": trained}) + "\n")
            for gid in self.manager.take_dropped():
                log.info("group %s was dropped after repeated infrastructure failures", gid)
            due = [p.name for p in pools_due(self.pool_specs, self.step)]
            sync_metrics = await self._sync(due) if due else {}
            if memory is not None:
                await memory.continue_unsynced(due)
            sync_metrics.update(memory_metrics)
        t_sync = time.monotonic()
        metrics: dict[str, Any] = {
            "step": self.step,
            "advantage/nonzero": float(learning_signal),
            "engine/restarts": float(self.watchdog.restarts),
            **batch_metrics(trajectories, version),
            # action tokens per version lag; what weight syncs cut, kept and threw away
            **{f"version_lag/tokens/{lag}": float(n) for lag, n in lag_histogram(trajectories, version).items()},
            **rollout_waste_metrics(trajectories),
            **{f"learner/{k}": v for k, v in learner_metrics.items()},
            **sync_metrics,
            **self.manager.metrics(),
            **self.buffer.stats().as_metrics(),
            **(self.buffer.last_take.as_metrics() if self.buffer.last_take is not None else {}),
            **await self._engine_metrics(),
            "time/wait_rollout_s": wait_s,
            "time/advantages_s": t_advantages - t0,
            "time/train_s": t_train - t_adv,
            "time/sync_s": t_sync - t_train - t_fetch - memory_metrics.get("time/engine_resume_s", 0.0),
            "time/step_s": wait_s + (t_sync - t0),
            "trained_tokens_per_s": learner_metrics.get("num_tokens", 0.0) / max(wait_s + (t_sync - t0), 1e-9),
        }
        for normalizer in self.normalizers:
            metrics.update(getattr(normalizer, "metrics", dict)())
        metrics.update(getattr(self.sampler, "metrics", lambda *_: {})(trajectories, version))
        if self.store is not None:
            metrics.update(await self._store_step(trajectories, adv.advantages, token_logprobs, metrics, t_fetch))
        self._log(metrics, trajectories)
        if c.train.eval_every and self.step % c.train.eval_every == 0 and c.train.eval_tasks:
            self._log({"step": self.step, **await self.validate()}, [])
        if c.train.checkpoint_every and self.step % c.train.checkpoint_every == 0:
            await self.save_checkpoint()

    def _open_store(self) -> Any:
        from agentrl_core.train.trajstore import FILENAME, TrajectoryStore

        c = self.config
        if not c.logging.trajectory_store:
            return None
        store = TrajectoryStore(self.run_dir / FILENAME, run=c.run.name, max_steps=c.logging.trajectory_store_max_steps)
        if self.resume:
            store.truncate_after(self.step)  # the steps after the checkpoint are trained again
        return store

    async def _store_step(self, trajectories: list[Any], advantages: Any, token_logprobs: Any,
                          metrics: dict[str, Any], fetch_s: float) -> dict[str, float]:
        """Hand the step to the store's writer thread; the loop waits only when the writer is far behind."""
        t0 = time.monotonic()
        scalars = {k: v for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        queued = self.store.add_step(self.step, trajectories, advantages=advantages, learner_logprobs=token_logprobs,
                                     metrics=scalars, block=False)
        if not queued:
            await anyio.to_thread.run_sync(lambda: self.store.add_step(
                self.step, trajectories, advantages=advantages, learner_logprobs=token_logprobs, metrics=scalars))
        return {"time/trajectory_store_s": fetch_s + time.monotonic() - t0,
                "trajectory_store/write_s": self.store.take_write_seconds(),
                "trajectory_store/failed": float(self.store.error is not None)}

    def _snapshot(self) -> dict[str, Any]:
        stats = self.buffer.stats()
        return {"episodes": sum(self.manager.statuses.values()), "in_flight": self.manager.in_flight,
                "ready": stats.ready_trajectories, "pending": stats.pending_trajectories}

    # -- weight sync and engine failures ----------------------------------------------------------

    sync_margin_s = 30.0

    async def _bounded(self, call: Awaitable[T], *, what: str) -> T:
        """A weight-sync call on the learner ranks, within twice ``weight_sync.timeout_s`` (rank 0's
        transport keeps its own deadline; a collective stuck past it gets the group's timeout once
        more) plus a margin; past it the run stops with an error instead of hanging."""
        limit = 2 * self.config.weight_sync.timeout_s + self.sync_margin_s
        try:
            with anyio.fail_after(limit):
                return await call
        except TimeoutError:
            raise WeightSyncTimeout(f"{what} did not finish within {limit:g} s (2 x weight_sync.timeout_s + "
                                    f"{self.sync_margin_s:g} s); a learner rank or an engine is stuck: see the run's "
                                    "logs/") from None

    async def _sync(self, pool_names: list[str]) -> dict[str, float]:
        """Push the current weights to ``pool_names``; a dead engine is restarted and the sync retried."""
        what = f"the weight sync of step {self.step} to {', '.join(pool_names)}"
        await self._gateway_call("pause")
        try:
            async with self.watchdog.suspended(), self.learner_lock:
                return await self._bounded(self.pools.learner.sync(pool_names, self.step), what=what)
        except WeightSyncTimeout:
            raise
        except Exception as exc:
            log.warning("weight sync to %s failed (%s); checking the engines", pool_names, exc)
            # the pool was left paused: ask whether the engines live (not /health, which would
            # wait on the pause), restart the dead ones, then one more try
            await self.watchdog.check(checks_needed=1, probe="alive")
            async with self.watchdog.suspended(), self.learner_lock:
                return await self._bounded(self.pools.learner.sync(pool_names, self.step), what=what)
        finally:
            await self._gateway_call("resume", self.step)

    async def _gateway_call(self, method: str, *args: Any) -> None:
        """Tell the gateway (if any) about a weight update or new engines; it copes without being told."""
        if getattr(self, "gateway", None) is None:
            return
        try:
            with anyio.fail_after(30):
                await getattr(self.gateway, method)(*args)
        except Exception as exc:
            log.warning("the gateway did not take %s: %s", method, exc)

    async def _restart_engine(self, name: str, url: str) -> str:
        """Relaunch a dead engine in its bundle, swap it into its pool, and give it the current weights."""
        new_url = await self.pools.relaunch(name, url)
        self.engine_pools[name].replace_engine(url, new_url)
        await self._gateway_call("set_pools", {n: p.urls for n, p in self.engine_pools.items()})
        async with self.watchdog.suspended(), self.learner_lock:
            await self._bounded(self.pools.learner.connect({name: self.pools.urls[name]}, self.pools.learner_address,
                                                           self.pools.ranks_per_engine),
                                what=f"rejoining pool {name} to its weight-update group")
            await self._bounded(self.pools.learner.sync([name], self.step),
                                what=f"the weight sync to the restarted engine of {name}")
        self.echo(f"engine {url} of pool {name} restarted as {new_url} with weights of step {self.step}")
        return new_url

    # -- metrics, validation, checkpoints -------------------------------------------------------

    def _loggers(self) -> list[Any]:
        options = self.config.logging.options
        return [self.registry.build(LoggerSpec, name, options.get(name), run_dir=self.run_dir)
                for name in self.config.logging.loggers]

    def _log(self, metrics: dict[str, Any], trajectories: list[Any]) -> None:
        if trajectories and self.config.logging.sample_rollouts:
            samples = sample_rollouts(trajectories, self.tokenizer, self.config.logging.sample_rollouts)
            with open(self.run_dir / "samples.jsonl", "a", encoding="utf-8") as f:
                for s in samples:
                    f.write(json.dumps({"step": self.step, **s}, ensure_ascii=False) + "\n")
        scalars = {k: v for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        for logger in self.metrics_out:
            logger.log(self.step, scalars)
        self.history.append(scalars)
        if self.progress is not None and "step" in scalars and any(k.startswith("task/") for k in scalars):
            self.progress.step(scalars)
        validation = {k.split("/")[1]: v for k, v in scalars.items() if k.startswith("val/") and k.endswith("/success")}
        if validation:
            self.echo(f"validation at step {self.step}: " + ", ".join(f"{t} {v:.3f}" for t, v in validation.items()))

    async def _engine_metrics(self) -> dict[str, float]:
        """How busy each pool's engines were since the last step (``pool_busy_metrics``)."""
        out: dict[str, float] = {}
        for name, pool in self.engine_pools.items():
            readings = {}
            for url, engine in list(pool.engines.items()):
                try:
                    readings[url] = await engine.busy(timeout=self.config.engine.health_timeout)
                except Exception as exc:  # an engine that died shows up as failures elsewhere
                    log.warning("engine %s: %s", url, exc)
            out.update(pool_busy_metrics(name, readings, self._engine_busy))
        return out

    async def validate(self) -> dict[str, float]:
        """Evaluate the current pool on ``train.eval_tasks`` (one repeat)."""
        from agentrl_core.eval.metrics import EpisodeResult, summarize
        from agentrl_core.eval.runner import build_requests, make_token_players, run_requests

        c = self.config
        eval_config = attrs.evolve(c, eval=attrs.evolve(c.eval, tasks=c.train.eval_tasks, repeats=1))
        play = make_token_players(eval_config, registry=self.registry, tokenizer=self.tokenizer, env_client=self.client,
                                  pools={"current": self.engine_pools["current"]}, mode="single")
        requests = await build_requests(self.client, c.train.eval_tasks, 1, ["current"], "single")
        results: list[EpisodeResult] = []
        played: list[Any] = []

        def keep(item: Any, result: dict[str, Any]) -> None:
            r = item.request
            results.append(EpisodeResult(r.task, r.index, 0, float(result["reward"]), str(result["status"]),
                                         int(result["turns"])))
            if result.get("trajectory") is not None:
                played.append(result["trajectory"])

        progress = EpisodeProgress("validation", echo=self.echo, live=False) if c.logging.progress else None
        await run_requests(requests, play, concurrency=c.eval.concurrency, on_result=keep, progress=progress)
        if self.store is not None and played:
            await anyio.to_thread.run_sync(lambda: self.store.add_episodes(played, kind="validation", step=self.step))
        self.last_validation = summarize(results)
        out = {}
        for task, s in self.last_validation.items():
            out[f"val/{task}/success"] = s.success_mean
            out[f"val/{task}/reward"] = s.reward_mean
            out[f"val/{task}/infra_failures"] = float(s.infra_failures)
        return out

    async def save_checkpoint(self) -> None:
        state = {"task_stream": self.stream.state_dict(), "config_name": self.config.run.name}
        async with self.learner_lock:
            path = await self.pools.learner.save_checkpoint(str(self.run_dir / "checkpoints"), state,
                                                            self.config.train.keep_checkpoints,
                                                            self.config.train.save_hf_model)
        self.echo(f"checkpoint {path}")

    async def _maybe_resume(self) -> None:
        from agentrl_core.train.checkpoint import latest_checkpoint

        if not self.resume:
            return
        path = latest_checkpoint(self.run_dir / "checkpoints")
        if path is None:
            raise AgentrlError(f"--resume: no checkpoint under {self.run_dir / 'checkpoints'}")
        state = await self.pools.learner.load_checkpoint(str(path))
        self.stream.load_state_dict(state["task_stream"])
        self.step = int(state["step"])
        _truncate_log(self.run_dir / "trained_groups.jsonl", self.step)  # steps after it were lost with the kill
        self.echo(f"resumed from {path} at step {self.step}; {len(self.stream.outstanding)} groups re-issued first")

    async def _report_stalls(self, every: float) -> None:
        """While the learner has waited ``every`` seconds for rollouts, log what is in flight; again each ``every``."""
        current, reports = None, 0
        while True:
            await anyio.sleep(min(every / 4, 5.0))
            waiting = self._waiting
            if waiting != current:
                current, reports = waiting, 0
            if waiting is None:
                continue
            waited = time.monotonic() - waiting[0]
            if waited >= every * (reports + 1):
                reports += 1
                log.warning("%s", stall_report(self.step + 1, self.config.train.total_steps, waited, waiting[1],
                                               self.manager, self.buffer))

    async def _watch_signals(self, scope: anyio.CancelScope) -> None:
        """Ctrl-C or SIGTERM once: stop after the current step, checkpoint, save, exit. Twice: abort now."""
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                if not self.stop_requested:
                    self.stop_requested = True
                    if self._wait_scope is not None:
                        self._wait_scope.cancel()  # waiting for rollouts: stop waiting; a running step completes
                    self.echo(f"\n{name}: stopping after the current step (a checkpoint and the final model are "
                              "still written); send it again to abort at once")
                else:
                    self.echo(f"\n{name} again: aborting without saving")
                    self.aborted = True
                    scope.cancel()
                    return

    async def _finish(self) -> dict[str, Any]:
        c = self.config
        interrupted = self.stop_requested and self.step < c.train.total_steps
        if interrupted:
            self.echo(f"stopped at step {self.step} of {c.train.total_steps}")
        if c.train.checkpoint_every and self.step % c.train.checkpoint_every:
            await self.save_checkpoint()
        final_model = None
        if c.train.final_model or c.train.save_hf_model:
            async with self.learner_lock:
                final_model = await self.pools.learner.save_hf_model(str((self.run_dir / "final_model").resolve()))
        summary: dict[str, Any] = {"steps": self.step, "final_model": final_model, "interrupted": interrupted}
        if c.train.eval_tasks and not interrupted:
            summary["validation"] = await self.validate()
            from agentrl_core.eval.metrics import format_table

            self.echo("\nfinal validation (current weights):\n" + format_table(self.last_validation))
        self.echo("\ntraining, per task (the first and last steps whose batch held it):\n" + training_table(self.history))
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        if final_model:
            self.echo(f"\nthe trained policy (step {self.step}) is a Hugging Face folder: {final_model}\n"
                      f"evaluate it with: agentrl eval {self.run_dir}")
        self.echo("\n" + where_to_look(self.run_dir, store=self.store.path if self.store is not None else None,
                                       loggers=self.metrics_out, view_command=_has_view_command()))
        return summary


class WeightSyncTimeout(AgentrlError):
    """A weight-sync call on the learner ranks did not finish in time."""


def stall_report(step: int, total: int, waited: float, groups_needed: int, manager: Any, buffer: Any) -> str:
    """What a step that has waited long for rollouts is waiting on: the episodes in flight, by task and phase."""
    activity = manager.activity.describe()
    episodes = len(manager.activity.episodes)
    lines = [f"step {step} of {total} has waited {waited:.0f} s for rollouts: {buffer.ready_groups} of "
             f"{groups_needed} groups ready, "
             + (f"{episodes} episode{'s' * (episodes != 1)} in flight: {activity}" if episodes else
                "no episode in flight")]
    retries, dropped = int(manager.counters.get("infra_retries", 0)), manager.groups_dropped
    if retries or dropped:
        lines.append(f"so far {retries} episode{'s' * (retries != 1)} retried after infrastructure failures and "
                     f"{dropped} group{'s' * (dropped != 1)} dropped; the last failure: {manager.last_failure or 'unknown'}")
    lines.append("the workers' and engines' own logs say more (engines: <run dir>/logs/)")
    return "\n  ".join(lines)


def no_signal_note(trajectories: list[Any], step: int) -> str:
    """Why a step whose advantages are all zero learns nothing, and what to do about it."""
    rewards = sorted({t.training_reward for t in trajectories if t.training_reward is not None})
    same = (f"every episode got the same training reward ({rewards[0]:g})" if len(rewards) == 1
            else "the samples of every group got equal rewards")
    return (f"note: at step {step} {same}, so every advantage is 0 and the loss is 0: nothing is learned until "
            "some samples of a group succeed where others fail. A model that never succeeds (an untrained one) "
            "needs a warm-up first: `agentrl sft` on demonstrations (`agentrl demos` writes them from an "
            "environment's oracle), as the main job does in examples/quickstart.py. (Said once a run.)")


def _single_error(exc: BaseException) -> BaseException:
    """The one error inside nested single-member exception groups (task groups wrap what they raise)."""
    while isinstance(getattr(exc, "exceptions", None), tuple) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _truncate_log(path: Path, step: int) -> None:
    """Keep the records of steps up to ``step`` in a JSONL log (the others were not checkpointed)."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in kept))


def _has_view_command() -> bool:
    """Whether this install has ``agentrl view`` (the trajectory viewer) to point the user at."""
    import importlib.util

    return importlib.util.find_spec("agentrl_core.cli.view") is not None


def _device_kind(device: str) -> str:
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def training_table(history: list[dict[str, Any]]) -> str:
    """Per-task success and reward at the first and last training steps whose batch held the task.

    A task need not be in every batch (tasks are drawn by weight): its columns come from the steps
    that had it, named in the ``steps`` column, so no cell is empty.
    """
    steps = [h for h in history if any(k.startswith("task/") for k in h)]
    if not steps:
        return "(no training steps)"
    tasks = sorted({k.split("/")[1] for h in steps for k in h if k.startswith("task/")})
    rows = [["task", "steps", "success first", "success last", "reward first", "reward last"]]
    for t in tasks:
        had = [h for h in steps if f"task/{t}/success" in h]
        first, last = had[0], had[-1]
        span = f"{int(first.get('step', 0))}-{int(last.get('step', 0))}" if len(had) > 1 else f"{int(first.get('step', 0))}"
        rows.append([t, span, *[f"{h[f'task/{t}/success']:.3f}" for h in (first, last)],
                     *[f"{h.get(f'task/{t}/reward', float('nan')):.3f}" for h in (first, last)]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
