"""agentrl: asynchronous reinforcement learning for multi-turn LLM agents.

Importing this package is cheap and has no side effects: no plugin is loaded until a
plugin manager is built (:func:`agentrl_core.plugins.get_plugin_manager`).
"""

from agentrl_core._version import __version__
from agentrl_core.hookspecs import hookimpl

__all__ = ["__version__", "hookimpl"]
