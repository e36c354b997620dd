"""How upstream's task reads a turn: AgentBench-FC ``os_interaction/task.py`` (``tool_arguments: upstream``).

Upstream's ``_handle_agent_action`` takes the first tool call, runs ``json.loads`` on its
arguments and keeps ``list(arguments.values())``; ``_extract_function`` then uses the first
value whatever its key:

* ``bash_action`` runs it (std 111 of a gemma2-9b run: ``{"script": ..., "thought": ...}`` runs
  the script); a value that is not a string runs nothing and answers "The output of the OS is
  empty." (``Container.execute``); ``{}`` raises ``IndexError``;
* ``finish_action`` commits it as the answer, and ``{}`` commits ``None`` (so a ``check`` task
  is scored with the answer ``"None"``: std 51 of a qwen-8b run has reward 1 that way);
* ``answer_action`` commits it (a number stays a number: it never equals a ``match`` answer, and
  a check script gets ``str(answer)``); ``{}`` raises ``IndexError``;
* another tool name answers "Invalid function call. Please call a tool instead"; arguments
  that cannot be read answer the Python exception's text (``Expecting value: line 1 column 1
  (char 0)``).

Where upstream's task raises, its episode ends as ``task error`` with reward 0
(:class:`Crash`). This module only reads; :class:`agentrl_env_os.env.OSSession` acts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from attrs import frozen

from agentrl_core.types import Message

INVALID_FUNCTION = "Invalid function call. Please call a tool instead"


@frozen
class Bash:
    call_id: str
    script: Any  # run only when it is a string


@frozen
class Commit:
    name: str  # finish_action or answer_action
    call_id: str
    answer: Any  # the answer as upstream evaluates it: any JSON value, None for finish_action {}


@frozen
class Reply:
    """A tool message upstream sends instead of acting; the episode goes on."""

    call_id: str
    content: str


@frozen
class Crash:
    """Upstream's task raised here; its episode ended as ``task error`` (reward 0)."""

    error: str


Action = Bash | Commit | Reply | Crash


def read_turn(message: Message) -> Action | None:
    """The first tool call of ``message`` as upstream reads it; None when it has no tool call."""
    calls = message.get("tool_calls") if isinstance(message, Mapping) else None
    if not isinstance(calls, list) or not calls:
        return None
    call = calls[0]
    try:
        name = call["function"]["name"]
    except (KeyError, TypeError) as exc:
        return Crash(f"{type(exc).__name__}: {exc}")
    call_id = str(call.get("id") or "call_0")
    content = message.get("content")
    try:
        arguments = call["function"]["arguments"]
        if isinstance(arguments, str):  # a client that decoded them already: taken as they are
            arguments = json.loads(arguments)
        # Upstream evaluates this (to use the thought as the turn's text), so the same values fail.
        if not content and "thought" in arguments:
            pass
        values = list(arguments.values())
    except Exception as exc:  # upstream answers whatever was raised with str(exc)
        return Reply(call_id, str(exc))
    if name == "bash_action":
        return Bash(call_id, values[0]) if values else Crash("IndexError: list index out of range")
    if name == "finish_action":
        return Commit(name, call_id, values[0] if values else None)
    if name == "answer_action":
        return Commit(name, call_id, values[0]) if values else Crash("IndexError: list index out of range")
    return Reply(call_id, INVALID_FUNCTION)


def match_crashes(answer: Any, match: Mapping[str, Any]) -> bool:
    """Whether upstream's ``_evaluate_by_match`` raises: ``re.search`` on an answer that is not text."""
    return "answer" not in match and "regex" in match and not isinstance(answer, str)
