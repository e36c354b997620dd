"""The plugin layer: discovery, broken plugins, env switches, duplicates, lookups."""

from __future__ import annotations

import inspect
from importlib import metadata

import pytest

from agentrl_core import __version__, hookspecs
from agentrl_core.errors import PluginError
from agentrl_core.plugins import get_plugin_manager, incompatibility, required_core
from agentrl_core.registry import KINDS, Registry, list_plugins
from agentrl_core.testing import register_plugin, temporary_distribution
from agentrl_core.types import EnvironmentSpec

GOOD = """
from agentrl_core import hookimpl
from agentrl_core.types import EnvironmentSpec

@hookimpl
def agentrl_environments():
    return [EnvironmentSpec(name="{env}", factory="{module}:Env")]

class Env:
    def __init__(self, config):
        self.config = config
"""

BROKEN = "raise RuntimeError('this plugin is broken on purpose')\n"


def test_builtins_are_registered_explicitly():
    reg = Registry(get_plugin_manager(load_entry_points=False))
    assert reg.names("advantage_estimator") == ["grpo", "grpo_negated", "reinforce_pp_baseline", "rloo"]
    assert reg.names("sampler") == ["current"]
    assert reg.names("policy_loss") == ["ppo_dual_clip"]
    assert reg.names("weight_sync_transport") == ["collective", "disk"]
    assert reg.names("rollout_engine") == ["hf", "sglang"]
    assert reg.names("tool_parser") == ["hermes", "qwen25", "qwen3", "qwen3_coder"]
    assert reg.names("chat_template") == ["hf", "qwen3"]
    assert reg.names("reasoning_parser") == ["think"]
    assert reg.names("agent_program") == []
    assert reg.names("agent_loop") == ["chat"]
    assert reg.names("logger") == ["jsonl", "tensorboard"]
    assert reg.names("environment") == []


def test_every_hook_is_documented_with_an_example():
    specs = [name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("agentrl_")]
    assert sorted(specs) == sorted(spec.hook for spec in KINDS.values())
    for name in specs:
        doc = inspect.getdoc(getattr(hookspecs, name)) or ""
        assert "@hookimpl" in doc and "Spec(" in doc, f"{name} lacks a complete example"


def test_each_kind_is_declared_once_and_the_rest_follows():
    """types.SPEC_TYPES is the one list of kinds: hookspecs, built-ins and the docs table match it."""
    from pathlib import Path

    from agentrl_core import builtins
    from agentrl_core.types import SPEC_TYPES

    assert [s.kind for s in SPEC_TYPES] == list(KINDS) and len(set(KINDS)) == len(SPEC_TYPES)
    hooks = {s.hook: s for s in SPEC_TYPES}
    for name, spec in hooks.items():
        assert spec.__name__ in str(inspect.signature(getattr(hookspecs, name)).return_annotation), name
    implemented = [name for name, fn in inspect.getmembers(builtins, inspect.isfunction) if name.startswith("agentrl_")]
    assert implemented and set(implemented) <= set(hooks)
    docs = Path(__file__).resolve().parents[2] / "core" / "docs" / "plugins_and_config.md"
    rows = {line.split("|")[1].strip(" `") for line in docs.read_text().splitlines() if line.startswith("| `agentrl_")}
    assert rows == set(hooks)


def test_lookups_take_the_spec_class_or_the_kind_string():
    from agentrl_core.types import SamplerSpec, ToolParserSpec

    reg = Registry(get_plugin_manager(load_entry_points=False))
    assert reg.names(SamplerSpec) == reg.names("sampler") == ["current"]
    assert isinstance(reg.spec(SamplerSpec, "current"), SamplerSpec)
    assert type(reg.build(ToolParserSpec, "hermes")) is type(reg.build("tool_parser", "hermes"))
    with pytest.raises(PluginError, match="unknown tool parser 'hermez'; did you mean 'hermes'"):
        reg.build(ToolParserSpec, "hermez")


