"""Registration only; the normalizer is imported when first used."""

from agentrl_core import hookimpl
from agentrl_core.types import AdvantageNormalizerSpec


@hookimpl
def agentrl_advantage_normalizers():
    return [
        AdvantageNormalizerSpec(
            name="task",
            factory="agentrl_advnorm_task.normalizer:TaskNormalizer",
            config_schema="agentrl_advnorm_task.normalizer:TaskNormConfig",
            description="standardize token advantages per task (data_source) in the batch",
        )
    ]
