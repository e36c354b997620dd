"""agentrl-logger-trackio: send a run's metrics, config and sample trajectories to Trackio."""

from importlib import metadata

__version__ = metadata.version("agentrl-logger-trackio")  # the root VERSION file, at build time
