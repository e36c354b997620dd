"""The OpenAPI 3.0 document of the controller API (served at ``/openapi.json``).

Written by hand next to the routes it describes (every route may answer 401 without the
run's token); a test checks that every route of the
controller appears here and fuzzes the controller from it (schemathesis).
"""

from __future__ import annotations

from typing import Any

from agentrl_core.types import Status


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    texts = {
        401: "The request did not carry the run's token (Authorization: Bearer <token>).",
        400: "Malformed JSON or an invalid field.",
        404: "Unknown task, session or worker.",
        406: "No worker of the task has a free slot (or none is alive).",
        409: "The session is busy, has already ended, or the indices conflict.",
        413: "The request body is over the size limit.",
        502: "The worker answered badly (infrastructure failure).",
        504: "The worker did not answer in time.",
    }
    return {str(code): _json(_ref("Error"), texts[code]) for code in codes}


SESSION_HEADER = {
    "name": "session_id",
    "in": "header",
    "required": True,
    "description": "The session id returned in the session_id header of start_sample.",
    "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"},
}


def _post(summary: str, body: dict[str, Any] | None, ok: dict[str, Any], errors: tuple[int, ...],
          parameters: list[dict[str, Any]] | None = None, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {"200": ok, **_errors(401, *errors)}}
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    if parameters:
        op["parameters"] = parameters
    if headers:
        op["responses"]["200"]["headers"] = headers
    return {"post": op}


def _get(summary: str, ok: dict[str, Any], errors: tuple[int, ...] = (), parameters: list | None = None) -> dict:
    op: dict[str, Any] = {"summary": summary, "responses": {"200": ok, **_errors(401, *errors)}}
    if parameters:
        op["parameters"] = parameters
    return {"get": op}


def controller_openapi(version: str) -> dict[str, Any]:
    obj = {"type": "object"}
    name_query = {"name": "name", "in": "query", "required": True, "schema": {"type": "string", "minLength": 1}}
    schemas = {
        "Error": {"type": "object", "required": ["detail"], "properties": {"detail": {"type": "string"}}},
        "Index": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
        "Message": {
            "type": "object",
            "description": "An OpenAI chat message; interact acts on the last assistant message.",
            "properties": {"role": {"type": "string"}, "content": {"nullable": True}, "tool_calls": {"type": "array"}},
        },
        "StartSample": {
            "type": "object",
            "required": ["name", "index"],
            "properties": {
                "name": {"type": "string", "minLength": 1, "description": "Task name, e.g. db-std."},
                "index": _ref("Index"),
                "custom_task": {"type": "object", "nullable": True},
            },
        },
        "Interact": {
            "type": "object",
            "required": ["messages"],
            "properties": {"messages": {"type": "array", "minItems": 1, "items": _ref("Message")}},
        },
        "EnvOut": {
            "type": "object",
            "required": ["messages", "status", "finish", "reward", "metrics"],
            "properties": {
                "messages": {"type": "array", "items": _ref("Message")},
                "tools": {"type": "array", "items": obj},
                "status": {"type": "string", "enum": [s.value for s in Status]},
                "finish": {"type": "boolean"},
                "reward": {"type": "number"},
                "metrics": obj,
            },
        },
        "Heartbeat": {
            "type": "object",
            "required": ["name", "address", "concurrency", "indices"],
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "address": {"type": "string", "description": "The worker's API URL, e.g. http://host:5021/api."},
                "concurrency": {"type": "integer", "minimum": 0},
                "indices": {"type": "array", "items": _ref("Index")},
            },
        },
        "MarkStale": {
            "type": "object",
            "required": ["worker_id"],
            "properties": {
                "name": {"type": "string"},
                "worker_id": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
                "stale": {"type": "boolean", "default": True},
            },
        },
        "SessionRef": {"type": "object", "properties": {"session_id": {"type": "integer", "minimum": 0}}},
    }
    session_header = {"session_id": {"schema": {"type": "string"}, "description": "The new session's id."}}
    paths = {
        "/api/get_indices": _get("The indices of a task.", _json({"type": "array", "items": _ref("Index")}, "Indices."),
                                 (400, 404), [name_query]),
        "/api/start_sample": _post("Start a session on the least-loaded worker of a task.", _ref("StartSample"),
                                   _json(_ref("EnvOut"), "The first messages and the tools."),
                                   (400, 404, 406, 413, 502, 504), headers=session_header),
        "/api/interact": _post("Send one assistant turn; get the environment's answer.", _ref("Interact"),
                               _json(_ref("EnvOut"), "New messages, status, finish, reward and metrics."),
                               (400, 404, 409, 413), [SESSION_HEADER]),
        "/api/cancel": _post("Cancel a session (its resources are released).", None,
                             _json(obj, "Cancelled (or had already ended)."), (400, 404, 413),
                             [{**SESSION_HEADER}]),
        "/api/cancel_all": _post("Cancel every session of a task (or of all tasks with force=true).", None,
                                 _json(obj, "How many sessions were cancelled."), (400, 404, 413), [
                                     {"name": "name", "in": "query", "schema": {"type": "string"}},
                                     {"name": "force", "in": "query", "schema": {"type": "boolean"}}]),
        "/api/cancel_notice": _post("A worker confirms that a cancelled session is closed.", _ref("SessionRef"),
                                    _json(obj, "Noted."), (400, 413)),
        "/api/receive_heartbeat": _post("A worker registers or renews its registration.", _ref("Heartbeat"),
                                        _json(obj, "The worker's id and status."), (400, 409, 413)),
        "/api/mark_stale": _post("Drain a worker (stale=true) or put it back (stale=false).", _ref("MarkStale"),
                                 _json(obj, "The worker."), (400, 404, 413)),
        "/api/list_workers": _get("Workers by task.", _json(obj, "Tasks with their indices and workers.")),
        "/api/list_sessions": _get("Live sessions.", _json(obj, "Sessions by id."), (), [
            {"name": "name", "in": "query", "schema": {"type": "string"}}]),
        "/api/sync_all": _post("Reconcile every worker's sessions now.", None, _json(obj, "Per worker: ok or not."),
                               (413,)),
        "/api/version": _get("Version and protocol.", _json(obj, "Versions.")),
        "/api/health": _get("Liveness and counts.", _json(obj, "Healthy.")),
        "/health": _get("Liveness and counts.", _json(obj, "Healthy.")),
        "/api/metrics": _get("Prometheus metrics.", {"description": "Metrics.", "content": {"text/plain": {}}}),
        "/metrics": _get("Prometheus metrics.", {"description": "Metrics.", "content": {"text/plain": {}}}),
        "/openapi.json": _get("This document.", _json(obj, "OpenAPI 3.0.")),
    }
    return {
        "openapi": "3.0.3",
        "info": {"title": "agentrl controller", "version": version,
                 "description": "AgentRL / AgentBench-FC compatible environment controller (HTTP)."},
        "paths": paths,
        # every route needs the run's token when the controller has one (core/docs/control_plane.md)
        "security": [{"token": []}],
        "components": {"schemas": schemas,
                       "securitySchemes": {"token": {"type": "http", "scheme": "bearer",
                                                     "description": "The run's token (AGENTRL_TOKEN)."}}},
    }


