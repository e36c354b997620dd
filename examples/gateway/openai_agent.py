"""An agent written with the plain ``openai`` SDK, trained unchanged through the agentrl gateway.

Nothing here knows about training: the agent sends the conversation and the environment's
tools to ``/v1/chat/completions`` at ``base_url`` and hands each reply to the environment
(``task.env.step``); the gateway captures every token the model samples, and the
environment scores the episode. It plays any agentrl environment; ``train_calc.yaml``
trains it on ``calc`` (plugin ``agentrl-plugin-example``):

    agentrl train examples/gateway/train_calc.yaml

or try it by hand against a running gateway (core/docs/gateway.md, "Train your own agent").
"""

from __future__ import annotations

from openai import AsyncOpenAI


async def run(task, base_url: str) -> float | None:
    """One episode: ask the model, act, repeat until the environment ends the episode."""
    async with AsyncOpenAI(base_url=base_url, api_key=task.api_key, max_retries=3) as client:
        messages = list(task.messages)
        while not task.env.finished:
            response = await client.chat.completions.create(model=task.model, messages=messages, tools=task.tools)
            reply = response.choices[0].message
            observation = await task.env.step(reply)  # the first tool call acts; a reply without one gets an error
            messages.append(reply.model_dump(exclude_none=True))
            messages.extend(observation.messages)
    return None  # the environment scored the episode
