"""agentrl-env-kg: AgentBench's knowledge-graph environment for agentrl (environment ``kg``)."""

__version__ = "0.1.0"
