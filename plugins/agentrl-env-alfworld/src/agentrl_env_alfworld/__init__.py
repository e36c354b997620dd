"""agentrl-env-alfworld: AgentBench-FC's ALFWorld household environment (``alfworld``)."""

__version__ = "0.1.0"
