"""agentrl-sampler-cross: cross-policy sampling with a stale engine pool."""

__version__ = "0.1.0"
