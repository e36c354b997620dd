"""Registration only; mlflow is imported when the logger is built."""

from agentrl_core import hookimpl
from agentrl_core.types import LoggerSpec


@hookimpl
def agentrl_loggers():
    return [
        LoggerSpec(
            name="mlflow",
            factory="agentrl_logger_mlflow.logger:MlflowLogger",
            config_schema="agentrl_logger_mlflow.logger:MlflowLoggerConfig",
            description="MLflow: metrics, the run config as parameters, sample rollouts as tables",
        )
    ]
