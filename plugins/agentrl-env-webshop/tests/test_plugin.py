"""Discovery first, then the environment contract and the config schema."""

from __future__ import annotations

import pytest
from agentrl_env_webshop.env import TOOLS

from agentrl_core.errors import ConfigError
from agentrl_core.plugins import get_plugin_manager
from agentrl_core.registry import Registry
from agentrl_core.testing import check_environment


def test_entry_point_is_discovered_by_a_fresh_plugin_manager():
    pm = get_plugin_manager(environ={})
    assert pm.records["env_webshop"].status == "ok"
    assert pm.records["env_webshop"].distribution == "agentrl-env-webshop"
    spec = Registry(pm).get_environment("webshop")
    assert spec.factory == "agentrl_env_webshop.env:WebShopEnvironment"


def test_conformance():
    report = check_environment("webshop", oracle_samples=3)
    assert not report.failures
    assert any("oracle solves it" in c for c in report.checks)


def test_tools_are_agentbench_fc_schemas():
    assert [t["function"]["name"] for t in TOOLS] == ["search_action", "click_action"]
    assert TOOLS[0]["function"]["parameters"]["required"] == ["keywords"]
    assert TOOLS[1]["function"]["parameters"]["required"] == ["value"]
    assert all(t["function"]["parameters"]["additionalProperties"] is False for t in TOOLS)


def test_config_errors_name_the_key():
    registry = Registry()
    with pytest.raises(ConfigError, match="attributes_path"):
        registry.make_config("environment", "webshop", {"items_path": "/x/items_shuffle.json"})
    with pytest.raises(ConfigError, match="human_instructions_path"):
        registry.make_config("environment", "webshop", {"items_path": "a.json", "attributes_path": "b.json"})
    with pytest.raises(ConfigError, match="max_rounds"):
        registry.make_config("environment", "webshop", {"max_rounds": 0})
    with pytest.raises(ConfigError, match="did you mean 'spacy_model'"):
        registry.make_config("environment", "webshop", {"spacy_modle": "x"})


def test_plugin_imports_without_torch():
    import sys

    import agentrl_env_webshop.env  # noqa: F401

    assert "torch" not in sys.modules
