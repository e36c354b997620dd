"""agentrl-logger-mlflow: send a run's metrics, config and sample trajectories to MLflow."""

__version__ = "0.1.0"
