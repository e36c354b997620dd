"""Registration only: imported at plugin discovery, so it imports nothing heavy. The factory
and the config schema are named as strings and imported when the environment is used."""

from agentrl_core import hookimpl
from agentrl_core.types import EnvironmentSpec


@hookimpl
def agentrl_environments():
    return [
        EnvironmentSpec(
            name="webshop",
            factory="agentrl_env_webshop.env:WebShopEnvironment",
            config_schema="agentrl_env_webshop.config:WebShopConfig",
            description="WebShop: search, compare and buy in a simulated shop (AgentBench-FC tools, 20 rounds)",
        )
    ]
