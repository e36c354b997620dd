"""Exceptions users see. Every message is one sentence that names the fix."""

from __future__ import annotations


class AgentrlError(Exception):
    """Base of every error raised on purpose by agentrl."""


class PluginError(AgentrlError):
    """A plugin is broken, missing, duplicated or misused."""


class ConfigError(AgentrlError):
    """A configuration file or override is invalid."""


class EnvError(AgentrlError):
    """An environment or one of its sessions failed."""


class SessionError(EnvError):
    """A session was used wrongly (stepped after it finished, stepped concurrently, ...)."""
