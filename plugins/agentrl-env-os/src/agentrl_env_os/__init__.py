"""agentrl-env-os: the AgentBench OS interaction environment (``os``) in real Docker containers."""

from importlib import metadata

__version__ = metadata.version("agentrl-env-os")  # the root VERSION file, at build time
