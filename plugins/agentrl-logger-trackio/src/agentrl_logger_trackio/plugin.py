"""Registration only; trackio is imported when the logger is built."""

from agentrl_core import hookimpl
from agentrl_core.types import LoggerSpec


@hookimpl
def agentrl_loggers():
    return [
        LoggerSpec(
            name="trackio",
            factory="agentrl_logger_trackio.logger:TrackioLogger",
            config_schema="agentrl_logger_trackio.logger:TrackioLoggerConfig",
            description="Trackio (local-first): metrics, the run config, sample rollouts as tables",
        )
    ]
