"""Typed access to the components plugins register.

:class:`Registry` calls each registration hook once per plugin (so every record is
attributed to the plugin that yielded it), validates the records, and answers lookups:
a duplicate name is one error listing every providing distribution; an unknown name gets
close matches and the installed names.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable
from importlib import metadata
from typing import Any, TypeVar, overload

import attrs

from agentrl_core._version import __version__
from agentrl_core.errors import PluginError
from agentrl_core.plugins import AgentrlPluginManager, PluginRecord, get_plugin_manager, strict_plugins
from agentrl_core.structure import structure
from agentrl_core.types import SPEC_TYPES, ComponentSpec, EnvironmentSpec

log = logging.getLogger(__name__)

# kind -> its record class (hook name and "install ..." convention are class attributes)
KINDS: dict[str, type[ComponentSpec[Any]]] = {spec.kind: spec for spec in SPEC_TYPES}

C = TypeVar("C")  # a component
S = TypeVar("S", bound=ComponentSpec[Any])  # a spec class
Kind = str | type[ComponentSpec[Any]]


def _kind(kind: Kind) -> str:
    return kind if isinstance(kind, str) else kind.kind


@attrs.frozen
class Provided:
    spec: ComponentSpec
    plugin: str
    distribution: str
    version: str


# The distribution that provides each component of the plugins kept in this repository (one
# distribution may provide several, and its name need not follow the kind's convention: calc is
# the template plugin's). tests/integration/test_plugin_table.py checks it against the plugins.
KNOWN_PROVIDERS: dict[tuple[str, str], str] = {
    ("environment", "calc"): "agentrl-plugin-example",
    ("environment", "db"): "agentrl-env-db",
    ("environment", "os"): "agentrl-env-os",
    ("environment", "kg"): "agentrl-env-kg",
    ("environment", "webshop"): "agentrl-env-webshop",
    ("environment", "alfworld"): "agentrl-env-alfworld",
    ("sampler", "cross"): "agentrl-sampler-cross",
    ("advantage_normalizer", "task"): "agentrl-advnorm-task",
    ("rollout_engine", "vllm"): "agentrl-engine-vllm",
    ("weight_sync_transport", "vllm_nccl"): "agentrl-engine-vllm",
    ("logger", "mlflow"): "agentrl-logger-mlflow",
    ("logger", "wandb"): "agentrl-logger-wandb",
    ("logger", "trackio"): "agentrl-logger-trackio",
}


def install_hint(kind: str, name: str) -> str:
    """`` (install agentrl-env-x?: ...)`` for a component of a known plugin that is not installed.

    The distribution comes from :data:`KNOWN_PROVIDERS`, else from the installed metadata (an
    installed distribution named by the kind's convention, ``agentrl-env-<name>``); a name that
    neither gives gets no hint (a guessed package name would send the reader to a folder that
    does not exist). When the distribution is installed, the problem is something else (it
    failed to load, or provides other names).
    """
    dist = KNOWN_PROVIDERS.get((kind, name))
    if dist is None:  # not ours; an installed distribution named by the kind's convention is likely it
        pattern = KINDS[kind].install_pattern
        dist = pattern.format(name.replace("_", "-")) if pattern else None
        if dist is None or not _is_installed(dist):
            return ""
    if _is_installed(dist):
        return f" ({dist} is installed, but no loaded plugin provides {name!r}: see `agentrl plugins --all`)"
    return f" (install {dist}?: {INSTALL_HOWTO.format(dist=dist)})"


# How to install a plugin, from the index or a checkout; the root README (section Install) says the same.
INSTALL_HOWTO = "pip install {dist}, or from a checkout of agentrl, pip install -c constraints.txt ./plugins/{dist} (see the README, section Install)"


def _is_installed(dist: str) -> bool:
    try:
        metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


def _failed_plugins_note(pm: AgentrlPluginManager) -> str:
    """Installed plugins that are not loaded (failed, incompatible or disabled): the likely reason for a miss."""
    skipped = sorted((r for r in pm.records.values() if not r.ok), key=lambda r: r.name)
    if not skipped:
        return ""
    which = "; ".join(f"{r.name!r} ({r.distribution} {r.version}) {r.status}: {r.error}" for r in skipped)
    return f" Installed plugins not loaded (see `agentrl plugins`): {which}."


class Registry:
    """Every component registered in one plugin manager, grouped by kind."""

    def __init__(self, pm: AgentrlPluginManager | None = None) -> None:
        self.pm = pm if pm is not None else get_plugin_manager()
        self._by_kind: dict[str, dict[str, list[Provided]]] = {}
        for kind in KINDS:
            self._by_kind[kind] = self._collect(kind)

    def _collect(self, kind: str) -> dict[str, list[Provided]]:
        record_type = KINDS[kind]
        hook_name = record_type.hook
        caller = getattr(self.pm.hook, hook_name)
        found: dict[str, list[Provided]] = {}
        for impl in caller.get_hookimpls():
            dist, version = self.pm.distribution_of(impl.plugin_name)
            try:
                records = list(impl.function() or ())
                for record in records:
                    if not isinstance(record, record_type):
                        raise PluginError(
                            f"{hook_name} must yield {record_type.__name__} records, got {type(record).__name__}"
                        )
            except Exception as exc:
                message = (
                    f"plugin {impl.plugin_name!r} from {dist} {version} failed in {hook_name} with "
                    f"agentrl-core {__version__}: {type(exc).__name__}: {exc}"
                )
                if strict_plugins():
                    raise PluginError(message) from exc
                log.warning("%s; skipped", message)
                self.pm.record_failure(impl.plugin_name, f"{type(exc).__name__}: {exc}")
                continue
            for record in records:
                found.setdefault(record.name, []).append(Provided(record, impl.plugin_name, dist, version))
        return found

    # -- lookups --------------------------------------------------------------------
    # ``kind`` is a spec class (``SamplerSpec``: typed, what core uses) or its kind string
    # (``"sampler"``: the form plugin tests and READMEs use).

    def names(self, kind: Kind) -> list[str]:
        return sorted(self._by_kind[_kind(kind)])

    @overload
    def spec(self, kind: type[S], name: str) -> S: ...
    @overload
    def spec(self, kind: str, name: str) -> ComponentSpec[Any]: ...
    def spec(self, kind: Kind, name: str) -> ComponentSpec[Any]:
        """The unique record for ``name``, or a :class:`PluginError` that says what to do."""
        return self.provider(kind, name).spec

    def provider(self, kind: Kind, name: str) -> Provided:
        """The record for ``name`` with the plugin that registered it."""
        kind = _kind(kind)
        providers = self._by_kind[kind].get(name)
        if not providers:
            installed = self.names(kind)
            close = difflib.get_close_matches(name, installed, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise PluginError(
                f"unknown {kind.replace('_', ' ')} {name!r}{hint}{install_hint(kind, name)} "
                f"Installed: {', '.join(installed) or 'none'}.{_failed_plugins_note(self.pm)}"
            )
        if len(providers) > 1:
            who = ", ".join(f"{p.distribution} {p.version} (plugin {p.plugin!r})" for p in providers)
            raise PluginError(
                f"{kind.replace('_', ' ')} {name!r} is provided by several plugins: {who}; "
                "uninstall one or block it with AGENTRL_DISABLE_PLUGINS."
            )
        return providers[0]

    def _resolve(self, kind: Kind, name: str, field: str) -> Any:
        """Import the ``factory`` or ``config_schema`` reference of ``name``, failing in one sentence."""
        kind = _kind(kind)
        provided = self.provider(kind, name)
        spec = provided.spec
        try:
            return spec.load_factory() if field == "factory" else spec.load_config_schema()
        except PluginError:
            raise
        except Exception as exc:  # an import error, a missing attribute, or the module raising
            record = self.pm.records.get(provided.plugin)
            entry = f", entry point {record.entry_point!r}" if record is not None and record.entry_point else ""
            raise PluginError(
                f"{kind.replace('_', ' ')} {name!r} of plugin {provided.plugin!r} ({provided.distribution} "
                f"{provided.version}{entry}) cannot be loaded: its {field} {getattr(spec, field)!r} failed with "
                f"{type(exc).__name__}: {exc}. The plugin's registration is wrong or its package is "
                "incomplete: fix or reinstall it (agentrl -v shows the traceback)."
            ) from exc

    def config_schema(self, kind: Kind, name: str) -> type | None:
        return self._resolve(kind, name, "config_schema")

    @overload
    def build(self, kind: type[ComponentSpec[C]], name: str, config: Any = None, **kwargs: Any) -> C: ...
    @overload
    def build(self, kind: str, name: str, config: Any = None, **kwargs: Any) -> Any: ...
    def build(self, kind: Kind, name: str, config: Any = None, **kwargs: Any) -> Any:
        """Instantiate a component: ``factory(config, **kwargs)``.

        ``config`` may be ``None`` (schema defaults are used), a mapping (validated by the
        schema) or an instance of the schema. With a spec class as ``kind`` the result is
        typed as the component that kind builds (``build(SamplerSpec, ...) -> Sampler``).
        """
        config = self.make_config(kind, name, config)
        factory: Callable[..., Any] = self._resolve(kind, name, "factory")
        return factory(config, **kwargs)

    def make_config(self, kind: Kind, name: str, config: Any = None) -> Any:
        schema = self.config_schema(kind, name)
        if schema is None:
            if config:
                raise PluginError(f"{_kind(kind).replace('_', ' ')} {name!r} takes no configuration, got {config!r}.")
            return None
        if config is None or isinstance(config, dict):
            return structure(schema, config or {}, path=f"{name}")
        if not isinstance(config, schema):
            raise PluginError(f"config for {name!r} must be a {schema.__name__} or a mapping, got {type(config).__name__}.")
        return config

    def provided_by_plugin(self) -> dict[str, dict[str, tuple[str, ...]]]:
        out: dict[str, dict[str, list[str]]] = {}
        for kind, by_name in self._by_kind.items():
            for name, providers in by_name.items():
                for p in providers:
                    out.setdefault(p.plugin, {}).setdefault(kind, []).append(name)
        return {plugin: {k: tuple(sorted(v)) for k, v in kinds.items()} for plugin, kinds in out.items()}

    def get_environment(self, name: str) -> EnvironmentSpec:
        """The record of environment ``name`` (``spec(EnvironmentSpec, name)``)."""
        return self.spec(EnvironmentSpec, name)


def build_environment(name: str, config: Any = None, pm: AgentrlPluginManager | None = None) -> Any:
    """Shortcut: instantiate an environment by name with its (validated) config."""
    return Registry(pm).build(EnvironmentSpec, name, config)


def list_plugins(pm: AgentrlPluginManager, *, include_core: bool = False) -> list[PluginRecord]:
    """Every plugin known to ``pm`` with the component names it provides.

    Building the list calls every registration hook, so a plugin whose hook raises shows
    up here as failed too.
    """
    registry = Registry(pm)
    provided = registry.provided_by_plugin()
    out = []
    for name, record in sorted(pm.records.items()):
        if name == "core" and not include_core:
            continue
        record = pm.records[name]  # may have been marked failed while collecting
        out.append(attrs.evolve(record, provides=provided.get(name, {})))
    return out
