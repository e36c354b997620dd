"""An async client of the gateway's session and admin routes (the trainer's side)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from agentrl_core.errors import AgentrlError
from agentrl_core.http.auth import authorization_header, env_token

__all__ = ["GatewayClient", "GatewayError"]


class GatewayError(AgentrlError):
    """The gateway answered an error, or could not be reached."""


class GatewayClient:
    """The trainer's client; every request carries ``token`` (default: the process's ``AGENTRL_TOKEN``)."""

    def __init__(self, url: str, *, timeout: float = 60.0, http: httpx.AsyncClient | None = None,
                 token: str | None = None) -> None:
        self.url = url.rstrip("/")
        self._own = http is None
        self.http = http or httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0), trust_env=False,
                                              limits=httpx.Limits(max_connections=1024),
                                              headers=authorization_header(token or env_token()))

    async def aclose(self) -> None:
        if self._own:
            await self.http.aclose()

    async def __aenter__(self) -> GatewayClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def _call(self, method: str, path: str, payload: Any = None) -> Any:
        try:
            response = await self.http.request(method, self.url + path, json=payload)
        except httpx.HTTPError as exc:
            raise GatewayError(f"{method} {self.url}{path} failed ({type(exc).__name__}: {exc}); is the gateway "
                               "running?") from None
        if response.status_code != 200:
            try:
                detail = response.json().get("detail") or response.text
            except ValueError:
                detail = response.text
            raise GatewayError(f"{method} {self.url}{path} answered {response.status_code}: {str(detail)[:300]}")
        return response.json()

    async def create_session(self, **info: Any) -> dict[str, Any]:
        """``{id, key, base_url, model}`` of a new session (``uid``, ``group_id``, ``sample``, ``task``, ``metadata``)."""
        return await self._call("POST", "/sessions", info)

    async def session(self, session_id: str, *, tokens: bool = False) -> dict[str, Any]:
        return await self._call("GET", f"/sessions/{session_id}" + ("?tokens=1" if tokens else ""))

    async def post_reward(self, session_id: str, reward: float, status: str | None = None,
                          metrics: Mapping[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"reward": reward}
        if status is not None:
            body["status"] = status
        if metrics:
            body["metrics"] = dict(metrics)
        return await self._call("POST", f"/sessions/{session_id}/reward", body)

    async def close_session(self, session_id: str, reason: str = "closed by its owner") -> dict[str, Any]:
        """End the session; its record with every captured sample (``sample_records``)."""
        return await self._call("POST", f"/sessions/{session_id}/close", {"reason": reason})

    async def set_pools(self, pools: Mapping[str, Sequence[str]]) -> dict[str, Any]:
        return await self._call("POST", "/admin/pools", {"pools": {k: list(v) for k, v in pools.items()}})

    async def pause(self) -> None:
        await self._call("POST", "/admin/pause", {})

    async def resume(self, global_step: int | None = None) -> None:
        await self._call("POST", "/admin/continue", {} if global_step is None else {"global_step": global_step})

    async def stats(self) -> dict[str, Any]:
        return await self._call("GET", "/stats")
