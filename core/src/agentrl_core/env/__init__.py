"""The environment API for plugins (docs/architecture.md sections 3-4).

Import what you need from here::

    from agentrl_core.env import Environment, ToolSession, Step, Status, function_tool

This package is the plugin-author API only (``api``, ``tools``, ``episodes``); it imports
no service. The control plane that serves environments (worker, controller, client) is
:mod:`agentrl_core.controlplane`; test helpers are in :mod:`agentrl_core.testing`.
"""

from agentrl_core.env.api import Environment, ThreadedSession, ToolSession, UnknownIndexError, run_blocking
from agentrl_core.env.episodes import Episode, play_episode, read_demonstrations, write_demonstrations
from agentrl_core.env.replay import PrefixReplayer
from agentrl_core.env.tools import (
    BadTurn,
    ToolCall,
    assistant_tool_call,
    error_observation,
    first_tool_call,
    function_tool,
    parse_tool_call,
    tool_result,
    tool_schema_errors,
)
from agentrl_core.errors import EnvError, SessionError
from agentrl_core.types import Index, Message, Status, Step

__all__ = [
    "BadTurn",
    "EnvError",
    "PrefixReplayer",
    "Environment",
    "Episode",
    "Index",
    "Message",
    "SessionError",
    "Status",
    "Step",
    "ThreadedSession",
    "ToolCall",
    "ToolSession",
    "UnknownIndexError",
    "assistant_tool_call",
    "error_observation",
    "first_tool_call",
    "function_tool",
    "parse_tool_call",
    "play_episode",
    "read_demonstrations",
    "run_blocking",
    "tool_result",
    "tool_schema_errors",
    "write_demonstrations",
]
