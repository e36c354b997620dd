"""Registration only; the driver and the transport are imported when first used."""

from agentrl_core import hookimpl
from agentrl_core.types import RolloutEngineSpec, WeightSyncTransportSpec


@hookimpl
def agentrl_rollout_engines():
    return [
        RolloutEngineSpec(
            name="vllm",
            factory="agentrl_engine_vllm.driver:VLLMDriver",
            config_schema="agentrl_engine_vllm.options:VLLMOptions",
            description="vLLM servers (token in/out, per-token log-probs and versions) behind agentrl's protocol",
        )
    ]


@hookimpl
def agentrl_weight_sync_transports():
    return [
        WeightSyncTransportSpec(
            name="vllm_nccl",
            factory="agentrl_engine_vllm.nccl_transport:VLLMNCCLTransport",
            description="vLLM's native NCCL weight transfer to vllm engines on GPUs",
        )
    ]
