"""Reasoning parsers: model text -> ``(reasoning, content)`` (the ``agentrl_reasoning_parsers`` hook).

The gateway returns a reply's reasoning apart from its answer, the way OpenAI-compatible
servers (vLLM, SGLang) do: ``message.reasoning_content`` (and, streamed,
``delta.reasoning_content``), with ``content`` holding only the rest. Tool calls are parsed
from the content, so a ``<tool_call>`` written while thinking is not a call.

``parse(text) -> (reasoning, content)`` never raises; ``reasoning`` is ``None`` when the text
has none.

* ``think``: ``<think>reasoning</think>content`` (Qwen3, DeepSeek-R1, QwQ). The opening tag
  may be missing, since some templates write it into the generation prompt; a reply that
  opened ``<think>`` and stopped before ``</think>`` (a length stop) is all reasoning. The
  newlines around the reasoning and at the start of the content are dropped, as Qwen3's
  template drops them when it splits a reply, so the split re-renders to the same text.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ThinkParser"]


class ThinkParser:
    name = "think"
    start_tag = "<think>"
    end_tag = "</think>"

    def __init__(self, config: Any = None, **kwargs: Any) -> None:
        pass

    def parse(self, text: str) -> tuple[str | None, str]:
        if not isinstance(text, str):
            text = str(text)
        if self.end_tag in text:
            before, _, after = text.partition(self.end_tag)
            reasoning = before.split(self.start_tag, 1)[1] if self.start_tag in before else before
            return reasoning.strip("\n"), after.lstrip("\n")
        if self.start_tag in text:  # opened, never closed: the reply stopped while thinking
            before, _, reasoning = text.partition(self.start_tag)
            if not before.strip():
                return reasoning.strip("\n"), ""
        return None, text
