"""Registration only: this module is imported at plugin discovery, so it stays tiny and
imports nothing heavy. The factory and config schema are named as strings and imported
only when the environment is used."""

from agentrl_core import hookimpl
from agentrl_core.types import EnvironmentSpec


@hookimpl
def agentrl_environments():
    return [
        EnvironmentSpec(
            name="calc",
            factory="agentrl_plugin_example.env:CalcEnvironment",
            config_schema="agentrl_plugin_example.env:CalcConfig",
            description="multi-step arithmetic with a calculator tool (example plugin)",
        )
    ]
