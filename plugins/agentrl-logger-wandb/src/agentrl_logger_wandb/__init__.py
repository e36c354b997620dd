"""agentrl-logger-wandb: send a run's metrics, config and sample trajectories to W&B."""

from importlib import metadata

__version__ = metadata.version("agentrl-logger-wandb")  # the root VERSION file, at build time