def test_entry_point_plugin_is_discovered(tmp_path):
    src = GOOD.format(env="toyenv", module="toy_plugin")
    with temporary_distribution(tmp_path, "agentrl-env-toy", entry_points={"env_toy": "toy_plugin"},
                                modules={"toy_plugin": src}):
        pm = get_plugin_manager(environ={})
        reg = Registry(pm)
        assert reg.get_environment("toyenv").factory == "toy_plugin:Env"
        record = pm.records["env_toy"]
        assert (record.distribution, record.version, record.status) == ("agentrl-env-toy", "0.0.1", "ok")
        env = reg.build("environment", "toyenv")
        assert env.config is None


def test_broken_plugin_is_reported_not_fatal(tmp_path):
    with temporary_distribution(tmp_path, "agentrl-env-broken", entry_points={"env_broken": "broken_plugin"},
                                modules={"broken_plugin": BROKEN}):
        pm = get_plugin_manager(environ={})
        record = pm.records["env_broken"]
        assert record.status == "failed"
        assert "this plugin is broken on purpose" in record.error
        listed = {r.name: r for r in list_plugins(pm)}
        assert listed["env_broken"].status == "failed"
        with pytest.raises(PluginError, match="env_broken.*agentrl-env-broken 0.0.1.*agentrl-core"):
            get_plugin_manager(environ={"AGENTRL_STRICT_PLUGINS": "1"})


def test_plugin_whose_hook_raises_is_reported(tmp_path):
    src = """
from agentrl_core import hookimpl

@hookimpl
def agentrl_environments():
    raise ValueError("hook exploded")
"""
    with temporary_distribution(tmp_path, "agentrl-env-bad-hook", entry_points={"env_bad_hook": "bad_hook"},
                                modules={"bad_hook": src}):
        pm = get_plugin_manager(environ={})
        records = {r.name: r for r in list_plugins(pm)}
        assert records["env_bad_hook"].status == "failed"
        assert "hook exploded" in records["env_bad_hook"].error


def test_allow_and_disable_lists(tmp_path):
    modules = {"p_one": GOOD.format(env="one", module="p_one"), "p_two": GOOD.format(env="two", module="p_two")}
    with temporary_distribution(tmp_path, "agentrl-env-pair", entry_points={"p_one": "p_one", "p_two": "p_two"},
                                modules=modules):
        only = Registry(get_plugin_manager(environ={"AGENTRL_PLUGINS": "p_one"}))
        assert "one" in only.names("environment") and "two" not in only.names("environment")
        blocked = Registry(get_plugin_manager(environ={"AGENTRL_DISABLE_PLUGINS": "p_one"}))
        assert "one" not in blocked.names("environment") and "two" in blocked.names("environment")


def test_duplicate_names_list_every_distribution(tmp_path):
    with temporary_distribution(tmp_path / "a", "agentrl-env-alpha", entry_points={"alpha": "alpha_mod"},
                                modules={"alpha_mod": GOOD.format(env="shared", module="alpha_mod")}), \
         temporary_distribution(tmp_path / "b", "agentrl-env-beta", entry_points={"beta": "beta_mod"},
                                modules={"beta_mod": GOOD.format(env="shared", module="beta_mod")}):
        reg = Registry(get_plugin_manager(environ={}))
        with pytest.raises(PluginError) as info:
            reg.get_environment("shared")
        message = str(info.value)
        assert "agentrl-env-alpha" in message and "agentrl-env-beta" in message


def test_unknown_name_suggests_close_match():
    class Plugin:
        @staticmethod
        @hookspecs.hookimpl
        def agentrl_environments():
            return [EnvironmentSpec(name="webshop", factory="x:y")]

    reg = register_plugin(Plugin(), load_entry_points=False)
    with pytest.raises(PluginError, match="did you mean 'webshop'"):
        reg.get_environment("webshopp")
    with pytest.raises(PluginError) as err:  # no known package provides it: no hint to a package that is not there
        reg.get_environment("zzworld")
    assert "install" not in str(err.value)


@pytest.mark.parametrize("bad", ["Bad", "9x", "has-dash", "", "a b"])
def test_spec_names_are_validated(bad):
    with pytest.raises(PluginError, match="invalid"):
        EnvironmentSpec(name=bad, factory="m:f")


