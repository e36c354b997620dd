"""Opt-in pytest helpers for plugin authors (not auto-loaded).

Enable the fixtures in a ``conftest.py``::

    pytest_plugins = ["agentrl_core.testing"]

and check an environment against the contract::

    from agentrl_core.testing import check_environment

    def test_conformance():
        check_environment("calc", oracle_samples=3)

Helpers:

* fixtures ``agentrl_plugin_manager`` (a fresh manager with every installed plugin) and
  ``agentrl_registry``;
* :func:`register_plugin` to build a manager with an extra in-process plugin;
* :func:`temporary_distribution` to install a throw-away distribution with an ``agentrl``
  entry point on ``sys.path`` (for duplicate-name and broken-plugin tests);
* :func:`check_environment`, the conformance checker.

Submodules for core's own tests (imported explicitly, not by the fixtures above):

* :mod:`agentrl_core.testing.controlplane`: a controller and workers in this event loop
  (``local_control_plane``) or as ``agentrl`` child processes (``spawn``);
* :mod:`agentrl_core.testing.local_env`: ``LocalEnvClient``, the controller's
  start/interact/cancel over in-process environments.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs

from agentrl_core.env.tools import assistant_tool_call, tool_schema_errors
from agentrl_core.errors import SessionError
from agentrl_core.plugins import AgentrlPluginManager, get_plugin_manager
from agentrl_core.protocols import Environment
from agentrl_core.registry import Registry
from agentrl_core.types import EnvironmentSpec, Status

try:
    import pytest
except ImportError:  # pragma: no cover - the helpers below work without pytest
    pytest = None  # type: ignore[assignment]


if pytest is not None:

    @pytest.fixture
    def agentrl_plugin_manager() -> AgentrlPluginManager:
        """A fresh plugin manager with core's built-ins and every installed plugin."""
        return get_plugin_manager()

    @pytest.fixture
    def agentrl_registry(agentrl_plugin_manager: AgentrlPluginManager) -> Registry:
        return Registry(agentrl_plugin_manager)


def register_plugin(plugin: object, name: str = "test-plugin", *, load_entry_points: bool = True) -> Registry:
    """A registry whose manager has ``plugin`` registered beside the installed ones."""
    return Registry(get_plugin_manager(load_entry_points=load_entry_points, extra_plugins={name: plugin}))


