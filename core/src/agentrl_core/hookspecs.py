"""Hook specifications: the extension surface of agentrl (docs/architecture.md section 3).

Every hook takes no arguments and returns an iterable of registration records. Core
calls them only through :mod:`agentrl_core.registry`. None is ``firstresult``: every
installed plugin contributes, and duplicate names are an error listing every provider.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from agentrl_core.types import (
        AdvantageEstimatorSpec,
        AdvantageNormalizerSpec,
        AgentLoopSpec,
        AgentProgramSpec,
        ChatTemplateSpec,
        EnvironmentSpec,
        LoggerSpec,
        PolicyLossSpec,
        ReasoningParserSpec,
        RolloutEngineSpec,
        SamplerSpec,
        ToolParserSpec,
        WeightSyncTransportSpec,
    )

PROJECT = "agentrl"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def agentrl_environments() -> Iterable[EnvironmentSpec]:
    """Environments this plugin provides.

    The factory is called with the plugin's validated config section and returns an
    :class:`agentrl_core.protocols.Environment`::

        from agentrl_core import hookimpl
        from agentrl_core.types import EnvironmentSpec

        @hookimpl
        def agentrl_environments():
            return [EnvironmentSpec(
                name="calc",
                factory="agentrl_plugin_example.env:CalcEnvironment",
                config_schema="agentrl_plugin_example.env:CalcConfig",
                description="arithmetic with a calculator tool",
            )]
    """


@hookspec
def agentrl_samplers() -> Iterable[SamplerSpec]:
    """Per-turn pool samplers (built-in: ``current``).

    The factory takes the config section and returns a Sampler with ``pools()`` and
    ``choose(turn_context)``::

        @hookimpl
        def agentrl_samplers():
            return [SamplerSpec(name="cross", factory="agentrl_sampler_cross.sampler:CrossSampler",
                                config_schema="agentrl_sampler_cross.sampler:CrossConfig")]
    """


@hookspec
def agentrl_advantage_estimators() -> Iterable[AdvantageEstimatorSpec]:
    """Group advantage estimators (built-in: ``grpo``, ``rloo``, ``reinforce_pp_baseline``).

    The factory takes the config section and returns a callable
    ``(rewards [B], group_ids, loss_mask [B, L]) -> advantages [B, L]``::

        @hookimpl
        def agentrl_advantage_estimators():
            return [AdvantageEstimatorSpec(name="grpo_no_std", factory="my_pkg.adv:make_grpo_no_std")]
    """


@hookspec
def agentrl_advantage_normalizers() -> Iterable[AdvantageNormalizerSpec]:
    """Batch-level advantage normalizers, run after the estimator in configured order.

    The factory takes the config section and returns a callable
    ``(AdvantageBatch) -> AdvantageBatch``::

        @hookimpl
        def agentrl_advantage_normalizers():
            return [AdvantageNormalizerSpec(name="task", factory="agentrl_advnorm_task.norm:TaskNormalizer",
                                            config_schema="agentrl_advnorm_task.norm:TaskNormConfig")]
    """


@hookspec
def agentrl_policy_losses() -> Iterable[PolicyLossSpec]:
    """Policy losses (built-in: ``ppo_dual_clip``).

    The factory takes the config section and returns a callable
    ``(logprobs, old_logprobs, ref_logprobs, advantages, loss_mask, config) -> (loss, metrics)``::

        @hookimpl
        def agentrl_policy_losses():
            return [PolicyLossSpec(name="gspo", factory="my_pkg.loss:make_gspo")]
    """


@hookspec
def agentrl_weight_sync_transports() -> Iterable[WeightSyncTransportSpec]:
    """How learner weights reach engines (built-in: ``collective``, ``disk``).

    The factory takes the config section and returns a WeightSyncTransport with
    ``connect(learner_rank0, engines)`` and ``send(named_tensors, version)``::

        @hookimpl
        def agentrl_weight_sync_transports():
            return [WeightSyncTransportSpec(name="shm", factory="my_pkg.sync:SharedMemoryTransport")]
    """


@hookspec
def agentrl_rollout_engines() -> Iterable[RolloutEngineSpec]:
    """Engine drivers (built-in: ``hf``, ``sglang``).

    The factory takes the config section and returns an EngineDriver with
    ``launch(pool, model_path, devices) -> [endpoint]`` and ``shutdown()``; when a pool's engines
    are spread over several launchers (one per placement slot), ``launch`` is also given
    ``first_index=k``, the number of this launcher's first engine in the pool, for its engines'
    names (``<pool>-<k>``: logs, port files) and seeds::

        @hookimpl
        def agentrl_rollout_engines():
            return [RolloutEngineSpec(name="vllm", factory="my_pkg.vllm_driver:VLLMDriver")]
    """


@hookspec
def agentrl_tool_parsers() -> Iterable[ToolParserSpec]:
    """Parsers from model text to tool calls (built-in: ``qwen25``, ``hermes``, ``qwen3``, ``qwen3_coder``).

    The factory takes the config section and returns a ToolParser whose
    ``parse(text, tools) -> (calls, normal_text, error)`` never raises::

        @hookimpl
        def agentrl_tool_parsers():
            return [ToolParserSpec(name="llama3_json", factory="my_pkg.parsers:Llama3JsonParser")]
    """


@hookspec
def agentrl_agent_loops() -> Iterable[AgentLoopSpec]:
    """Agent loops that turn a task into a Trajectory (built-in: ``chat``).

    The factory takes the config section and returns an AgentLoop with ``async run(request)``::

        @hookimpl
        def agentrl_agent_loops():
            return [AgentLoopSpec(name="react_text", factory="my_pkg.loop:ReactTextLoop")]
    """


@hookspec
def agentrl_loggers() -> Iterable[LoggerSpec]:
    """Metric sinks (built-in: ``jsonl``, ``tensorboard``).

    The factory takes the config section and the run directory and returns a Logger with
    ``log(step, metrics)`` and ``close()``. The config section is ``logging.<name>``
    (validated by the spec's ``config_schema``); ``agentrl_core.train.loggers.flatten_metrics``
    gives the keys ``metrics.jsonl`` uses::

        @hookimpl
        def agentrl_loggers():
            return [LoggerSpec(name="wandb", factory="my_pkg.wandb_logger:WandbLogger")]
    """


@hookspec
def agentrl_chat_templates() -> Iterable[ChatTemplateSpec]:
    """Chat templates: how a model family renders a conversation (built-in: ``hf``, ``qwen3``).

    The factory takes the config section and the run's tokenizer and returns a ChatTemplate
    whose ``render(messages, tools, *, add_generation_prompt, **template_kwargs)`` returns
    token ids; the gateway renders every prompt through it (``gateway.chat_template``)::

        from agentrl_core import hookimpl
        from agentrl_core.rollout.chat_templates import JinjaChatTemplate
        from agentrl_core.types import ChatTemplateSpec

        class Llama3Template(JinjaChatTemplate):
            template = "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\\n\\n..."

        @hookimpl
        def agentrl_chat_templates():
            return [ChatTemplateSpec(name="llama3", factory="my_pkg.templates:Llama3Template")]
    """


@hookspec
def agentrl_reasoning_parsers() -> Iterable[ReasoningParserSpec]:
    """Parsers that split a reply's reasoning from its answer (built-in: ``think``).

    The factory takes the config section and returns a ReasoningParser whose
    ``parse(text) -> (reasoning or None, content)`` never raises; the gateway returns the
    reasoning as ``reasoning_content`` (``gateway.reasoning_parser``)::

        @hookimpl
        def agentrl_reasoning_parsers():
            return [ReasoningParserSpec(name="gpt_oss", factory="my_pkg.reasoning:HarmonyParser")]
    """


@hookspec
def agentrl_agent_programs() -> Iterable[AgentProgramSpec]:
    """Agent programs: a team's own agent, trained through the gateway (``agent: NAME`` in a config).

    The factory takes the config section (``agent.<name>``) and returns an async function
    ``(task, base_url) -> reward | None``. ``agentrl train`` calls it ``rollout.n_samples``
    times per task; everything the agent sends to ``base_url`` with the OpenAI SDK is captured
    token by token and trained on. ``task`` is an :class:`agentrl_core.gateway.AgentTask`:
    the environment's first messages and tools, and ``task.env.step(message)`` to act::

        from openai import AsyncOpenAI

        from agentrl_core import hookimpl
        from agentrl_core.types import AgentProgramSpec

        async def run(task, base_url):
            client = AsyncOpenAI(base_url=base_url, api_key=task.api_key)
            messages = list(task.messages)
            while not task.env.finished:
                reply = await client.chat.completions.create(model=task.model, messages=messages, tools=task.tools)
                message = reply.choices[0].message.model_dump(exclude_none=True)
                observation = await task.env.step(message)
                messages += [message, *observation.messages]
            return None  # the environment scored the episode

        def make_agent(config):
            return run

        @hookimpl
        def agentrl_agent_programs():
            return [AgentProgramSpec(name="my_agent", factory="my_pkg.agent:make_agent")]
    """
