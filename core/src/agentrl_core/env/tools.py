"""OpenAI function tools: schema checks, argument validation and error observations.

Environments declare tools as OpenAI function schemas::

    {"type": "function", "function": {"name": "execute_sql", "description": "...",
     "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                    "required": ["query"], "additionalProperties": False}}}

:func:`first_tool_call` turns an assistant message into one validated :class:`ToolCall` or
a :class:`BadTurn` that the environment answers with an error observation while the
episode continues (docs/architecture.md section 4).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from attrs import frozen

from agentrl_core.types import Message

_JSON_TYPES = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


@frozen
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str


@frozen
class BadTurn:
    """Why an assistant message could not be executed, and the observation to send back."""

    reason: str
    observation: list[Message]


def function_tool(name: str, description: str, properties: Mapping[str, Any], required: Sequence[str] = ()) -> dict:
    """Build a strict OpenAI function tool schema."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": dict(properties),
                "required": list(required),
                "additionalProperties": False,
            },
        },
    }


def tool_schema_errors(tool: Any) -> list[str]:
    """Problems that make ``tool`` an invalid OpenAI function schema (empty if valid)."""
    errors: list[str] = []
    if not isinstance(tool, Mapping) or tool.get("type") != "function":
        return [f"tool {tool!r} must be a mapping with type 'function'"]
    fn = tool.get("function")
    if not isinstance(fn, Mapping):
        return ["tool is missing its 'function' mapping"]
    name = fn.get("name")
    if not isinstance(name, str) or not name or not all(c.isalnum() or c in "_-" for c in name) or len(name) > 64:
        errors.append(f"function name {name!r} must be 1-64 characters of letters, digits, '_' or '-'")
    if "description" in fn and not isinstance(fn["description"], str):
        errors.append(f"{name}: description must be a string")
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, Mapping) or params.get("type") != "object":
        errors.append(f"{name}: parameters must be a JSON schema of type 'object'")
        return errors
    props = params.get("properties", {})
    if not isinstance(props, Mapping):
        errors.append(f"{name}: parameters.properties must be a mapping")
        return errors
    for prop, schema in props.items():
        if not isinstance(schema, Mapping):
            errors.append(f"{name}.{prop}: schema must be a mapping")
        elif "type" in schema and _type_names(schema["type"]) - set(_JSON_TYPES):
            errors.append(f"{name}.{prop}: unknown JSON type {schema['type']!r}")
    for req in params.get("required", []):
        if req not in props:
            errors.append(f"{name}: required parameter {req!r} is not in properties")
    return errors


def _type_names(value: Any) -> set[str]:
    return set(value) if isinstance(value, list) else {value}


def validate_value(schema: Mapping[str, Any], value: Any, path: str) -> str | None:
    """Check ``value`` against a (small subset of) JSON schema; return the first problem."""
    if "type" in schema:
        names = _type_names(schema["type"])
        ok = False
        for t in names:
            pytypes = _JSON_TYPES.get(t, ())
            if isinstance(value, bool) and t in ("integer", "number"):
                continue
            if isinstance(value, pytypes):
                ok = True
                break
        if not ok:
            return f"{path} must be of type {' or '.join(sorted(names))}, got {json.dumps(value)[:80]}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{path} must be one of {schema['enum']}, got {json.dumps(value)[:80]}"
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            problem = validate_value(schema["items"], item, f"{path}[{i}]")
            if problem:
                return problem
    if isinstance(value, dict) and "properties" in schema:
        return validate_arguments(schema, value, path)
    return None


def validate_arguments(parameters: Mapping[str, Any], arguments: Mapping[str, Any], path: str = "arguments") -> str | None:
    props = parameters.get("properties", {})
    for req in parameters.get("required", []):
        if req not in arguments:
            return f"missing required argument {req!r}"
    if parameters.get("additionalProperties", True) is False:
        extra = sorted(set(arguments) - set(props))
        if extra:
            return f"unexpected argument {extra[0]!r} (expected: {', '.join(props) or 'none'})"
    for key, value in arguments.items():
        if key in props:
            problem = validate_value(props[key], value, key)
            if problem:
                return problem
    return None


def tool_names(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    return [t["function"]["name"] for t in tools]


def error_observation(reason: str, call_id: str | None = None) -> list[Message]:
    """The observation for a bad turn: a tool message if there was a call, else a user message."""
    if call_id is not None:
        return [{"role": "tool", "tool_call_id": call_id, "content": f"Error: {reason}"}]
    return [{"role": "user", "content": f"Error: {reason}"}]


def tool_calls_of(message: Message) -> list[dict[str, Any]]:
    calls = message.get("tool_calls") or []
    return list(calls) if isinstance(calls, list) else []


def parse_tool_call(call: Any, tools: Sequence[Mapping[str, Any]]) -> ToolCall | BadTurn:
    """Validate one OpenAI ``tool_calls`` entry against the declared tools."""
    call_id = call.get("id") if isinstance(call, Mapping) else None
    call_id = str(call_id) if call_id is not None else "call_0"
    fn = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        reason = "the tool call has no function name"
        return BadTurn(reason, error_observation(reason, call_id))
    name = fn["name"]
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    if name not in by_name:
        reason = f"unknown tool {name!r}; available tools: {', '.join(by_name)}"
        return BadTurn(reason, error_observation(reason, call_id))
    raw = fn.get("arguments", "{}")
    if isinstance(raw, str):
        try:
            arguments = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as exc:
            reason = f"the arguments of {name} are not valid JSON ({exc.msg} at position {exc.pos})"
            return BadTurn(reason, error_observation(reason, call_id))
    else:
        arguments = raw
    if not isinstance(arguments, dict):
        reason = f"the arguments of {name} must be a JSON object"
        return BadTurn(reason, error_observation(reason, call_id))
    problem = validate_arguments(by_name[name].get("parameters", {}), arguments)
    if problem:
        reason = f"invalid arguments for {name}: {problem}"
        return BadTurn(reason, error_observation(reason, call_id))
    return ToolCall(name=name, arguments=arguments, id=call_id)


def first_tool_call(message: Message, tools: Sequence[Mapping[str, Any]]) -> ToolCall | BadTurn:
    """The first tool call of an assistant message (AgentBench FC uses only the first)."""
    if not isinstance(message, Mapping) or message.get("role", "assistant") != "assistant":
        reason = "expected an assistant message"
        return BadTurn(reason, error_observation(reason))
    calls = tool_calls_of(message)
    if not calls:
        reason = f"no tool call found; call one of the tools: {', '.join(tool_names(tools))}"
        return BadTurn(reason, error_observation(reason))
    return parse_tool_call(calls[0], tools)


def tool_result(call: ToolCall, content: str) -> Message:
    return {"role": "tool", "tool_call_id": call.id, "content": content}


def assistant_tool_call(name: str, arguments: Mapping[str, Any], *, call_id: str = "call_0", content: str = "") -> Message:
    """An assistant message with one tool call (used by oracles and tests)."""
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        ],
    }
