"""``engine.<driver>``: a plugin driver's own section, validated by its schema (engine.options)."""

from __future__ import annotations

import pytest
from attrs import field, frozen

from agentrl_core import hookimpl
from agentrl_core.config import config_from_dict, config_to_dict
from agentrl_core.errors import ConfigError
from agentrl_core.testing import register_plugin
from agentrl_core.types import RolloutEngineSpec


@frozen
class ToyOptions:
    slots: int = 4
    extra_args: list[str] = field(factory=list)


class ToyDriverPlugin:
    @hookimpl
    def agentrl_rollout_engines(self):
        return [RolloutEngineSpec(name="toy", factory="builtins:dict", config_schema=ToyOptions),
                RolloutEngineSpec(name="bare", factory="builtins:dict")]


def test_a_driver_section_is_validated_by_the_drivers_schema_and_written_back():
    registry = register_plugin(ToyDriverPlugin(), load_entry_points=False)
    config = config_from_dict({"engine": {"driver": "toy", "toy": {"slots": 8}}}, registry=registry)
    assert config.engine.options == {"toy": ToyOptions(slots=8)}
    assert config_to_dict(config)["engine"]["toy"] == {"slots": 8, "extra_args": []}
    assert config_from_dict(config_to_dict(config), registry=registry) == config
    with pytest.raises(ConfigError, match=r"unknown key 'engine\.toy\.slot'.*did you mean 'slots'"):
        config_from_dict({"engine": {"driver": "toy", "toy": {"slot": 8}}}, registry=registry)
    with pytest.raises(ConfigError, match=r"engine\.bare.*rollout engine 'bare' takes no options"):
        config_from_dict({"engine": {"driver": "bare", "bare": {"threads": 2}}}, registry=registry)


def test_a_section_for_an_engine_that_is_not_installed_says_so():
    registry = register_plugin(ToyDriverPlugin(), load_entry_points=False)
    with pytest.raises(ConfigError, match=r"engine\.vlm.*unknown rollout engine 'vlm'"):
        config_from_dict({"engine": {"vlm": {"slots": 1}}}, registry=registry)
