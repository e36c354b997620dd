"""OpenAI ``/v1/chat/completions`` (with tools) and ``/v1/models`` on the HF engine.

The prompt is the model's chat template with the tools; the answer goes through the
engine's tool parser: with calls, ``message.tool_calls`` (OpenAI format), ``content`` = the
text around them (or null), ``finish_reason: "tool_calls"``. ``metadata.weight_version`` as
SGLang reports it. A request aborted by a weight update answers 503 (retry).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import TYPE_CHECKING, Any

from agentrl_core.engine.sampling import parse_sampling_params
from agentrl_core.http.server import HTTPError, Request

if TYPE_CHECKING:
    from agentrl_core.engine.server import EngineServer


async def list_models(server: EngineServer, request: Request) -> Any:
    return {"object": "list", "data": [{"id": server.served_model_name, "object": "model", "created": int(server.started),
                                        "owned_by": "agentrl", "root": server.model_path}]}


async def chat_completions(server: EngineServer, request: Request) -> Any:
    body = request.json_object()
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise HTTPError(400, "messages must be a non-empty list of message objects")
    tools = body.get("tools") or None
    if tools is not None and not isinstance(tools, list):
        raise HTTPError(400, "tools must be a list of OpenAI function tools")
    tool_choice = body.get("tool_choice", "auto")
    if tool_choice not in ("auto", "none", None):
        raise HTTPError(400, f"tool_choice {tool_choice!r} is not supported by the hf engine; use 'auto' or 'none'")
    if body.get("stream"):
        raise HTTPError(400, "streaming is not supported by the hf engine; send stream=false")
    if body.get("n", 1) != 1:
        raise HTTPError(400, "n must be 1")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    raw = {"temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0),
           "stop": body.get("stop"), "seed": body.get("seed"),
           "max_new_tokens": max_tokens if max_tokens is not None else server.model.max_context}
    for key in ("top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty"):
        if body.get(key) is not None:
            raw[key] = body[key]
    params, _ = parse_sampling_params({k: v for k, v in raw.items() if v is not None})
    extra = body.get("chat_template_kwargs") or {}
    try:
        prompt = await asyncio.to_thread(
            server.tokenizer.apply_chat_template, messages, tools=tools, add_generation_prompt=True,
            tokenize=False, **extra)
    except Exception as exc:
        raise HTTPError(400, f"the chat template could not render these messages: {type(exc).__name__}: {exc}") from None
    input_ids = server.check_ids(server.tokenizer.encode(prompt, add_special_tokens=False), "the rendered prompt")
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    completion = await server.complete(rid, input_ids, params)
    reason = completion.finish_reason
    if reason["type"] == "abort":
        raise HTTPError(int(reason.get("status_code") or 503), reason.get("message", "aborted"))
    text = server.output_text(completion, params, no_stop_trim=False)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    finish = "length" if reason["type"] == "length" else "stop"
    if tools and tool_choice != "none":
        calls, normal, _ = server.tool_parser.parse(text, tools)
        if calls:
            message = {"role": "assistant", "content": normal or None, "tool_calls": calls}
            finish = "tool_calls"
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
    if body.get("logprobs"):
        pieces = [server.tokenizer.decode([t], skip_special_tokens=False) for t in completion.output_ids]
        choice["logprobs"] = {"content": [
            {"token": piece, "logprob": lp, "bytes": list(piece.encode()), "top_logprobs": []}
            for piece, lp in zip(pieces, completion.logprobs, strict=True)]}
    usage = {"prompt_tokens": completion.prompt_tokens, "completion_tokens": len(completion.output_ids),
             "total_tokens": completion.prompt_tokens + len(completion.output_ids)}
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": server.served_model_name,
            "choices": [choice], "usage": usage, "metadata": {"weight_version": completion.weight_version}}
