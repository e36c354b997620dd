"""agentrl-env-os: the AgentBench OS interaction environment (``os``) in real Docker containers."""

__version__ = "0.1.0"
