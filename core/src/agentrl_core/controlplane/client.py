"""The async client of the controller, used by the rollout side (agent loop, evaluation).

    async with ControllerClient("http://127.0.0.1:5020/api") as ctl:
        started = await ctl.start("db-std", 3)          # -> Started(session_id, messages, tools, ...)
        result = await ctl.interact(started.session_id, [assistant_message])
        ...                                             # result.finish / .status / .reward / .messages
        await ctl.cancel(started.session_id)            # always safe, also after the episode ended

Every call has a timeout. ``start`` retries while the controller cannot be reached (the
request was never sent, so nothing is started twice); ``interact`` is never replayed.
Errors are :class:`ControlPlaneError` subclasses with the controller's one-sentence
reason. A session that dies with its worker is not an exception: ``interact`` returns a
result with status ``task error``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
from attrs import field, frozen

from agentrl_core.errors import EnvError
from agentrl_core.http.auth import authorization_header, env_token
from agentrl_core.types import Index, Message, Status, Step

log = logging.getLogger(__name__)


class ControlPlaneError(EnvError):
    """A controller call failed; ``status`` is the HTTP status (None below HTTP)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ControllerUnavailable(ControlPlaneError):
    """The controller could not be reached (or the connection broke)."""


class ControllerTimeout(ControlPlaneError):
    """The controller did not answer in time."""


class RequestRejected(ControlPlaneError):
    """The controller answered with an error status (4xx/5xx)."""


class NoCapacity(RequestRejected):
    """No worker of the task has a free slot, or none is alive (406)."""


class UnknownSession(RequestRejected):
    """The controller does not know this session (404)."""


class SessionConflict(RequestRejected):
    """The session is busy with another call or has already ended (409)."""


@frozen
class Result:
    """One answer of the environment: new messages, status, finish flag, reward, metrics."""

    messages: list[Message]
    status: Status = field(converter=Status)
    finish: bool = False
    reward: float = field(default=0.0, converter=float)
    metrics: dict[str, Any] = field(factory=dict)

    @classmethod
    def from_json(cls, data: Any) -> Result:
        if not isinstance(data, dict):
            raise ControlPlaneError(f"the controller answered with {type(data).__name__}, not a JSON object")
        status = data.get("status") or ("unknown" if data.get("finish") else "running")
        try:
            status = Status(status)
        except ValueError:
            raise ControlPlaneError(f"the controller answered with the unknown status {status!r}") from None
        return cls(
            messages=list(data.get("messages") or []),
            status=status,
            finish=bool(data.get("finish")) or status is not Status.RUNNING,
            reward=data.get("reward") or 0.0,
            metrics=dict(data.get("metrics") or data.get("metric") or {}),
        )


    @classmethod
    def from_step(cls, step: Step, *, metrics: Mapping[str, Any] | None = None, **fields: Any) -> Result:
        """The answer for an environment's ``Step`` (an in-process client's; ``metrics`` replaces the step's)."""
        return cls(messages=list(step.messages), status=step.status, finish=step.finish, reward=step.reward,
                   metrics=dict(step.metrics if metrics is None else metrics), **fields)


@frozen
class Started(Result):
    """The answer to start: the session id, the first messages and the tools."""

    session_id: int = 0
    tools: list[dict[str, Any]] = field(factory=list)


_ERRORS = {406: NoCapacity, 404: UnknownSession, 409: SessionConflict}


