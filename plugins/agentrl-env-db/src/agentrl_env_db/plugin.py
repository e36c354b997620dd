"""Registration only: imported at plugin discovery, so it imports nothing heavy."""

from agentrl_core import hookimpl
from agentrl_core.types import EnvironmentSpec


@hookimpl
def agentrl_environments():
    return [
        EnvironmentSpec(
            name="db",
            factory="agentrl_env_db.env:DBEnvironment",
            config_schema="agentrl_env_db.config:DBConfig",
            description="AgentBench DB: answer questions and modify tables with SQL (MariaDB/MySQL or SQLite)",
        )
    ]
