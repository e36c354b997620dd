"""Registration only: imported at plugin discovery, so nothing heavy is imported here."""

from agentrl_core import hookimpl
from agentrl_core.types import EnvironmentSpec


@hookimpl
def agentrl_environments():
    return [
        EnvironmentSpec(
            name="alfworld",
            factory="agentrl_env_alfworld.env:AlfworldEnvironment",
            config_schema="agentrl_env_alfworld.config:AlfworldConfig",
            description="ALFWorld household tasks on TextWorld's PDDL engine (AgentBench-FC semantics)",
        )
    ]