class ControllerClient:
    """Pooled keep-alive HTTP client of one controller (``url`` ends in ``/api``).

    Every request carries ``token`` (default: the process's ``AGENTRL_TOKEN``) as a bearer token.
    """

    def __init__(
        self,
        url: str,
        *,
        start_timeout: float = 330.0,
        interact_timeout: float = 150.0,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        start_retries: int = 5,
        retry_delay: float = 0.5,
        max_connections: int = 4096,
        transport: httpx.AsyncBaseTransport | None = None,
        token: str | None = None,
    ) -> None:
        base = url.rstrip("/")
        if not base.endswith("/api"):
            base += "/api"
        self.url = base
        self.start_timeout = start_timeout
        self.interact_timeout = interact_timeout
        self.timeout = timeout
        self.start_retries = start_retries
        self.retry_delay = retry_delay
        self._http = httpx.AsyncClient(
            base_url=base + "/",
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections,
                                keepalive_expiry=5.0),
            transport=transport,
            headers=authorization_header(token or env_token()),
        )

    async def __aenter__(self) -> ControllerClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- calls -----------------------------------------------------------------------------

    async def get_indices(self, task: str) -> list[Index]:
        return await self._call("GET", "get_indices", params={"name": task})

    async def start(self, task: str, index: Index, *, custom_task: dict[str, Any] | None = None) -> Started:
        """Start a session of ``task`` at ``index``; retried only while the controller is unreachable."""
        body: dict[str, Any] = {"name": task, "index": index}
        if custom_task is not None:
            body["custom_task"] = custom_task
        attempt = 0
        while True:
            try:
                response = await self._send("POST", "start_sample", json=body, timeout=self.start_timeout)
                break
            except ControllerUnavailable as exc:
                if not getattr(exc, "not_sent", False) or attempt >= self.start_retries:
                    raise
                attempt += 1
                log.warning("controller unreachable (%s); retrying start %d/%d", exc, attempt, self.start_retries)
                await asyncio.sleep(self.retry_delay * 2 ** (attempt - 1))
        data = self._json(response)
        header = response.headers.get("session_id")
        if header is None or not header.strip().isdigit():
            raise ControlPlaneError(f"the controller started a session of {task!r} without a session_id header")
        result = Result.from_json(data)
        return Started(result.messages, result.status, result.finish, result.reward, result.metrics,
                       session_id=int(header), tools=list(data.get("tools") or []))

    async def interact(self, session_id: int, messages: Message | Sequence[Message]) -> Result:
        """Send the assistant's turn; never replayed (a lost answer raises, the session is then cancelled)."""
        if isinstance(messages, dict):
            messages = [messages]
        data = await self._call("POST", "interact", json={"messages": list(messages)},
                                headers={"session_id": str(session_id)}, timeout=self.interact_timeout)
        return Result.from_json(data)

    async def cancel(self, session_id: int) -> bool:
        """Cancel a session; True if it was live. Ended or unknown sessions are not an error."""
        try:
            data = await self._call("POST", "cancel", headers={"session_id": str(session_id)})
        except UnknownSession:
            return False
        return bool(isinstance(data, dict) and data.get("cancelled"))

    async def cancel_all(self, task: str | None = None, *, force: bool = False) -> dict[str, Any]:
        params = {"force": "true"} if force else {}
        if task is not None:
            params["name"] = task
        return await self._call("POST", "cancel_all", params=params)

    async def list_workers(self) -> dict[str, Any]:
        return await self._call("GET", "list_workers")

    async def list_sessions(self, task: str | None = None) -> dict[str, Any]:
        return await self._call("GET", "list_sessions", params={"name": task} if task else None)

    async def mark_stale(self, task: str, worker_id: int | str, stale: bool = True) -> dict[str, Any]:
        return await self._call("POST", "mark_stale", json={"name": task, "worker_id": worker_id, "stale": stale})

    async def health(self) -> dict[str, Any]:
        return await self._call("GET", "health")

    # -- plumbing ----------------------------------------------------------------------------

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._json(await self._send(method, path, **kwargs))

    async def _send(self, method: str, path: str, *, timeout: float | None = None, **kwargs: Any) -> httpx.Response:
        if timeout is not None:
            kwargs["timeout"] = httpx.Timeout(timeout, connect=self._http.timeout.connect)
        try:
            response = await self._http.request(method, path, **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            error = ControllerUnavailable(f"cannot reach the controller at {self.url}: {exc or type(exc).__name__}")
            error.not_sent = True  # type: ignore[attr-defined]
            raise error from None
        except httpx.TimeoutException:
            raise ControllerTimeout(f"the controller at {self.url} did not answer {path} in time") from None
        except httpx.TransportError as exc:
            raise ControllerUnavailable(f"the connection to the controller at {self.url} broke during {path}: "
                                        f"{exc or type(exc).__name__}") from None
        if response.status_code != 200:
            raise self._error(path, response)
        return response

    @staticmethod
    def _error(path: str, response: httpx.Response) -> ControlPlaneError:
        try:
            detail = response.json().get("detail")
        except (ValueError, AttributeError):
            detail = None
        if not isinstance(detail, str):
            detail = response.text[:300].strip() or response.reason_phrase
        cls = _ERRORS.get(response.status_code, RequestRejected)
        return cls(f"{path} failed ({response.status_code}): {detail}", status=response.status_code)

    @staticmethod
    def _json(response: httpx.Response) -> Any:
        try:
            return response.json()
        except ValueError:
            raise ControlPlaneError(f"the controller answered {response.url.path} with invalid JSON") from None
