"""agentrl-env-alfworld: AgentBench-FC's ALFWorld household environment (``alfworld``)."""

from importlib import metadata

__version__ = metadata.version("agentrl-env-alfworld")  # the root VERSION file, at build time
