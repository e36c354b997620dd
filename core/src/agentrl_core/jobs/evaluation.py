"""One evaluation run: control plane, engines for each model, players, results.

Used by ``agentrl eval``. Models given by ``path`` get engines launched by the configured
driver (on CPU the cores are split between the models); models given by ``urls`` use
running engines. ``openai=`` evaluates an OpenAI-compatible endpoint instead.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import anyio

from agentrl_core.config import Config, EvalModelConfig
from agentrl_core.errors import ConfigError
from agentrl_core.eval.runner import (
    EvalRequest,
    ResultWriter,
    build_requests,
    eval_tasks,
    make_token_players,
    print_summaries,
    run_requests,
)
from agentrl_core.jobs.progress import EpisodeProgress
from agentrl_core.registry import Registry

log = logging.getLogger(__name__)


def engine_device_groups(device: str, parts: int) -> list[list[int]]:
    """The devices of each launched model's engine: GPU ids where ``engine.device`` resolves to
    CUDA (``auto`` with a GPU, ``cuda``, ``cuda:N``), else CPU cores, split into ``parts`` groups."""
    from agentrl_core.launch.placement import available_devices, split_devices
    from agentrl_core.rollout.drivers import resolve_device_kind

    return split_devices(available_devices(resolve_device_kind(device)), parts)


def tokenizer_source(config: Config) -> tuple[str, str]:
    """The folder whose tokenizer encodes the episodes of every evaluated model, and its config key.

    With ``eval.models`` that have paths, the first of them by name (a model's own folder: the
    config's ``model.path`` may be a training default that does not exist); otherwise
    ``model.path``, which must be set when every model is given by urls.
    """
    named = sorted((name, m.path) for name, m in config.eval.models.items() if m.path)
    if named:
        return named[0][1], f"eval.models.{named[0][0]}.path"
    if not config.model.path:
        raise ConfigError("set model.path to the tokenizer's directory when every model is given by urls")
    return config.model.path, "model.path"


class Evaluation:
    def __init__(self, config: Config, *, registry: Registry | None = None, out_dir: str | Path,
                 openai: dict[str, Any] | None = None, echo: Any = print) -> None:
        self.config = config
        self.registry = registry or Registry()
        self.out_dir = Path(out_dir)
        self.openai = openai
        self.echo = echo
        self.tasks = eval_tasks(config)
        models = dict(config.eval.models) or {"default": EvalModelConfig(path=config.model.path or None)}
        if openai is None:
            for name, m in models.items():
                if not m.path and not m.urls:
                    raise ConfigError(f"eval.models.{name} needs a path or urls (or set model.path)")
            if config.eval.mode != "single" and len(models) < 2:
                raise ConfigError(f"eval.mode {config.eval.mode!r} combines models: give at least two in eval.models")
        self.models = models
        self.drivers: list[Any] = []

    def run(self) -> dict[str, Any]:
        """Start what the evaluation needs and run it; the processes share the run's token (``AGENTRL_TOKEN``)."""
        from agentrl_core.http.auth import run_token

        with run_token():
            return self._run()

    def _run(self) -> dict[str, Any]:
        from agentrl_core.controlplane.embedded import EmbeddedControlPlane

        c = self.config
        control = None
        try:
            url = c.controller.url
            if url is None:
                self.out_dir.mkdir(parents=True, exist_ok=True)
                config_path = self._write_config()
                control = EmbeddedControlPlane(self.tasks, c.controller, run_dir=self.out_dir, config_path=config_path)
                url = control.start()
            urls = {} if self.openai else self._engines()
            return anyio.run(self._main, url, urls)
        finally:
            for driver in self.drivers:
                driver.shutdown()
            if control is not None:
                control.stop()

    def _write_config(self) -> Path:
        import yaml

        from agentrl_core.config import config_to_dict

        path = self.out_dir / "config.yaml"
        path.write_text(yaml.safe_dump(config_to_dict(self.config), sort_keys=False))
        return path

    def _engines(self) -> dict[str, list[str]]:
        from agentrl_core.rollout.drivers import build_engine_driver

        launch = {name: m for name, m in self.models.items() if not m.urls}
        urls = {name: list(m.urls) for name, m in self.models.items() if m.urls}
        if launch:
            groups = engine_device_groups(self.config.engine.device, len(launch))
            for i, (name, m) in enumerate(launch.items()):
                driver = build_engine_driver(self.config, registry=self.registry, log_dir=str(self.out_dir / "logs"))
                self.drivers.append(driver)
                urls[name] = driver.launch(name, m.path, [groups[i % len(groups)]])
        return urls

    async def _main(self, url: str, engine_urls: dict[str, list[str]]) -> dict[str, Any]:
        from agentrl_core.controlplane.client import ControllerClient

        c = self.config
        store = None
        if c.logging.trajectory_store:
            from agentrl_core.train.trajstore import FILENAME, TrajectoryStore

            store = TrajectoryStore(self.out_dir / FILENAME, run=c.run.name, max_steps=None, queue_steps=4096)
        writer = ResultWriter(self.out_dir, "single" if self.openai else c.eval.mode, store=store)
        t0 = time.monotonic()
        async with ControllerClient(url) as client:
            if self.openai:
                play, names, mode = await self._openai_player(client), ["openai"], "single"
            else:
                play, names, mode = await self._token_players(client, engine_urls), sorted(self.models), c.eval.mode
            requests = await build_requests(client, self.tasks, c.eval.repeats, names, mode)
            for line in self.describe_models():
                self.echo(line)
            self.echo(f"evaluating {len(requests)} episodes ({mode}, {c.eval.repeats} repeats, "
                      f"{len(self.tasks)} tasks, models {', '.join(names)})")
            await run_requests(requests, play, concurrency=c.eval.concurrency, on_result=writer.add,
                               progress=EpisodeProgress("eval"))
            await self._close()
        summaries = writer.close({"mode": mode, "repeats": c.eval.repeats, "seconds": time.monotonic() - t0})
        print_summaries(summaries, self.echo)
        for task, sources in sorted(writer.sources.items()):
            self.echo(f"{task} results from: {'; '.join(sorted(sources))}")
        self.echo(f"\ntrajectories and summary in {self.out_dir}"
                  + (f" (trajectory store: {store.path})" if store is not None else ""))
        return {m: {t: s.to_json() for t, s in ts.items()} for m, ts in summaries.items()}

    def describe_models(self) -> list[str]:
        """One line per evaluated model: its name and where its weights come from."""
        if self.openai:
            return [f"model openai: {self.openai['model']} at {self.openai['base_url']}"]
        lines = []
        for name, m in sorted(self.models.items()):
            where = ", ".join(m.urls) if m.urls else str(m.path)
            source = " (model.path)" if not self.config.eval.models else f" (eval.models.{name})"
            lines.append(f"model {name}: {where}{source}")
        return lines

    async def _token_players(self, client: Any, engine_urls: dict[str, list[str]]) -> Any:
        from agentrl_core.rollout.engine_client import EnginePool
        from agentrl_core.rollout.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(tokenizer_source(self.config)[0], self.config.model)
        self._pools = {name: EnginePool(name, urls) for name, urls in engine_urls.items()}
        return make_token_players(self.config, registry=self.registry, tokenizer=tokenizer, env_client=client,
                                  pools=self._pools, mode=self.config.eval.mode)

    async def _openai_player(self, client: Any) -> Any:
        from agentrl_core.rollout.openai_loop import OpenAIChatLoop

        c = self.config
        temperature = c.eval.temperature if c.eval.temperature is not None else c.rollout.temperature
        self._openai_loop = OpenAIChatLoop(
            base_url=self.openai["base_url"], model=self.openai["model"], api_key=self.openai.get("api_key"),
            env_client=client, max_turns=c.rollout.max_turns, temperature=temperature,
            max_tokens=c.rollout.max_new_tokens,
        )

        async def play(item: EvalRequest) -> dict[str, Any]:
            return await self._openai_loop.run(item.request)

        return play

    async def _close(self) -> None:
        for pool in getattr(self, "_pools", {}).values():
            await pool.aclose()
        loop = getattr(self, "_openai_loop", None)
        if loop is not None:
            await loop.aclose()