def worker_openapi(version: str) -> dict[str, Any]:
    """The task worker's API (what the controller calls; AgentBench-FC's worker routes), served at /openapi.json."""
    from agentrl_core.http.openapi import OBJECT, document, json_content, operation, ref

    session_body = {"type": "object", "properties": {"session_id": {"type": "integer", "minimum": 0}},
                    "description": "Older clients send the session id here instead of the header."}
    optional_header = {**SESSION_HEADER, "required": False}
    env_out = {
        "type": "object",
        "required": ["messages", "status", "finish", "reward"],
        "properties": {
            "messages": {"type": "array", "items": ref("Message")},
            "tools": {"type": "array", "items": OBJECT},
            "status": {"type": "string", "enum": [s.value for s in Status]},
            "finish": {"type": "boolean"},
            "reward": {"type": "number"},
            "metric": OBJECT,
        },
    }
    schemas = {
        "Index": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
        "Message": {"type": "object", "properties": {"role": {"type": "string"}, "content": {"nullable": True},
                                                     "tool_calls": {"type": "array"}}},
        "WorkerStart": {
            "type": "object",
            "required": ["session_id", "index"],
            "properties": {"session_id": {"type": "integer", "minimum": 0}, "index": ref("Index"),
                           "custom_task": {"type": "object", "nullable": True}},
        },
        "WorkerInteract": {
            "type": "object",
            "required": ["session_id", "messages"],
            "properties": {"session_id": {"type": "integer", "minimum": 0},
                           "messages": {"type": "array", "minItems": 1, "items": ref("Message")}},
        },
        "EnvOut": env_out,
    }
    cancelled = json_content({"type": "object", "properties": {"cancelled": {"type": "array"}}}, "The sessions.")
    sid = json_content({"type": "object", "properties": {"session_id": {"type": "integer"}}}, "The session.")
    paths = {
        "/api/start_sample": {"post": operation(
            "Open a session of an index (the controller picked the id).", json_content(ref("EnvOut"), "The first step."),
            codes=(400, 406), body=ref("WorkerStart"))},
        "/api/interact": {"post": operation(
            "One assistant turn.", json_content({"type": "object", "properties": {
                "session_id": {"type": "integer"}, "env_out": ref("EnvOut")}}, "The environment's answer."),
            codes=(400, 404, 409), body=ref("WorkerInteract"))},
        "/api/cancel": {"post": operation("Cancel a session and close it.", sid, codes=(400, 404), body=session_body,
                                          body_required=False, parameters=[optional_header])},
        "/api/cancel_with_notice": {"post": operation(
            "Cancel a session; the controller gets a cancel_notice once it is closed.", sid, codes=(400, 404),
            body=session_body, body_required=False, parameters=[optional_header])},
        "/api/cancel_all": {"post": operation("Cancel every session.", cancelled)},
        "/api/cancel_all_with_notice": {"post": operation("Cancel every session, with notices.", cancelled)},
        "/api/get_sessions": {"get": operation("Open sessions: id -> index.", json_content(OBJECT, "Sessions."))},
        "/api/get_indices": {"get": operation("The indices served.", json_content(
            {"type": "array", "items": ref("Index")}, "Indices."))},
        "/api/worker_status": {"get": operation("Concurrency and sessions in use.", json_content(OBJECT, "Status."))},
        "/api/sample_status": {"post": operation("Whether a session is busy.", json_content(OBJECT, "Its status."),
                                                 codes=(400, 404), body=session_body, body_required=False,
                                                 parameters=[optional_header])},
        "/api/health": {"get": operation("Liveness.", json_content(OBJECT, "Healthy."))},
        "/openapi.json": {"get": operation("This document.", json_content(OBJECT, "OpenAPI 3.0."))},
    }
    return document("agentrl task worker", version, "Serves one task's sessions to the controller (HTTP).",
                    paths, schemas)
