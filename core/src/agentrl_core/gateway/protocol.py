"""The OpenAI wire format the gateway speaks: request records, response bodies, errors.

Kept apart from the serving (as vLLM's ``entrypoints/openai`` keeps its protocol module):
:func:`parse_chat_request` and :func:`parse_completion_request` turn a JSON body into a
frozen record or raise :class:`OpenAIError` naming the field; the ``*_body`` and
``*_chunks`` functions build what goes back. Errors have OpenAI's shape,
``{"error": {"message", "type", "param", "code"}}``, with the matching status code.

Reasoning comes back as ``message.reasoning`` and ``message.reasoning_content`` (the same
text: vLLM's current name and the name SGLang, DeepSeek and older vLLM use); either is
accepted on assistant messages sent back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from attrs import field, frozen

from agentrl_core.http.server import Response, dumps, json_response
from agentrl_core.types import Message

SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


class OpenAIError(Exception):
    """Answer with OpenAI's error shape and ``status``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = list(headers)

    def response(self) -> Response:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return json_response(body, self.status, self.headers)


def bad_request(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param)


def unauthorized(message: str) -> OpenAIError:
    return OpenAIError(401, message, type="authentication_error", code="invalid_api_key")


@frozen
class SamplingRequest:
    """What the client asked of the sampler (``None``: not given)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    max_tokens: int | None = None
    stop: list[str] = field(factory=list)
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None


@frozen
class ChatRequest:
    model: str
    messages: list[Message]
    tools: list[dict[str, Any]] | None
    tool_choice: str
    sampling: SamplingRequest
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    template_kwargs: dict[str, Any] = field(factory=dict)


@frozen
class CompletionRequest:
    model: str
    prompt: str | list[int]
    sampling: SamplingRequest
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    echo: bool = False


def _number(body: dict[str, Any], key: str, kind: type, lo: float | None = None, hi: float | None = None) -> Any:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and not isinstance(value, int)):
        raise bad_request(f"{key} must be a{'n integer' if kind is int else ' number'}, got {value!r}", key)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise bad_request(f"{key} must be between {lo} and {hi}, got {value!r}", key)
    return kind(value)


def _sampling(body: dict[str, Any]) -> SamplingRequest:
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise bad_request("stop must be a string or a list of strings", "stop")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise bad_request(f"max_tokens must be a positive integer, got {max_tokens!r}", "max_tokens")
    if body.get("n", 1) not in (1, None):
        raise bad_request("n must be 1: make one request per sample (each becomes its own captured call)", "n")
    if body.get("best_of", 1) not in (1, None):
        raise bad_request("best_of is not supported; make one request per sample", "best_of")
    top_logprobs = body.get("top_logprobs")
    if top_logprobs not in (None, 0):
        raise bad_request("top_logprobs is not supported; logprobs: true returns the sampled tokens' log-probs",
                          "top_logprobs")
    return SamplingRequest(
        temperature=_number(body, "temperature", float, 0.0, 2.0),
        top_p=_number(body, "top_p", float, 0.0, 1.0),
        top_k=_number(body, "top_k", int),
        min_p=_number(body, "min_p", float, 0.0, 1.0),
        max_tokens=max_tokens,
        stop=list(stop),
        seed=_number(body, "seed", int),
        presence_penalty=_number(body, "presence_penalty", float, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", float, -2.0, 2.0),
        repetition_penalty=_number(body, "repetition_penalty", float, 0.0),
    )


def _stream_options(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = bool(body.get("stream") or False)
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad_request("stream_options must be an object", "stream_options")
    return stream, bool(stream and options.get("include_usage"))


def text_of(content: Any, where: str) -> str | None:
    """A message's content as text: a string, or the text parts of a list of parts."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, str):
                texts.append(part)
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad_request(f"{where} has a content part of type {kind!r}; only text parts are supported",
                                  "messages")
        return "".join(texts)
    raise bad_request(f"{where}.content must be a string or a list of text parts", "messages")


_ROLES = {"system", "developer", "user", "assistant", "tool"}


