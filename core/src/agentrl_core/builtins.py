"""Core's own components, registered explicitly by the plugin manager.

Factories are ``"module:attr"`` strings so that nothing heavy (torch, transformers) is
imported until a component is used.
"""

from __future__ import annotations

from agentrl_core.hookspecs import hookimpl
from agentrl_core.types import (
    AdvantageEstimatorSpec,
    AgentLoopSpec,
    ChatTemplateSpec,
    LoggerSpec,
    PolicyLossSpec,
    ReasoningParserSpec,
    RolloutEngineSpec,
    SamplerSpec,
    ToolParserSpec,
    WeightSyncTransportSpec,
)


@hookimpl
def agentrl_samplers():
    return [
        SamplerSpec(
            name="current",
            factory="agentrl_core.rollout.sampler:CurrentSampler",
            description="every turn from the current-policy pool",
        )
    ]


@hookimpl
def agentrl_advantage_estimators():
    return [
        AdvantageEstimatorSpec(
            name="grpo", factory="agentrl_core.train.advantages:grpo_estimator",
            description="(r - group mean) / (group std + 1e-6)",
        ),
        AdvantageEstimatorSpec(
            name="grpo_negated", factory="agentrl_core.train.advantages:grpo_negated_estimator",
            description="minus grpo: a control run that must not learn (benchmarks/learning.py)",
        ),
        AdvantageEstimatorSpec(
            name="rloo", factory="agentrl_core.train.advantages:rloo_estimator",
            description="leave-one-out baseline",
        ),
        AdvantageEstimatorSpec(
            name="reinforce_pp_baseline",
            factory="agentrl_core.train.advantages:reinforce_pp_baseline_estimator",
            description="r - group mean, then masked whitening over the batch",
        ),
    ]


@hookimpl
def agentrl_policy_losses():
    return [
        PolicyLossSpec(
            name="ppo_dual_clip", factory="agentrl_core.train.losses:ppo_dual_clip_loss",
            description="dual-clip PPO with k3 KL to a frozen reference",
        )
    ]


@hookimpl
def agentrl_weight_sync_transports():
    return [
        WeightSyncTransportSpec(
            name="collective", factory="agentrl_core.train.weight_sync:CollectiveTransport",
            description="torch.distributed broadcast in buckets (gloo on CPU, nccl on GPU)",
        ),
        WeightSyncTransportSpec(
            name="disk", factory="agentrl_core.train.weight_sync:DiskTransport",
            description="safetensors on a shared path, then reload",
        ),
    ]


@hookimpl
def agentrl_rollout_engines():
    return [
        RolloutEngineSpec(
            name="hf", factory="agentrl_core.rollout.hf_driver:HFDriver",
            description="agentrl's transformers engine server with continuous batching",
        ),
        RolloutEngineSpec(
            name="sglang", factory="agentrl_core.rollout.sglang_driver:SGLangDriver",
            description="SGLang servers on GPUs",
        ),
    ]


@hookimpl
def agentrl_tool_parsers():
    return [
        ToolParserSpec(
            name="qwen25", factory="agentrl_core.rollout.tool_parsers:Qwen25Parser",
            description="<tool_call>{json}</tool_call> blocks (Qwen2.5)",
        ),
        ToolParserSpec(
            name="hermes", factory="agentrl_core.rollout.tool_parsers:HermesParser",
            description="Hermes-2-Pro style tool calls",
        ),
        ToolParserSpec(
            name="qwen3", factory="agentrl_core.rollout.tool_parsers:Qwen3Parser",
            description="<tool_call>{json}</tool_call> blocks (Qwen3)",
        ),
        ToolParserSpec(
            name="qwen3_coder", factory="agentrl_core.rollout.tool_parsers:Qwen3CoderParser",
            description="<function=f><parameter=a> XML calls (Qwen3-Coder)",
        ),
    ]


@hookimpl
def agentrl_chat_templates():
    return [
        ChatTemplateSpec(
            name="hf", factory="agentrl_core.rollout.chat_templates:HFChatTemplate",
            description="the tokenizer's own template (or model.chat_template)",
        ),
        ChatTemplateSpec(
            name="qwen3", factory="agentrl_core.rollout.chat_templates:Qwen3ChatTemplate",
            description="Qwen3's format: <think> kept only after the last user query",
        ),
    ]


@hookimpl
def agentrl_reasoning_parsers():
    return [
        ReasoningParserSpec(
            name="think", factory="agentrl_core.rollout.reasoning_parsers:ThinkParser",
            description="<think>reasoning</think> (Qwen3, DeepSeek-R1)",
        )
    ]


@hookimpl
def agentrl_agent_loops():
    return [
        AgentLoopSpec(
            name="chat", factory="agentrl_core.rollout.agent_loop:ChatAgentLoop",
            description="multi-turn chat with tools, token-exact masks",
        )
    ]


@hookimpl
def agentrl_loggers():
    return [
        LoggerSpec(name="jsonl", factory="agentrl_core.train.loggers:JsonlLogger", description="metrics.jsonl"),
        LoggerSpec(
            name="tensorboard", factory="agentrl_core.train.loggers:TensorboardLogger",
            description="TensorBoard event files",
        ),
    ]
