"""Play an environment with a scripted agent, and the demonstration file format.

Demonstrations are message-level JSONL, one episode per line, tokenizer-independent::

    {"task": "calc", "split": "train", "index": 3, "tools": [...],
     "messages": [{"role": "system", ...}, {"role": "user", ...}, {"role": "assistant", ...}, ...],
     "reward": 1.0, "status": "completed"}

``agentrl demos`` writes them from an environment's oracle; ``agentrl sft`` trains on them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs
from attrs import frozen

from agentrl_core.errors import AgentrlError
from agentrl_core.protocols import Agent, Environment
from agentrl_core.types import Index, Message, Status

DEMO_KEYS = ("task", "split", "index", "tools", "messages", "reward", "status")


@frozen
class Episode:
    task: str
    split: str
    index: Index
    tools: list[dict[str, Any]]
    messages: list[Message]
    reward: float
    status: Status = attrs.field(converter=Status)
    metrics: dict[str, Any] = attrs.field(factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "split": self.split,
            "index": self.index,
            "tools": self.tools,
            "messages": self.messages,
            "reward": self.reward,
            "status": self.status.value,
            "metrics": self.metrics,
        }


async def play_episode(env: Environment, split: str, index: Index, agent: Agent, *, max_steps: int = 100) -> Episode:
    """Run one episode of ``env`` with ``agent``; the session is always closed."""
    session = await env.open(split, index)
    messages: list[Message] = []
    try:
        step = await session.start()
        messages.extend(step.messages)
        steps = 0
        while not step.finish:
            if steps >= max_steps:
                raise AgentrlError(f"{env.name}/{split}/{index}: episode did not finish within {max_steps} steps")
            action = agent.act(list(messages))
            messages.append(action)
            step = await session.step(action)
            messages.extend(step.messages)
            steps += 1
    finally:
        await session.close()
    return Episode(env.name, split, index, list(env.tools), messages, step.reward, step.status, dict(step.metrics))


def write_demonstrations(path: str | Path, episodes: Iterable[Episode | dict[str, Any]]) -> int:
    """Write episodes as JSONL; returns how many were written."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for ep in episodes:
            record = ep.to_json() if isinstance(ep, Episode) else ep
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            n += 1
    return n


def read_demonstrations(path: str | Path) -> Iterator[dict[str, Any]]:
    """Read and check a demonstration file; a bad line fails with its line number."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise AgentrlError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            missing = [k for k in DEMO_KEYS if k not in record]
            if missing:
                raise AgentrlError(f"{path}:{lineno}: demonstration is missing {', '.join(missing)}")
            if not isinstance(record["messages"], list) or not record["messages"]:
                raise AgentrlError(f"{path}:{lineno}: 'messages' must be a non-empty list")
            yield record
