"""Plugin manager factory, entry-point loading and listing.

Nothing is loaded at import time. :func:`get_plugin_manager` builds a fresh manager:
core's built-ins are registered explicitly, then every entry point of group ``agentrl``
is loaded in its own ``try``: a broken plugin is recorded (name, distribution, versions,
error) and skipped, unless ``AGENTRL_STRICT_PLUGINS=1``. A plugin whose distribution requires
an ``agentrl-core`` that is not the installed one (built for another ``0.Y`` series) is not
imported at all: it is recorded as ``incompatible``, naming both versions. ``AGENTRL_PLUGINS=a,b`` loads
only those entry points; ``AGENTRL_DISABLE_PLUGINS=x,y`` blocks some.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from importlib import metadata

import attrs
import pluggy
from attrs import frozen
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from agentrl_core import hookspecs
from agentrl_core._version import __version__
from agentrl_core.errors import PluginError

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "agentrl"
CORE_DISTRIBUTION = "agentrl-core"
BUILTIN_PLUGIN = "agentrl_core.builtins"


@frozen
class PluginRecord:
    """What is known about one plugin: loaded or not, and why."""

    name: str
    distribution: str
    version: str
    status: str  # "ok", "failed", "incompatible" or "disabled"
    error: str | None = None
    hooks: tuple[str, ...] = ()
    provides: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    entry_point: str = ""  # "name = module" as declared by the distribution; empty for built-ins

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "status": self.status,
            "error": self.error,
            "hooks": list(self.hooks),
            "provides": {k: list(v) for k, v in self.provides.items()},
            "entry_point": self.entry_point,
        }


class AgentrlPluginManager(pluggy.PluginManager):
    """A pluggy manager that remembers which distribution each plugin came from."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT)
        self.add_hookspecs(hookspecs)
        self.records: dict[str, PluginRecord] = {}

    def distribution_of(self, plugin_name: str) -> tuple[str, str]:
        record = self.records.get(plugin_name)
        if record is None:
            return ("<unknown>", "?")
        return (record.distribution, record.version)

    def record_failure(self, plugin_name: str, error: str) -> None:
        """Mark a registered plugin as failed (e.g. its hook raised) and unregister it."""
        record = self.records.get(plugin_name)
        if record is not None:
            self.records[plugin_name] = attrs.evolve(record, status="failed", error=error)
        plugin = self.get_plugin(plugin_name)
        if plugin is not None:
            self.unregister(plugin)


def _split_env(value: str | None) -> set[str]:
    return {item.strip() for item in (value or "").split(",") if item.strip()}


