"""``rollout.agent_loop_options``: validated by the chosen loop's schema, handed to its factory."""

from __future__ import annotations

import pytest
from attrs import frozen

from agentrl_core import hookimpl
from agentrl_core.config import config_from_dict
from agentrl_core.errors import ConfigError
from agentrl_core.testing import register_plugin
from agentrl_core.types import AgentLoopSpec


@frozen
class ToyLoopOptions:
    median: int = 256


class ToyLoopPlugin:
    @hookimpl
    def agentrl_agent_loops(self):
        return [AgentLoopSpec(name="toy", factory="builtins:dict", config_schema=ToyLoopOptions)]


def test_agent_loop_options_are_validated_by_the_loops_schema_and_built_with_it():
    registry = register_plugin(ToyLoopPlugin(), load_entry_points=False)
    config = config_from_dict({"rollout": {"agent_loop": "toy", "agent_loop_options": {"median": 64}}},
                              registry=registry)
    assert config.rollout.agent_loop_options == {"median": 64}
    assert registry.make_config(AgentLoopSpec, "toy", config.rollout.agent_loop_options) == ToyLoopOptions(64)
    with pytest.raises(ConfigError, match=r"unknown key 'rollout\.agent_loop_options\.medain'.*did you mean 'median'"):
        config_from_dict({"rollout": {"agent_loop": "toy", "agent_loop_options": {"medain": 64}}}, registry=registry)


def test_the_chat_loop_takes_no_options():
    registry = register_plugin(ToyLoopPlugin(), load_entry_points=False)
    with pytest.raises(ConfigError, match=r"rollout\.agent_loop_options.*agent loop 'chat' takes no options"):
        config_from_dict({"rollout": {"agent_loop_options": {"median": 64}}}, registry=registry)
