"""Tool-call parsers: model text -> OpenAI ``tool_calls`` (the ``agentrl_tool_parsers`` hook).

``parse(text, tools) -> (calls, normal_text, error)`` never raises:

* ``calls``: OpenAI tool calls, ``{"id", "type": "function", "function": {"name",
  "arguments": <JSON string>}}``, one per well-formed block, in order;
* ``normal_text``: the text outside the tool-call blocks, stripped (the text unchanged
  when there is no block);
* ``error``: ``None``, or one sentence saying which block was malformed and why. A
  malformed block yields no call; the other blocks of the reply still do. The agent
  loop sends the assistant message as parsed, and the environment answers a reply
  without a usable call with an error observation (docs/architecture.md section 4).

Call names are not checked against ``tools``: an unknown tool is the environment's to
answer (it counts it as an invalid turn), so the parser does not hide it.

Formats:

* ``qwen25``: ``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>``, several
  per reply (Qwen2.5's template). Strict JSON; ``parameters`` is accepted for ``arguments``
  and arguments given as a JSON string are decoded.
* ``hermes``: the same tags (Hermes-2-Pro / NousResearch), whose prompt shows the call as a
  Python dict (``{'arguments': ..., 'name': ...}``), so a block that is not JSON is read as
  a Python literal before it is called malformed.

A block left open at the end of the text (the reply stopped before ``</tool_call>``) is
parsed like a closed one.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["Qwen25Parser", "HermesParser", "ToolCallBlockParser"]

ToolCalls = list[dict[str, Any]]


class ToolCallBlockParser:
    """Parses ``<open>payload</close>`` blocks whose payload is a JSON object with name and arguments."""

    name = "tool_call_blocks"
    open_tag = "<tool_call>"
    close_tag = "</tool_call>"
    python_literals = False

    def __init__(self, config: Any = None, **kwargs: Any) -> None:
        self._block = re.compile(re.escape(self.open_tag) + r"(.*?)(?:" + re.escape(self.close_tag) + r"|\Z)", re.S)

    def parse(self, text: str, tools: Sequence[dict[str, Any]] | None = None) -> tuple[ToolCalls, str, str | None]:
        try:
            return self._parse(text if isinstance(text, str) else str(text))
        except Exception as exc:  # never raise: a parser bug must not kill a rollout
            return [], str(text), f"the tool-call parser failed on this reply ({type(exc).__name__}: {exc})"

    def _parse(self, text: str) -> tuple[ToolCalls, str, str | None]:
        if self.open_tag not in text:
            stray = self.close_tag in text
            return [], text, (f"the reply has {self.close_tag} without {self.open_tag}" if stray else None)
        calls: ToolCalls = []
        problems: list[str] = []
        outside: list[str] = []
        position = 0
        blocks = list(self._block.finditer(text))
        for number, match in enumerate(blocks, start=1):
            outside.append(text[position : match.start()])
            position = match.end()
            payload = match.group(1).strip()
            call, problem = self._read_call(payload)
            label = f"tool call {number}" if len(blocks) > 1 else "the tool call"
            if problem is not None:
                problems.append(f"{label} {problem}")
            else:
                name, arguments = call
                calls.append(_openai_call(name, arguments, text, number))
        outside.append(text[position:])
        normal_text = "".join(outside).strip()
        error = "; ".join(problems) if problems else None
        if error and len(error) > 400:
            error = error[:397] + "..."
        return calls, normal_text, error

    def _read_call(self, payload: str) -> tuple[tuple[str, dict[str, Any]], None] | tuple[None, str]:
        if not payload:
            return None, f"is empty: write a JSON object between {self.open_tag} and {self.close_tag}"
        try:
            obj = json.loads(payload)
        except json.JSONDecodeError as exc:
            obj = _python_literal(payload) if self.python_literals else None
            if obj is None:
                return None, f"is not valid JSON ({exc.msg} at position {exc.pos}): {_clip(payload)}"
        if not isinstance(obj, dict):
            return None, f"must be a JSON object with \"name\" and \"arguments\", got {_clip(payload)}"
        name = obj.get("name")
        if not isinstance(name, str) or not name:
            return None, f"has no \"name\" string: {_clip(payload)}"
        arguments = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                return None, f"to {name!r} has \"arguments\" that are a string but not JSON: {_clip(arguments)}"
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            return None, f"to {name!r} must have \"arguments\" as a JSON object, got {_clip(json.dumps(arguments))}"
        return (name, arguments), None


class Qwen25Parser(ToolCallBlockParser):
    name = "qwen25"


class HermesParser(ToolCallBlockParser):
    name = "hermes"
    python_literals = True


def _python_literal(payload: str) -> Any:
    try:
        return ast.literal_eval(payload)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _openai_call(name: str, arguments: dict[str, Any], text: str, number: int) -> dict[str, Any]:
    # Deterministic ids (same reply, same ids) keep rollouts reproducible; unique within a reply.
    digest = hashlib.sha1(f"{number}\0{text}".encode("utf-8", "replace")).hexdigest()[:24]
    return {
        "id": f"call_{digest}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def _clip(text: str, limit: int = 80) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