def test_spec_factory_must_be_a_reference():
    with pytest.raises(PluginError, match="module:attr"):
        EnvironmentSpec(name="ok", factory="not a reference")


def test_importing_core_loads_no_plugin():
    import subprocess
    import sys

    code = (
        "import sys, agentrl_core, agentrl_core.env, agentrl_core.config\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert not [m for m in sys.modules if m.startswith('agentrl_') and not m.startswith('agentrl_core')]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _series_pin(minor_offset: int) -> str:
    """``>=0.Y,<0.(Y+1)`` for the installed core's series shifted by ``minor_offset``."""
    major, minor = (int(part) for part in __version__.split(".")[:2])
    return f">={major}.{minor + minor_offset},<{major}.{minor + minor_offset + 1}"


def test_incompatibility_names_both_versions_in_one_sentence():
    assert incompatibility("env_x", "agentrl-env-x", "0.1.0", "<0.2,>=0.1", core_version="0.2.0") == (
        "plugin 'env_x' from agentrl-env-x 0.1.0 was built for agentrl-core >=0.1,<0.2 but agentrl-core 0.2.0 is "
        "installed: install a release of agentrl-env-x made for agentrl-core 0.2.x (pip install -U agentrl-env-x) "
        "or an agentrl-core >=0.1,<0.2"
    )
    assert incompatibility("env_x", "agentrl-env-x", "0.2.0", "<0.3,>=0.2", core_version="0.2.7") is None
    assert incompatibility("env_x", "agentrl-env-x", "1.4.0", None, core_version="0.2.0") is None  # no pin: trusted
    assert incompatibility("env_x", "agentrl-env-x", "0.2.0", "<0.3,>=0.2", core_version="0.3.0") is not None
    # pip's rule too: a release candidate of 0.3.0 is not in >=0.3 ...
    assert incompatibility("env_x", "agentrl-env-x", "0.3.0", "<0.4,>=0.3", core_version="0.3.0rc1") is not None
    # ... but is in a pin that allows it.
    assert incompatibility("env_x", "agentrl-env-x", "0.3.0", "<0.4,>=0.3.0rc1", core_version="0.3.0rc1") is None


def test_plugin_for_another_core_series_is_refused_before_import(tmp_path):
    old = _series_pin(-1) if int(__version__.split(".")[1]) > 0 else _series_pin(+1)
    with temporary_distribution(tmp_path, "agentrl-env-old", entry_points={"env_old": "old_plugin"},
                                modules={"old_plugin": BROKEN}, requires=[f"agentrl-core{old}", "aiomysql>=0.2"]):
        pm = get_plugin_manager(environ={})
        record = pm.records["env_old"]
        assert record.status == "incompatible"
        assert f"agentrl-core {old}" in record.error and f"agentrl-core {__version__} is installed" in record.error
        assert "\n" not in record.error and "broken on purpose" not in record.error  # never imported
        assert {r.name: r.status for r in list_plugins(pm)}["env_old"] == "incompatible"
        with pytest.raises(PluginError, match="unknown environment 'old'.*'env_old' .*incompatible: plugin 'env_old'"):
            Registry(pm).get_environment("old")
        with pytest.raises(PluginError, match=r"was built for agentrl-core .* \(AGENTRL_STRICT_PLUGINS is set\)"):
            get_plugin_manager(environ={"AGENTRL_STRICT_PLUGINS": "1"})


def test_plugin_for_this_core_series_loads_and_extras_pins_do_not_count(tmp_path):
    requires = [f"agentrl-core[torch]{_series_pin(0)}", f'agentrl-core{_series_pin(5)}; extra == "legacy"']
    with temporary_distribution(tmp_path, "agentrl-env-current", entry_points={"env_current": "current_plugin"},
                                modules={"current_plugin": GOOD.format(env="current", module="current_plugin")},
                                requires=requires):
        pm = get_plugin_manager(environ={})
        declared = required_core(metadata.distribution("agentrl-env-current"))
        assert set(declared.split(",")) == set(_series_pin(0).split(","))
        assert pm.records["env_current"].status == "ok"
        assert "current" in Registry(pm).names("environment")
