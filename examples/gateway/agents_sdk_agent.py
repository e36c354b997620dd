"""An agent written with the OpenAI Agents SDK (``pip install openai-agents``), trained through the gateway.

The environment's tools become the Agents SDK's function tools; each invocation is one
environment step. The SDK ends a run when the model answers in text: that answer goes to
the environment too (a text answer is a turn like any other), and the run continues with
the environment's reply, until the environment ends the episode. The model is reached
only through ``base_url`` with ``OpenAIChatCompletionsModel``, so the gateway sees every call.
Train it on ``calc`` with ``agentrl train examples/gateway/train_calc.yaml --set
agent=examples/gateway/agents_sdk_agent.py:run``.
"""

from __future__ import annotations

from typing import Any

from agents import (
    Agent,
    FunctionTool,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    ToolsToFinalOutputResult,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

set_tracing_disabled(True)  # no trace export: training machines need not reach OpenAI


def environment_tools(task) -> list[FunctionTool]:
    """One Agents SDK tool per environment tool; calling it is one environment step."""

    def make(name: str) -> Any:
        async def invoke(context, arguments: str) -> str:
            call = {"id": getattr(context, "tool_call_id", None) or "call_0", "type": "function",
                    "function": {"name": name, "arguments": arguments or "{}"}}
            observation = await task.env.step({"role": "assistant", "content": "", "tool_calls": [call]})
            return "\n".join(m.get("content") or "" for m in observation.messages) or "(no output)"

        return invoke

    tools = []
    for spec in task.tools:
        function = spec["function"]
        tools.append(FunctionTool(
            name=function["name"], description=function.get("description", ""),
            params_json_schema=function.get("parameters") or {"type": "object", "properties": {}},
            on_invoke_tool=make(function["name"]), strict_json_schema=False,
        ))
    return tools


async def run(task, base_url: str) -> float | None:
    client = AsyncOpenAI(base_url=base_url, api_key=task.api_key, max_retries=3)

    def stop_when_the_episode_ends(context, results) -> ToolsToFinalOutputResult:
        return ToolsToFinalOutputResult(is_final_output=task.env.finished,
                                        final_output="episode finished" if task.env.finished else None)

    agent = Agent(
        name="environment agent",
        instructions="\n".join(m["content"] for m in task.messages if m["role"] == "system") or None,
        model=OpenAIChatCompletionsModel(model=task.model, openai_client=client),
        model_settings=ModelSettings(parallel_tool_calls=False),
        tools=environment_tools(task),
        tool_use_behavior=stop_when_the_episode_ends,
    )
    conversation: list[Any] = [m for m in task.messages if m["role"] != "system"]
    try:
        while not task.env.finished:
            result = await Runner.run(agent, conversation, max_turns=50)
            conversation = result.to_input_list()
            if not task.env.finished:  # the model answered in text: that answer is its turn
                observation = await task.env.step({"role": "assistant", "content": str(result.final_output or "")})
                conversation += [{"role": "user", "content": m.get("content") or ""} for m in observation.messages]
    finally:
        await client.close()
    return None  # the environment scored the episode
