"""Registration only; wandb is imported when the logger is built."""

from agentrl_core import hookimpl
from agentrl_core.types import LoggerSpec


@hookimpl
def agentrl_loggers():
    return [
        LoggerSpec(
            name="wandb",
            factory="agentrl_logger_wandb.logger:WandbLogger",
            config_schema="agentrl_logger_wandb.logger:WandbLoggerConfig",
            description="Weights & Biases, online or offline: metrics, the run config, sample rollouts as tables",
        )
    ]
