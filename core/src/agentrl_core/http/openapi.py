"""Builders of the hand-written OpenAPI 3.0 documents our services serve at ``/openapi.json``.

The task worker, the engine and the gateway describe their routes with these (the
controller's document, :mod:`agentrl_core.controlplane.openapi`, predates them); tests fuzz
each service from its document with schemathesis and check that every route is described.
Every route may answer 401 without the run's token, 405 to another method and 413 to a body
over the size limit: the :class:`~agentrl_core.http.server.App` does that before routing.
"""

from __future__ import annotations

from typing import Any

OBJECT: dict[str, Any] = {"type": "object"}
ERROR_SCHEMA = {"type": "object", "required": ["detail"], "properties": {"detail": {"type": "string"}}}

_ERRORS = {
    400: "Malformed JSON or an invalid field.",
    401: "The request did not carry the run's token (Authorization: Bearer <token>).",
    404: "Unknown session (or other named thing).",
    406: "No free slot.",
    409: "The request conflicts with the current state (busy, paused, already ended).",
    413: "The request body is over the size limit.",
    503: "The service cannot serve it now (stopped, or the request was refused while paused).",
}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def json_content(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def text_content(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"text/plain": {"schema": {"type": "string"}}}}


def errors(*codes: int) -> dict[str, Any]:
    """Responses ``{"detail": ...}`` for ``codes`` (plus 401 and 413, which every route may answer)."""
    return {str(code): json_content(ref("Error"), _ERRORS[code]) for code in sorted({401, 413, *codes})}


def operation(summary: str, ok: dict[str, Any], *, codes: tuple[int, ...] = (), body: dict[str, Any] | None = None,
              body_required: bool = True, parameters: list[dict[str, Any]] | None = None,
              responses: dict[str, Any] | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {"200": ok, **errors(*codes), **(responses or {})}}
    if body is not None:
        op["requestBody"] = {"required": body_required, "content": {"application/json": {"schema": body}}}
    if parameters:
        op["parameters"] = parameters
    return op


def document(title: str, version: str, description: str, paths: dict[str, Any],
             schemas: dict[str, Any]) -> dict[str, Any]:
    """An OpenAPI 3.0.3 document whose every route needs the bearer token when the service has one."""
    return {
        "openapi": "3.0.3",
        "info": {"title": title, "version": version, "description": description},
        "paths": paths,
        "security": [{"token": []}],
        "components": {"schemas": {"Error": ERROR_SCHEMA, **schemas},
                       "securitySchemes": {"token": {"type": "http", "scheme": "bearer",
                                                     "description": "The run's token (AGENTRL_TOKEN)."}}},
    }


def routes_of(doc: dict[str, Any]) -> set[tuple[str, str]]:
    """``{(METHOD, path)}`` of a document, to compare with an App's route table."""
    return {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
