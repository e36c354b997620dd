"""agentrl-env-kg: AgentBench's knowledge-graph environment for agentrl (environment ``kg``)."""

from importlib import metadata

__version__ = metadata.version("agentrl-env-kg")  # the root VERSION file, at build time