def strict_plugins(environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return environ.get("AGENTRL_STRICT_PLUGINS", "") not in ("", "0", "false", "no")


def get_plugin_manager(
    *,
    load_entry_points: bool = True,
    environ: Mapping[str, str] | None = None,
    extra_plugins: Mapping[str, object] | None = None,
) -> AgentrlPluginManager:
    """Build a fresh plugin manager.

    ``extra_plugins`` maps names to plugin objects (modules or instances with ``@hookimpl``
    functions) registered after the built-ins; tests use it through
    :func:`agentrl_core.testing.register_plugin`.
    """
    environ = os.environ if environ is None else environ
    pm = AgentrlPluginManager()
    _register_builtins(pm)
    for name, plugin in (extra_plugins or {}).items():
        pm.register(plugin, name=name)
        pm.records[name] = PluginRecord(name, "<test>", "0", "ok", hooks=_hook_names(pm, plugin))
    if load_entry_points:
        _load_entry_points(pm, environ)
    return pm


def _register_builtins(pm: AgentrlPluginManager) -> None:
    import importlib

    module = importlib.import_module(BUILTIN_PLUGIN)
    pm.register(module, name="core")
    pm.records["core"] = PluginRecord("core", CORE_DISTRIBUTION, __version__, "ok", hooks=_hook_names(pm, module))


def _hook_names(pm: pluggy.PluginManager, plugin: object) -> tuple[str, ...]:
    callers = pm.get_hookcallers(plugin) or []
    return tuple(sorted(caller.name for caller in callers))


def _entry_points() -> list[metadata.EntryPoint]:
    return sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def required_core(dist: metadata.Distribution | None) -> str | None:
    """The ``agentrl-core`` version specifier a distribution declares (``">=0.2,<0.3"``), if any.

    Requirements behind an extra or another environment marker are not the plugin's own need
    of core, so only unconditional ones count.
    """
    for line in (dist.requires or []) if dist is not None else []:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(requirement.name) != CORE_DISTRIBUTION:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        return str(requirement.specifier) or None
    return None


def incompatibility(plugin: str, dist: str, version: str, specifier: str | None, core_version: str = __version__) -> str | None:
    """One sentence saying why ``plugin`` cannot run with this core, or None when it can."""
    if specifier is None:
        return None
    from packaging.specifiers import SpecifierSet

    try:
        compatible = SpecifierSet(specifier).contains(Version(core_version), prereleases=True)
    except InvalidVersion:  # an uninstalled source tree ("0+unknown"): nothing to compare
        return None
    if compatible:
        return None
    return (
        f"plugin {plugin!r} from {dist} {version} was built for agentrl-core{_spaced(specifier)} but agentrl-core "
        f"{core_version} is installed: install a release of {dist} made for agentrl-core {_series(core_version)} "
        f"(pip install -U {dist}) or an agentrl-core{_spaced(specifier)}"
    )


def _spaced(specifier: str) -> str:
    return " " + ",".join(sorted(specifier.split(","), key=lambda s: s.lstrip("<>=!~")))


def _series(version: str) -> str:
    release = Version(version).release
    return ".".join(str(part) for part in (release + (0,))[:2]) + ".x"


def _load_entry_points(pm: AgentrlPluginManager, environ: Mapping[str, str]) -> None:
    only = _split_env(environ.get("AGENTRL_PLUGINS"))
    disabled = _split_env(environ.get("AGENTRL_DISABLE_PLUGINS"))
    strict = strict_plugins(environ)
    seen: set[str] = set()
    for ep in _entry_points():
        if ep.name in seen:  # the same distribution visible twice on sys.path
            continue
        seen.add(ep.name)
        dist = ep.dist.name if ep.dist is not None else "<unknown>"
        version = ep.dist.version if ep.dist is not None else "?"
        declared = f"{ep.name} = {ep.value}"
        if (only and ep.name not in only) or ep.name in disabled:
            why = "not in AGENTRL_PLUGINS" if only and ep.name not in only else "in AGENTRL_DISABLE_PLUGINS"
            pm.records[ep.name] = PluginRecord(ep.name, dist, version, "disabled", error=why, entry_point=declared)
            continue
        refused = incompatibility(ep.name, dist, version, required_core(ep.dist))
        if refused:
            if strict:
                raise PluginError(refused + " (AGENTRL_STRICT_PLUGINS is set)")
            log.warning("%s; skipped", refused)
            pm.records[ep.name] = PluginRecord(ep.name, dist, version, "incompatible", error=refused, entry_point=declared)
            continue
        try:
            plugin = ep.load()
            pm.register(plugin, name=ep.name)
        except Exception as exc:  # a broken plugin must not take the others down
            message = (
                f"plugin {ep.name!r} from {dist} {version} (entry point {declared!r}) failed to load with "
                f"agentrl-core {__version__}: {type(exc).__name__}: {exc}"
            )
            if strict:
                raise PluginError(message + " (AGENTRL_STRICT_PLUGINS is set)") from exc
            log.warning("%s; skipped (set AGENTRL_STRICT_PLUGINS=1 to make this fatal)", message)
            pm.records[ep.name] = PluginRecord(
                ep.name, dist, version, "failed", error=f"{type(exc).__name__}: {exc}", entry_point=declared
            )
            continue
        pm.records[ep.name] = PluginRecord(ep.name, dist, version, "ok", hooks=_hook_names(pm, plugin), entry_point=declared)

