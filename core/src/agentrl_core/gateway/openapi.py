"""The OpenAPI 3.0 document of the training gateway's API, served at ``/openapi.json``.

Written by hand next to :mod:`agentrl_core.gateway.server`; a test checks that every route
appears here and fuzzes a real gateway (over a real engine) from it (schemathesis). The
agent's OpenAI routes take a session key (or the session's base URL, ``/sessions/{id}/v1``)
instead of the run's token, and answer errors in OpenAI's shape.
"""

from __future__ import annotations

from typing import Any

from agentrl_core.http.openapi import OBJECT, document, json_content, operation, ref
from agentrl_core.types import Status

_OPENAI_ERRORS = {str(code): json_content(ref("OpenAIError"), text) for code, text in (
    (400, "Invalid request (OpenAI's error shape)."),
    (401, "No open session for this key or base URL."),
    (404, "The session has ended."),
    (409, "Another call of the session is running."),
    (413, "The request body is over the size limit."),
    (429, "The session is over its token or call budget."),
    (503, "The engines cannot take it now (paused for a weight update, or none reachable); retry."),
)}


def _agent(summary: str, body: str | None, path_id: bool) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "security": [{"session_key": []}, {}],
                          "responses": {"200": json_content(OBJECT, "OpenAI's answer."), **_OPENAI_ERRORS}}
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref(body)}}}
    if path_id:
        op["parameters"] = [_SESSION_ID]
    return op


_SESSION_ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}


def gateway_openapi(version: str) -> dict[str, Any]:
    message = {"type": "object", "properties": {"role": {"type": "string"}, "content": {"nullable": True},
                                                "tool_calls": {"type": "array"}, "tool_call_id": {"type": "string"}}}
    schemas = {
        "OpenAIError": {"type": "object", "required": ["error"], "properties": {"error": OBJECT}},
        "Chat": {
            "type": "object",
            "required": ["messages"],
            "properties": {
                "model": {"type": "string"}, "messages": {"type": "array", "items": message},
                "tools": {"type": "array", "items": OBJECT}, "tool_choice": {"nullable": True},
                "max_tokens": {"type": "integer"}, "max_completion_tokens": {"type": "integer"},
                "temperature": {"type": "number"}, "top_p": {"type": "number"}, "stop": {"nullable": True},
                "seed": {"type": "integer"}, "logprobs": {"type": "boolean"}, "n": {"type": "integer"},
                "stream": {"type": "boolean"}, "chat_template_kwargs": OBJECT,
            },
        },
        "Completion": {
            "type": "object",
            "required": ["prompt"],
            "properties": {"model": {"type": "string"}, "prompt": {"nullable": True},
                           "max_tokens": {"type": "integer"}, "temperature": {"type": "number"},
                           "stop": {"nullable": True}, "stream": {"type": "boolean"}, "logprobs": {"nullable": True}},
        },
        "NewSession": {
            "type": "object",
            "properties": {"uid": {"type": "string"}, "group_id": {"type": "string"}, "sample": {"type": "integer"},
                           "task": {"type": "string"}, "metadata": OBJECT, "idle_timeout": {"type": "number"},
                           "max_duration": {"type": "number"}},
        },
        "Reward": {
            "type": "object",
            "required": ["reward"],
            "properties": {"reward": {"type": "number"},
                           "status": {"type": "string", "enum": [s.value for s in Status if s is not Status.RUNNING]},
                           "metrics": OBJECT},
        },
    }
    session = json_content(OBJECT, "The session's summary (or its record with tokens).")
    paths = {
        "/v1/chat/completions": {"post": _agent("OpenAI chat completion of the session named by the key.",
                                                "Chat", False)},
        "/v1/completions": {"post": _agent("OpenAI text completion of the session named by the key.",
                                           "Completion", False)},
        "/v1/models": {"get": _agent("The served model.", None, False)},
        "/sessions/{id}/v1/chat/completions": {"post": _agent("Chat completion at the session's base URL.",
                                                              "Chat", True)},
        "/sessions/{id}/v1/completions": {"post": _agent("Text completion at the session's base URL.",
                                                         "Completion", True)},
        "/sessions": {
            "post": operation("Open a session; answers its id, key and base URL.", json_content(OBJECT, "The session."),
                              codes=(400,), body=ref("NewSession"), body_required=False),
            "get": operation("Open sessions.", json_content(OBJECT, "Their summaries.")),
        },
        "/sessions/{id}": {"get": operation(
            "A session (tokens=1: with every captured sample).", session, codes=(404,),
            parameters=[_SESSION_ID, {"name": "tokens", "in": "query", "schema": {"type": "string"}}])},
        "/sessions/{id}/reward": {"post": operation("The episode's outcome.", session, codes=(400, 404),
                                                    body=ref("Reward"), parameters=[_SESSION_ID])},
        "/sessions/{id}/close": {"post": operation(
            "End the session; answers its record.", session, codes=(404, 409), parameters=[_SESSION_ID],
            body={"type": "object", "properties": {"reason": {"type": "string"}, "keep": {"type": "boolean"}}},
            body_required=False)},
        "/admin/pools": {"post": operation(
            "Replace the engine pools.", json_content(OBJECT, "The pools."), codes=(400,),
            body={"type": "object", "required": ["pools"], "properties": {"pools": {
                "type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}}}})},
        "/admin/pause": {"post": operation("Hold new model calls (a weight update).", json_content(OBJECT, "Paused."))},
        "/admin/continue": {"post": operation(
            "Release held calls.", json_content(OBJECT, "Resumed."), codes=(400,),
            body={"type": "object", "properties": {"global_step": {"type": "integer"}}}, body_required=False)},
        "/health": {"get": operation("Liveness.", json_content(OBJECT, "Healthy."))},
        "/stats": {"get": operation("Counters and latencies.", json_content(OBJECT, "Stats."))},
        "/openapi.json": {"get": operation("This document.", json_content(OBJECT, "OpenAPI 3.0."))},
    }
    doc = document("agentrl training gateway", version, "OpenAI-compatible endpoint for agents whose every "
                   "sampled token is captured for training (HTTP).", paths, schemas)
    doc["components"]["securitySchemes"]["session_key"] = {
        "type": "http", "scheme": "bearer", "description": "The session's key (POST /sessions answers it)."}
    return doc
