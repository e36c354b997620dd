"""Registration only: imported at plugin discovery, so it imports nothing heavy. The
environment and its config schema are named as strings and imported on first use."""

from agentrl_core import hookimpl
from agentrl_core.types import EnvironmentSpec


@hookimpl
def agentrl_environments():
    return [
        EnvironmentSpec(
            name="kg",
            factory="agentrl_env_kg.env:KGEnvironment",
            config_schema="agentrl_env_kg.config:KGConfig",
            description="AgentBench-FC knowledge-graph QA over SPARQL or an embedded Oxigraph store",
        )
    ]
