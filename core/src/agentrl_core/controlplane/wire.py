"""Field parsing shared by the task worker and the controller (docs/architecture.md section 4).

Everything a peer sends is checked here once, with one-sentence reasons (a 400 each), so
handlers can trust their inputs. Session ids are non-negative integers, in a JSON body or
the ``session_id`` header as decimal text; indices are ints or strings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentrl_core.http.server import HTTPError
from agentrl_core.types import Index, Message, Status, Step

MAX_SESSION_ID = 2**63 - 1


def parse_session_id(value: Any, where: str = "session_id") -> int:
    if isinstance(value, bool):
        raise HTTPError(400, f"{where} must be an integer, got {value!r}")
    if isinstance(value, str):
        text = value.strip()
        if not text.isdigit() or not text.isascii():
            raise HTTPError(400, f"{where} must be a non-negative integer, got {value[:40]!r}")
        value = int(text)
    if not isinstance(value, int):
        raise HTTPError(400, f"{where} must be an integer, got {type(value).__name__}")
    if not 0 <= value <= MAX_SESSION_ID:
        raise HTTPError(400, f"{where} {value} is out of range")
    return value


def session_id_from(request: Any, body: Mapping[str, Any] | None = None) -> int:
    """The session id from the ``session_id`` header, else from the body (older clients)."""
    header = request.header(b"session_id")
    if header is not None:
        return parse_session_id(header, "the session_id header")
    if body is not None and "session_id" in body:
        return parse_session_id(body["session_id"])
    raise HTTPError(400, "the request has no session_id header")


def parse_index(value: Any) -> Index:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise HTTPError(400, f"index must be an integer or a string, got {type(value).__name__}")
    if isinstance(value, int) and abs(value) > MAX_SESSION_ID:
        raise HTTPError(400, f"index {value} is out of range")
    return value


def check_indices(value: Any) -> list[Index]:
    if not isinstance(value, list):
        raise HTTPError(400, f"indices must be a list, got {type(value).__name__}")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int | str):
            raise HTTPError(400, f"indices must hold only integers and strings, found {item!r:.40}")
    return value


class IndexSet:
    """A task's indices with O(1) membership and upstream's int-onto-string mapping."""

    __slots__ = ("indices", "_lookup", "_strings")

    def __init__(self, indices: Sequence[Index]) -> None:
        self.indices = list(indices)
        self._lookup = set(self.indices)
        self._strings = bool(self.indices) and all(isinstance(i, str) for i in self.indices)

    def __len__(self) -> int:
        return len(self.indices)

    def normalize(self, index: Index) -> Index | None:
        """``index`` as the task knows it, or None when it is not one of its indices."""
        if index in self._lookup:
            return index
        if isinstance(index, str):
            text = index.strip()
            if text.lstrip("-").isdigit() and text.isascii() and int(text) in self._lookup:
                return int(text)
        elif self._strings and 0 <= index < len(self.indices):
            return self.indices[index]
        return None


def parse_messages(value: Any) -> list[Message]:
    if not isinstance(value, list) or not value:
        raise HTTPError(400, "messages must be a non-empty list of chat messages")
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise HTTPError(400, f"messages[{i}] must be an object, got {type(message).__name__}")
        role = message.get("role", "assistant")
        if not isinstance(role, str):
            raise HTTPError(400, f"messages[{i}].role must be a string")
    return value


def assistant_message(messages: list[Message]) -> Message:
    """The assistant message of one interact: the last one with role assistant."""
    for message in reversed(messages):
        if message.get("role", "assistant") == "assistant":
            return message
    raise HTTPError(400, "messages hold no assistant message to act on")


def env_out(step: Step, tools: list[dict] | None = None) -> dict[str, Any]:
    """A Step in the worker's wire format (``metric``, as upstream workers send it)."""
    out = {
        "messages": step.messages,
        "status": step.status.value,
        "finish": step.finish,
        "reward": step.reward,
        "metric": step.metrics,
    }
    if tools is not None:
        out["tools"] = tools
    return out


def failure_out(status: Status, reason: str) -> dict[str, Any]:
    """An env_out for a session that ended without a step (task error, cancelled)."""
    return {"messages": [], "status": status.value, "finish": True, "reward": 0.0, "metric": {"error": reason}}


def to_client(out: Mapping[str, Any]) -> dict[str, Any]:
    """A worker's env_out as the client sees it: ``metric`` becomes ``metrics``."""
    result = dict(out)
    if "metric" in result:
        result["metrics"] = result.pop("metric")
    result.setdefault("metrics", {})
    return result


def finished(out: Mapping[str, Any]) -> bool:
    status = out.get("status")
    return bool(out.get("finish")) or (isinstance(status, str) and status != Status.RUNNING.value)
