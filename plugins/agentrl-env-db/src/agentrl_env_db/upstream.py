"""How upstream's task reads a turn: AgentBench-FC ``dbbench/task.py`` (``tool_arguments: upstream``).

Upstream does not check tool arguments against the schemas it sends. For each tool call it
runs ``json.loads`` on the arguments and takes ``list(arguments.values())[0]``, the first
value whatever its key:

* ``execute_sql {"query:": "UPDATE ..."}`` runs the statement (std 288, 281, 244 and 200 of a
  gemma2-9b run are won that way);
* ``execute_sql {}`` answers ``Error executing query: list index out of range`` and a value
  that is not a string goes to MySQL's driver as it is: an empty one (``""``, ``[]``, ``0``,
  ``null``) runs nothing and answers ``[]``, any other ``'<type>' object has no attribute
  'encode'`` (std 158 of a qwen-4b run: ``execute_sql {"answers": ["10"]}``);
* ``commit_final_answer`` scores the first value; ``{}``, arguments that are not an object and
  an answer that is neither a string, a list nor empty make upstream's task raise, which
  upstream reports as ``task error``;
* arguments that are not JSON answer ``Error: Failed to parse tool call. Tool call format is
  incorrect.``, another tool name ``Invalid function call. Please call a tool instead.``, a
  turn without a tool call ``Internal error: No tool calls found despite finish reason.``
  (a user message).

This module only reads; :class:`agentrl_env_db.env.DBSession` acts on what it finds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from attrs import frozen

from agentrl_core.types import Message

NO_TOOL_CALL = "Internal error: No tool calls found despite finish reason."
PARSE_ERROR = "Error: Failed to parse tool call. Tool call format is incorrect."
INVALID_FUNCTION = "Invalid function call. Please call a tool instead."


class Unreadable(Exception):
    """Upstream could not take the first value of the arguments (the message is the exception's)."""


@frozen
class UpstreamCall:
    """The first tool call of a turn as upstream sees it; ``arguments`` is None when not JSON."""

    name: str
    call_id: str
    arguments: Any
    parsed: bool


def first_call(message: Message) -> UpstreamCall | None:
    """The turn's first tool call read as upstream reads it; None when there is none."""
    calls = message.get("tool_calls") if isinstance(message, Mapping) else None
    if not isinstance(calls, list) or not calls:
        return None
    call = calls[0] if isinstance(calls[0], Mapping) else {}
    function = call.get("function") if isinstance(call.get("function"), Mapping) else {}
    name = function.get("name", "")
    call_id = str(call.get("id", "") or "call_0")
    raw = function.get("arguments", "{}")
    if not isinstance(raw, str):  # already decoded by the client (upstream's clients send text)
        return UpstreamCall(str(name), call_id, raw, parsed=True)
    try:
        return UpstreamCall(str(name), call_id, json.loads(raw), parsed=True)
    except ValueError:
        return UpstreamCall(str(name), call_id, None, parsed=False)


def first_value(arguments: Any) -> Any:
    """``list(arguments.values())[0]``, raising :class:`Unreadable` with Python's message as upstream's."""
    try:
        return list(arguments.values())[0]
    except (AttributeError, IndexError) as exc:
        raise Unreadable(str(exc)) from None


def driver_answer(value: Any) -> str | None:
    """What upstream's MySQL driver answers for a statement that is not a non-empty string.

    ``cursor.execute`` returns at once for an empty operation (``if not operation``), so the
    task prints ``[]``; any other value fails at ``operation.encode(...)``. None: a statement
    to run.
    """
    if isinstance(value, str) and value:
        return None
    if not value:
        return "[]"
    return f"'{type(value).__name__}' object has no attribute 'encode'"


def answer_crashes(answer: Any) -> bool:
    """Whether upstream's ``commit_final_answer`` raises on this answer (it logs ``answer[:100]``)."""
    return bool(answer) and not isinstance(answer, str | list)