@contextlib.contextmanager
def temporary_distribution(
    root: Path, dist_name: str, *, entry_points: Mapping[str, str], modules: Mapping[str, str], version: str = "0.0.1",
    requires: Sequence[str] = (),
) -> Iterator[Path]:
    """Write a minimal installed distribution under ``root`` and put it on ``sys.path``.

    ``entry_points`` maps entry-point names (group ``agentrl``) to module names;
    ``modules`` maps module names to their source; ``requires`` are its ``Requires-Dist``
    lines (``"agentrl-core>=0.2,<0.3"``).
    """
    root.mkdir(parents=True, exist_ok=True)
    for module, source in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist_name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    requires_lines = "".join(f"Requires-Dist: {line}\n" for line in requires)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n{requires_lines}")
    lines = ["[agentrl]"] + [f"{ep} = {mod}" for ep, mod in entry_points.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    try:
        yield root
    finally:
        sys.path.remove(str(root))
        for module in modules:
            sys.modules.pop(module, None)
        importlib.invalidate_caches()


# ---------------------------------------------------------------------------------------
# Conformance


@attrs.define
class ConformanceReport:
    environment: str
    checks: list[str] = attrs.field(factory=list)
    failures: list[str] = attrs.field(factory=list)

    def ok(self, what: str) -> None:
        self.checks.append(what)

    def fail(self, what: str) -> None:
        self.failures.append(what)


def check_environment(
    name_or_env: str | Environment,
    config: Any = None,
    *,
    splits: list[str] | None = None,
    oracle_samples: int = 3,
    reward_range: tuple[float, float] = (0.0, 1.0),
    registry: Registry | None = None,
) -> ConformanceReport:
    """Check an environment against the contract; raise AssertionError listing every failure."""
    return anyio.run(
        lambda: check_environment_async(
            name_or_env, config, splits=splits, oracle_samples=oracle_samples,
            reward_range=reward_range, registry=registry,
        )
    )


async def check_environment_async(
    name_or_env: str | Environment,
    config: Any = None,
    *,
    splits: list[str] | None = None,
    oracle_samples: int = 3,
    reward_range: tuple[float, float] = (0.0, 1.0),
    registry: Registry | None = None,
) -> ConformanceReport:
    if isinstance(name_or_env, str):
        registry = registry or Registry()
        env = registry.build(EnvironmentSpec, name_or_env, config)
        label = name_or_env
    else:
        env, label = name_or_env, getattr(name_or_env, "name", type(name_or_env).__name__)
    report = ConformanceReport(label)
    try:
        await _check(env, report, splits, oracle_samples, reward_range)
    finally:
        await env.aclose()
    if report.failures:
        raise AssertionError(f"environment {label!r} failed {len(report.failures)} check(s):\n- " + "\n- ".join(report.failures))
    return report


async def _check(env: Any, report: ConformanceReport, splits: list[str] | None, oracle_samples: int, reward_range) -> None:
    tools = env.tools
    if not tools:
        report.fail("declares no tools")
    names = [t.get("function", {}).get("name") for t in tools if isinstance(t, Mapping)]
    if len(set(names)) != len(names):
        report.fail(f"duplicate tool names: {names}")
    for tool in tools:
        for problem in tool_schema_errors(tool):
            report.fail(f"tool schema: {problem}")
    report.ok("tool schemas")
    if not isinstance(env.concurrency, int) or env.concurrency < 1:
        report.fail(f"concurrency must be a positive int, got {env.concurrency!r}")
    sets = env.index_sets()
    if not sets:
        report.fail("no index sets")
        return
    for split, indices in sets.items():
        if not indices:
            report.fail(f"index set {split!r} is empty")
        elif any(not isinstance(i, int | str) or isinstance(i, bool) for i in indices):
            report.fail(f"index set {split!r} has indices that are neither int nor str")
    report.ok("index sets")
    chosen = splits or sorted(sets)
    baseline = env.resource_count()
    for split in chosen:
        if not sets.get(split):
            continue
        await _check_session(env, split, sets[split][0], report, reward_range)
    if baseline is not None and env.resource_count() != baseline:
        report.fail(f"resources leaked: {env.resource_count()} live after all sessions closed (was {baseline})")
    for split in chosen[:2]:
        for index in list(sets.get(split, []))[:oracle_samples]:
            await _check_oracle(env, split, index, report, reward_range)


async def _check_session(env: Any, split: str, index: Any, report: ConformanceReport, reward_range) -> None:
    where = f"{split}/{index}"
    session = await env.open(split, index)
    try:
        first = await session.start()
        if not first.messages:
            report.fail(f"{where}: start() returned no messages")
        if first.finish:
            report.fail(f"{where}: the episode finished at start with {first.status.value!r}")
            return
        bad_turns = [
            ("no tool call", {"role": "assistant", "content": "I am not sure what to do."}),
            ("unknown tool", assistant_tool_call("no_such_tool_xyz", {})),
            ("malformed arguments", {
                "role": "assistant", "content": "",
                "tool_calls": [{"id": "call_bad", "type": "function",
                                "function": {"name": env.tools[0]["function"]["name"], "arguments": "{not json"}}],
            }),
        ]
        for what, message in bad_turns:
            try:
                step = await session.step(message)
            except Exception as exc:  # the contract: never an exception for a bad turn
                report.fail(f"{where}: a turn with {what} raised {type(exc).__name__}: {exc}")
                return
            if not step.messages:
                report.fail(f"{where}: a turn with {what} got no error observation")
            if step.status not in (Status.RUNNING, Status.TASK_LIMIT_REACHED):
                report.fail(f"{where}: a turn with {what} ended the episode with {step.status.value!r}")
            if step.finish:
                break
        else:
            if step.metrics.get("invalid_turns") != len(bad_turns):
                report.fail(f"{where}: metrics.invalid_turns is {step.metrics.get('invalid_turns')!r} after {len(bad_turns)} bad turns")
        report.ok(f"{where}: bad turns answered with error observations")
    finally:
        await session.close()
        await session.close()  # idempotent
    try:
        await session.step({"role": "assistant", "content": "after close"})
        report.fail(f"{where}: step() after close() did not raise")
    except SessionError:
        report.ok(f"{where}: step after close raises SessionError")
    except Exception as exc:
        report.fail(f"{where}: step() after close() raised {type(exc).__name__} instead of SessionError")


async def _check_oracle(env: Any, split: str, index: Any, report: ConformanceReport, reward_range) -> None:
    from agentrl_core.env.episodes import play_episode

    try:
        agent = env.oracle(split, index, error_rate=0.0, seed=0)
    except NotImplementedError:
        report.fail(f"{split}/{index}: no oracle")
        return
    episode = await play_episode(env, split, index, agent)
    lo, hi = reward_range
    if not lo <= episode.reward <= hi:
        report.fail(f"{split}/{index}: reward {episode.reward} outside [{lo}, {hi}]")
    if episode.status is not Status.COMPLETED or episode.reward != hi:
        report.fail(f"{split}/{index}: the oracle did not solve it (status {episode.status.value!r}, reward {episode.reward})")
    else:
        report.ok(f"{split}/{index}: oracle solves it")
