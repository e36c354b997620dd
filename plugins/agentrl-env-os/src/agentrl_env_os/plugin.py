"""Registration only: imported at plugin discovery, so nothing heavy is imported here."""

from agentrl_core import hookimpl
from agentrl_core.types import EnvironmentSpec


@hookimpl
def agentrl_environments():
    return [
        EnvironmentSpec(
            name="os",
            factory="agentrl_env_os.env:OSEnvironment",
            config_schema="agentrl_env_os.config:OSConfig",
            description="AgentBench OS interaction: a persistent bash in a Docker container per episode",
        )
    ]