def _message(raw: Any, i: int) -> Message:
    where = f"messages[{i}]"
    if not isinstance(raw, dict):
        raise bad_request(f"{where} must be an object with a role", "messages")
    role = raw.get("role")
    if role not in _ROLES:
        raise bad_request(f"{where}.role {role!r} is not one of {', '.join(sorted(_ROLES))}", "messages")
    message: Message = {"role": "system" if role == "developer" else role, "content": text_of(raw.get("content"), where)}
    if role == "assistant":
        reasoning = raw.get("reasoning_content", raw.get("reasoning"))
        if isinstance(reasoning, str):
            message["reasoning_content"] = reasoning
        calls = raw.get("tool_calls")
        if calls:
            if not isinstance(calls, list):
                raise bad_request(f"{where}.tool_calls must be a list", "messages")
            message["tool_calls"] = [_tool_call(call, f"{where}.tool_calls[{k}]") for k, call in enumerate(calls)]
    elif role == "tool":
        if raw.get("tool_call_id") is not None:
            message["tool_call_id"] = str(raw["tool_call_id"])
        if message["content"] is None:
            message["content"] = ""
    elif message["content"] is None:
        message["content"] = ""
    if isinstance(raw.get("name"), str):
        message["name"] = raw["name"]
    return message


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise bad_request(f"{where} must be {{'type': 'function', 'function': {{'name', 'arguments'}}}}", "messages")
    arguments = function.get("arguments", "{}")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": str(call.get("id") or ""), "type": "function",
            "function": {"name": function["name"], "arguments": arguments}}


def parse_chat_request(body: dict[str, Any]) -> ChatRequest:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list of message objects", "messages")
    tools = body.get("tools") or None
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("function"), dict)
                                                  for t in tools):
            raise bad_request("tools must be a list of {'type': 'function', 'function': {...}} objects", "tools")
        if any(t.get("type", "function") != "function" for t in tools):
            raise bad_request("only tools of type 'function' are supported", "tools")
    choice = body.get("tool_choice")
    if choice is None:
        choice = "auto"
    if choice not in ("auto", "none"):
        shown = choice if isinstance(choice, str) else json.dumps(choice)[:80]
        raise bad_request(f"tool_choice {shown!r} is not supported (the model is not constrained): use 'auto' or "
                          "'none'", "tool_choice")
    response_format = body.get("response_format") or {}
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        raise bad_request(f"response_format {response_format.get('type')!r} is not supported: the gateway does not "
                          "constrain decoding; ask for the format in the prompt and parse the reply", "response_format")
    if body.get("logit_bias"):
        raise bad_request("logit_bias is not supported (it would change the policy being trained)", "logit_bias")
    stream, include_usage = _stream_options(body)
    template_kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(template_kwargs, dict):
        raise bad_request("chat_template_kwargs must be an object", "chat_template_kwargs")
    return ChatRequest(
        model=str(body.get("model") or ""),
        messages=[_message(m, i) for i, m in enumerate(messages)],
        tools=tools,
        tool_choice=choice,
        sampling=_sampling(body),
        stream=stream,
        include_usage=include_usage,
        logprobs=bool(body.get("logprobs") or False),
        template_kwargs=dict(template_kwargs),
    )


def parse_completion_request(body: dict[str, Any]) -> CompletionRequest:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise bad_request("prompt must be a string or a list of token ids (one prompt per request)", "prompt")
    elif not isinstance(prompt, str) or not prompt:
        raise bad_request("prompt must be a non-empty string or a list of token ids", "prompt")
    if body.get("suffix"):
        raise bad_request("suffix is not supported", "suffix")
    stream, include_usage = _stream_options(body)
    logprobs = body.get("logprobs")
    if logprobs not in (None, False, 0, 1, True):
        raise bad_request("logprobs > 1 is not supported: logprobs: 1 returns the sampled tokens' log-probs",
                          "logprobs")
    return CompletionRequest(model=str(body.get("model") or ""), prompt=prompt, sampling=_sampling(body),
                             stream=stream, include_usage=include_usage, logprobs=bool(logprobs),
                             echo=bool(body.get("echo") or False))


# ---------------------------------------------------------------------------------------
# Responses


@frozen
class Reply:
    """One generated answer, ready to be written back in either format."""

    id: str
    model: str
    created: int
    text: str  # content (reasoning and tool-call blocks removed for chat)
    reasoning: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str  # stop | length | tool_calls
    token_pieces: list[str]  # decoded text of each sampled token (for logprobs)
    logprobs: list[float]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    weight_version: Any = None

    def usage(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}

    @property
    def fingerprint(self) -> str:
        return f"agentrl-w{self.weight_version}"


