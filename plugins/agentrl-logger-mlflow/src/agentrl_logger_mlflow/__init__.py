"""agentrl-logger-mlflow: send a run's metrics, config and sample trajectories to MLflow."""

from importlib import metadata

__version__ = metadata.version("agentrl-logger-mlflow")  # the root VERSION file, at build time
