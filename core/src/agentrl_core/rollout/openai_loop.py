"""A message-level agent loop over any OpenAI-compatible chat endpoint (baselines).

``agentrl eval --engine openai --base-url URL --model NAME`` plays episodes by sending the
conversation and the environment's tools to ``/v1/chat/completions`` and forwarding the
returned assistant message (with its ``tool_calls``) to the environment. No tokens or
log-probs are recorded: this is for evaluation, not training.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import anyio
import httpx

from agentrl_core.rollout.agent_loop import EnvClient, RolloutRequest
from agentrl_core.types import Message, Status

log = logging.getLogger(__name__)


class OpenAIChatLoop:
    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        env_client: EnvClient,
        max_turns: int = 20,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        api_key: str | None = None,
        timeout: float = 600.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.url = base_url.rstrip("/") + ("/chat/completions" if base_url.rstrip("/").endswith("/v1") else "/v1/chat/completions")
        self.model = model
        self.env_client = env_client
        self.max_turns = max_turns
        self.temperature = temperature
        self.max_tokens = max_tokens
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = http or httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0), headers=headers)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> Message:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": list(messages),
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        if tools:
            payload["tools"] = list(tools)
        response = await self.http.post(self.url, json=payload)
        if response.status_code >= 400:
            raise RuntimeError(f"{self.url} answered {response.status_code}: {response.text[:300]}")
        choice = response.json()["choices"][0]["message"]
        message: Message = {"role": "assistant", "content": choice.get("content") or ""}
        if choice.get("tool_calls"):
            message["tool_calls"] = choice["tool_calls"]
        return message

    async def run(self, request: RolloutRequest) -> dict[str, Any]:
        """Play one episode; returns ``{status, reward, turns, messages, metrics, error?}``, ``metrics``
        being the environment's last reply's (as the token-level loop keeps them) and ``turns``."""
        session_id = None
        messages: list[Message] = []
        turns = 0
        env_metrics: dict[str, Any] = {}

        def result(status: str, reward: float = 0.0, **extra: Any) -> dict[str, Any]:
            return {"status": status, "reward": reward, "turns": turns, "messages": messages,
                    "result_source": env_metrics.get("result_source"), "metrics": {**env_metrics, "turns": turns},
                    **extra}

        try:
            started = await self.env_client.start(request.task, request.index)
            session_id = started.session_id
            messages.extend(started.messages)
            env_metrics.update(getattr(started, "metrics", None) or {})
            if getattr(started, "finish", False):
                session_id = None
                return result(str(Status(started.status).value), float(started.reward or 0.0))
            while turns < self.max_turns:
                turns += 1
                try:
                    action = await self.complete(messages, started.tools)
                except (httpx.HTTPError, RuntimeError, KeyError, ValueError) as exc:
                    return result(Status.UNKNOWN.value, error=f"model endpoint: {exc}")
                messages.append(action)
                reply = await self.env_client.interact(session_id, [action])
                messages.extend(reply.messages)
                env_metrics.update(reply.metrics or {})
                if reply.finish:
                    session_id = None
                    return result(reply.status, float(reply.reward or 0.0))
            return result(Status.TASK_LIMIT_REACHED.value)
        except Exception as exc:  # controller or worker failure: infrastructure, counted apart
            log.warning("episode %s/%s failed: %s", request.task, request.index, exc)
            return result(Status.UNKNOWN.value, error=str(exc))
        finally:
            if session_id is not None:
                with anyio.CancelScope(shield=True):
                    try:
                        await self.env_client.cancel(session_id)
                    except Exception as exc:
                        log.warning("cancel of session %s failed: %s", session_id, exc)
