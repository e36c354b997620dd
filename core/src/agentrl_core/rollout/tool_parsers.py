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
* ``qwen3``: Qwen3's calls, the same JSON blocks as ``qwen25``.
* ``qwen3_coder``: Qwen3-Coder's XML calls (``<function=f>`` with a ``<parameter=a>`` block
  per argument inside ``<tool_call>``), with values typed by the tool's schema.

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

__all__ = ["Qwen25Parser", "HermesParser", "Qwen3Parser", "Qwen3CoderParser", "ToolCallBlockParser"]

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
            return self._parse(text if isinstance(text, str) else str(text), tools or ())
        except Exception as exc:  # never raise: a parser bug must not kill a rollout
            return [], str(text), f"the tool-call parser failed on this reply ({type(exc).__name__}: {exc})"

    def _parse(self, text: str, tools: Sequence[dict[str, Any]]) -> tuple[ToolCalls, str, str | None]:
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
            call, problem = self._read_call(payload, tools)
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

    def _read_call(self, payload: str, tools: Sequence[dict[str, Any]]) -> tuple[tuple[str, dict[str, Any]], None] | tuple[None, str]:
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


class Qwen3Parser(ToolCallBlockParser):
    """Qwen3's format: the same ``<tool_call>`` JSON blocks as Qwen2.5's."""

    name = "qwen3"


class Qwen3CoderParser(ToolCallBlockParser):
    """Qwen3-Coder's XML calls: ``<function=f>`` with one ``<parameter=p>`` block per argument.

    A parameter's text (without the newline after its tag and before its closing tag) is
    converted by the tool's JSON schema: integers, numbers, booleans, null, objects and
    arrays are read as JSON; anything else, and every parameter of an unknown tool or
    property, stays a string.
    """

    name = "qwen3_coder"
    _function = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|\Z)", re.S)
    _parameter = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.S)

    def _read_call(self, payload: str, tools: Sequence[dict[str, Any]]) -> tuple[tuple[str, dict[str, Any]], None] | tuple[None, str]:
        match = self._function.search(payload)
        if match is None:
            return None, f"has no <function=name> tag: {_clip(payload)}"
        name = match.group(1).strip()
        if not name:
            return None, f"has an empty function name: {_clip(payload)}"
        schema = _properties(tools, name)
        arguments: dict[str, Any] = {}
        for param in self._parameter.finditer(match.group(2)):
            key = param.group(1).strip()
            value = param.group(2)
            value = value[1:] if value.startswith("\n") else value
            value = value[:-1] if value.endswith("\n") else value
            arguments[key] = _typed(value, schema.get(key))
        return (name, arguments), None


def _properties(tools: Sequence[dict[str, Any]], name: str) -> dict[str, Any]:
    for tool in tools or ():
        function = tool.get("function", tool) if isinstance(tool, dict) else {}
        if isinstance(function, dict) and function.get("name") == name:
            props = (function.get("parameters") or {}).get("properties") or {}
            return props if isinstance(props, dict) else {}
    return {}


def _typed(value: str, schema: Any) -> Any:
    kinds = schema.get("type") if isinstance(schema, dict) else None
    kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
    if not kinds or kinds == ["string"]:
        return value
    try:
        decoded = json.loads(value)
    except (json.JSONDecodeError, RecursionError):
        return value
    checks = {"integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
              "boolean": lambda v: isinstance(v, bool), "null": lambda v: v is None,
              "object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list)}
    return decoded if any(checks.get(k, lambda v: False)(decoded) for k in kinds) else value


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
