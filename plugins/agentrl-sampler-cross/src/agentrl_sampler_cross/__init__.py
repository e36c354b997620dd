"""agentrl-sampler-cross: cross-policy sampling with a stale engine pool."""

from importlib import metadata

__version__ = metadata.version("agentrl-sampler-cross")  # the root VERSION file, at build time
