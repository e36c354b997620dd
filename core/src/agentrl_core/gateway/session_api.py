"""The session and admin endpoints of the gateway: one handler per endpoint.

Their errors are agentrl's ``{"detail": "<one sentence>"}`` (the control plane's shape); a
session id that is unknown or has ended answers 404 here (401 is for model calls).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from agentrl_core.gateway.sessions import SESSION_SCOPE_KEY, GatewaySession, SessionGone
from agentrl_core.http.server import HTTPError, Request
from agentrl_core.types import Status

if TYPE_CHECKING:
    from agentrl_core.gateway.server import GatewayServer


def _session_id(request: Request) -> str:
    return request.scope[SESSION_SCOPE_KEY]


def _find(gateway: GatewayServer, request: Request, *, open_only: bool = False) -> GatewaySession:
    session_id = _session_id(request)
    try:
        return gateway.sessions.get(session_id) if open_only else gateway.sessions.find(session_id)
    except SessionGone as exc:
        raise HTTPError(404, str(exc)) from None


def _positive(body: dict[str, Any], key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise HTTPError(400, f"{key} must be a positive number of seconds, got {value!r}")
    return float(value)


async def create_session(gateway: GatewayServer, request: Request) -> Any:
    """``{uid?, group_id?, sample?, task?, metadata?, idle_timeout?, max_duration?}`` -> ``{id, key, base_url}``."""
    body = request.json_object(required=False)
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise HTTPError(400, "metadata must be a JSON object")
    sample = body.get("sample", 0)
    if isinstance(sample, bool) or not isinstance(sample, int):
        raise HTTPError(400, f"sample must be an integer, got {sample!r}")
    session = gateway.sessions.create(
        uid=str(body.get("uid") or ""), group_id=str(body.get("group_id") or ""), sample=sample,
        task=str(body.get("task") or ""), metadata=metadata, idle_timeout=_positive(body, "idle_timeout"),
        max_duration=_positive(body, "max_duration"),
    )
    return {"id": session.id, "key": session.key, "base_url": gateway.base_url(session),
            "model": gateway.served_model_name, "idle_timeout": session.idle_timeout}


async def list_sessions(gateway: GatewayServer, request: Request) -> Any:
    return {"sessions": [s.summary() for s in gateway.sessions.open.values()]}


async def get_session(gateway: GatewayServer, request: Request) -> Any:
    session = _find(gateway, request)
    tokens = request.query().get("tokens", "") not in ("", "0", "false")
    return session.export() if tokens else session.summary()


async def post_reward(gateway: GatewayServer, request: Request) -> Any:
    """``{reward, status?, metrics?}``: the episode's outcome (status: an AgentBench status, default completed)."""
    session = _find(gateway, request, open_only=True)
    body = request.json_object()
    reward = body.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise HTTPError(400, f"reward must be a finite number, got {reward!r}")
    status = body.get("status") or Status.COMPLETED.value
    try:
        status = Status(status)
    except ValueError:
        raise HTTPError(400, f"status {status!r} is not an episode status; use one of "
                             f"{', '.join(s.value for s in Status if s is not Status.RUNNING)}") from None
    if status is Status.RUNNING:
        raise HTTPError(400, "status 'running' is not an outcome; use completed or a failure status")
    metrics = body.get("metrics") or {}
    if not isinstance(metrics, dict):
        raise HTTPError(400, "metrics must be a JSON object")
    session.post_reward(float(reward), status.value, metrics)
    gateway.counters["rewards"] += 1
    return session.summary()


async def close_session(gateway: GatewayServer, request: Request) -> Any:
    """End the session (idempotent) and answer its record with every captured sample; then forget it."""
    session = _find(gateway, request)
    body = request.json_object(required=False)
    if not await session.settled(timeout=60.0):  # a call still generating files its tokens first
        raise HTTPError(409, f"session {session.id} still has {session.in_flight} call(s) running after 60 s; "
                             "close it again later")
    gateway.sessions.end(session, str(body.get("reason") or "closed by its owner"))
    if body.get("keep"):
        return session.export()
    gateway.sessions.pop_ended(session.id)
    return session.export()


async def set_pools(gateway: GatewayServer, request: Request) -> Any:
    pools = request.json_object().get("pools")
    if not isinstance(pools, dict) or not pools or not all(
            isinstance(urls, list) and urls and all(isinstance(u, str) for u in urls) for urls in pools.values()):
        raise HTTPError(400, "pools must be {name: [engine URL, ...]} with at least one URL per pool")
    try:
        gateway.router.set_pools(pools)
    except ValueError as exc:
        raise HTTPError(400, str(exc)) from None
    return {"pools": {name: pool.urls for name, pool in gateway.router.pools.items()}}


async def pause(gateway: GatewayServer, request: Request) -> Any:
    gateway.router.pause()
    return {"paused": True}


async def resume(gateway: GatewayServer, request: Request) -> Any:
    body = request.json_object(required=False)
    step = body.get("global_step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise HTTPError(400, f"global_step must be an integer, got {step!r}")
    gateway.router.resume(step)
    return {"paused": False, "global_step": gateway.router.global_step}


async def health(gateway: GatewayServer, request: Request) -> Any:
    return {"status": "ok", "open_sessions": len(gateway.sessions.open)}


async def stats(gateway: GatewayServer, request: Request) -> Any:
    return {**dict(gateway.counters), "sessions": gateway.sessions.stats(), **gateway.latency.percentiles(),
            "paused": gateway.router.paused, "aborted_calls": gateway.router.aborted_calls,
            "rejected_calls": gateway.router.rejected_calls,
            "pools": {name: pool.urls for name, pool in gateway.router.pools.items()}}
