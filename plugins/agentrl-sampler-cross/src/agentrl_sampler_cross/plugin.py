"""Registration only; the sampler is imported when first used."""

from agentrl_core import hookimpl
from agentrl_core.types import SamplerSpec


@hookimpl
def agentrl_samplers():
    return [
        SamplerSpec(
            name="cross",
            factory="agentrl_sampler_cross.sampler:CrossSampler",
            config_schema="agentrl_sampler_cross.sampler:CrossConfig",
            description="per-turn mix of the current and a stale policy (AgentRL cross-policy sampling)",
        )
    ]