def assistant_message(reply: Reply) -> Message:
    """The assistant message as returned (and as the gateway expects it sent back)."""
    message: Message = {"role": "assistant", "content": reply.text if (reply.text or not reply.tool_calls) else None}
    if reply.reasoning is not None:
        message["reasoning"] = reply.reasoning
        message["reasoning_content"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    return message


def _chat_logprobs(reply: Reply) -> dict[str, Any]:
    return {"content": [{"token": piece, "logprob": lp, "bytes": list(piece.encode()), "top_logprobs": []}
                        for piece, lp in zip(reply.token_pieces, reply.logprobs, strict=True)]}


def chat_body(reply: Reply, *, logprobs: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "message": assistant_message(reply), "finish_reason": reply.finish_reason,
                              "logprobs": _chat_logprobs(reply) if logprobs else None}
    return {"id": reply.id, "object": "chat.completion", "created": reply.created, "model": reply.model,
            "system_fingerprint": reply.fingerprint, "choices": [choice], "usage": reply.usage()}


def _sse(events: Sequence[dict[str, Any]]) -> bytes:
    return b"".join(b"data: " + dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def chat_stream(reply: Reply, *, logprobs: bool, include_usage: bool) -> Response:
    """The reply as ``chat.completion.chunk`` server-sent events.

    One chunk per sampled token's text (reasoning tokens as ``delta.reasoning`` /
    ``delta.reasoning_content``, content tokens as ``delta.content``), then each tool call
    whole with its ``index``, then the finish reason, then usage when asked.
    """
    head = {"id": reply.id, "object": "chat.completion.chunk", "created": reply.created, "model": reply.model,
            "system_fingerprint": reply.fingerprint}

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": extra.get("logprobs"),
                                     "finish_reason": finish}]}

    events = [chunk({"role": "assistant", "content": ""})]
    if reply.reasoning:
        for piece in _pieces(reply.reasoning):
            events.append(chunk({"reasoning": piece, "reasoning_content": piece}))
    for piece in _pieces(reply.text):
        events.append(chunk({"content": piece}))
    for index, call in enumerate(reply.tool_calls):
        events.append(chunk({"tool_calls": [{"index": index, **call}]}))
    events.append(chunk({}, reply.finish_reason, logprobs=_chat_logprobs(reply) if logprobs else None))
    if include_usage:
        events.append({**head, "choices": [], "usage": reply.usage()})
    return Response(_sse(events), 200, SSE_HEADERS)


def _pieces(text: str, size: int = 16) -> list[str]:
    """Text cut into small deltas (the engine answers a turn at once; clients accumulate deltas)."""
    return [text[i : i + size] for i in range(0, len(text), size)]


def completion_body(reply: Reply, *, logprobs: bool, prompt_text: str | None = None) -> dict[str, Any]:
    text = (prompt_text or "") + reply.text
    choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": reply.finish_reason,
                              "logprobs": _completion_logprobs(reply) if logprobs else None}
    return {"id": reply.id, "object": "text_completion", "created": reply.created, "model": reply.model,
            "system_fingerprint": reply.fingerprint, "choices": [choice], "usage": reply.usage()}


def _completion_logprobs(reply: Reply) -> dict[str, Any]:
    offsets, at = [], 0
    for piece in reply.token_pieces:
        offsets.append(at)
        at += len(piece)
    return {"tokens": list(reply.token_pieces), "token_logprobs": list(reply.logprobs),
            "top_logprobs": None, "text_offset": offsets}


def completion_stream(reply: Reply, *, logprobs: bool, include_usage: bool, prompt_text: str | None = None) -> Response:
    head = {"id": reply.id, "object": "text_completion", "created": reply.created, "model": reply.model,
            "system_fingerprint": reply.fingerprint}
    text = (prompt_text or "") + reply.text
    events = [{**head, "choices": [{"index": 0, "text": piece, "logprobs": None, "finish_reason": None}]}
              for piece in _pieces(text)]
    events.append({**head, "choices": [{"index": 0, "text": "", "finish_reason": reply.finish_reason,
                                        "logprobs": _completion_logprobs(reply) if logprobs else None}]})
    if include_usage:
        events.append({**head, "choices": [], "usage": reply.usage()})
    return Response(_sse(events), 200, SSE_HEADERS)


def models_body(name: str, root: str, created: float) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": name, "object": "model", "created": int(created), "owned_by": "agentrl",
                                        "root": root}]}


def now() -> int:
    return int(time.time())
