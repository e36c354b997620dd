"""Gateway sessions: keys, deadlines, outcomes, replayed requests.

A session is one agent episode. Its calls are bound to it by its own base URL
(``/sessions/{id}/v1``) or by its bearer key on ``/v1``; both are random and unguessable.
A session ends when its owner closes it, or when it is idle past ``idle_timeout`` or alive
past ``max_duration`` (a client that crashed or vanished): the store then *expires* it. An
expired session without a reward has status ``cancelled``, an infrastructure failure that
training never scores (docs/architecture.md section 4). A finished session's record is
kept ``finished_ttl`` seconds for its owner to fetch; afterwards its id and key answer 401
"ended" for a while, then "unknown".

A replayed request (an SDK retry: ``X-Stainless-Retry-Count`` >= 1, or a repeated
``Idempotency-Key``) with a body identical to one of the session's recent calls gets that
call's answer, waiting for it if it is still running, and is not recorded twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

from attrs import define, field

from agentrl_core.gateway.capture import Conversation
from agentrl_core.types import FailureKind, Status, failure_kind

log = logging.getLogger(__name__)

__all__ = ["GatewaySession", "SessionStore", "SessionGone", "SESSION_SCOPE_KEY"]

SESSION_SCOPE_KEY = "agentrl.gateway.session"  # the ASGI scope key of a session id taken from the path


class SessionGone(Exception):
    """No open session for this id or key (the message says whether it ended or never existed)."""


@define(eq=False)
class GatewaySession:
    id: str
    key: str
    created: float
    last_active: float
    idle_timeout: float
    deadline: float
    uid: str = ""
    group_id: str = ""
    sample: int = 0
    task: str = ""
    metadata: dict[str, Any] = field(factory=dict)
    conversation: Conversation = field(factory=Conversation)
    state: str = "open"  # open | ended
    end_reason: str = ""
    reward: float | None = None
    status: str | None = None  # the outcome's AgentBench status, once known
    outcome_metrics: dict[str, Any] = field(factory=dict)
    calls: int = 0
    in_flight: int = 0
    turns: list[dict[str, Any]] = field(factory=list)
    counters: Counter = field(factory=Counter)
    context_limit: bool = False
    replays: OrderedDict[str, asyncio.Future] = field(factory=OrderedDict)
    ended_at: float = 0.0
    _settled: asyncio.Event | None = None  # set while no call is in flight

    # -- calls in flight -------------------------------------------------------------------

    def call_started(self) -> None:
        self.in_flight += 1
        if self._settled is not None:
            self._settled.clear()

    def call_ended(self) -> None:
        self.in_flight -= 1
        self.last_active = time.monotonic()
        if self.in_flight == 0 and self._settled is not None:
            self._settled.set()

    async def settled(self, timeout: float) -> bool:
        """Wait until no call is in flight (its tokens are committed); False after ``timeout`` seconds."""
        if self.in_flight == 0:
            return True
        if self._settled is None:
            self._settled = asyncio.Event()
        try:
            await asyncio.wait_for(self._settled.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    # -- outcome -----------------------------------------------------------------------

    def post_reward(self, reward: float, status: str | None = None, metrics: dict[str, Any] | None = None) -> None:
        self.reward = float(reward)
        self.status = Status(status or Status.COMPLETED).value
        self.outcome_metrics.update(metrics or {})

    def outcome(self) -> tuple[str, float | None]:
        """``(status, reward)``: the posted reward, else an agent context limit, else ``cancelled`` (infra)."""
        if self.status is not None:
            return self.status, self.reward
        if self.context_limit:
            return Status.AGENT_CONTEXT_LIMIT.value, None
        return Status.CANCELLED.value, None

    # -- records -----------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        conv = self.conversation
        status, reward = self.outcome()
        return {
            "id": self.id, "uid": self.uid, "group_id": self.group_id, "sample": self.sample, "task": self.task,
            "metadata": self.metadata, "state": self.state, "end_reason": self.end_reason,
            "status": status, "reward": reward, "posted": self.status is not None,
            "failure": failure_kind(status).value if self.state == "ended" or self.status is not None else None,
            "calls": self.calls, "in_flight": self.in_flight, "samples": len(conv.samples),
            "counts": {"new": conv.counts["new"], "append": conv.counts["append"],
                       "realign": conv.counts["realign"], "fork": conv.counts["fork"],
                       "replay": self.counters["replay"], "rejected": self.counters["rejected"]},
            "fork_reasons": dict(conv.fork_reasons), "outcome_metrics": self.outcome_metrics,
            "age_s": round(time.monotonic() - self.created, 3),
        }

    def export(self) -> dict[str, Any]:
        """The summary with every captured sample's token arrays and the per-call records."""
        return {**self.summary(), "sample_records": [s.as_dict() for s in self.conversation.samples],
                "turns": list(self.turns)}


def fingerprint(path: str, body: bytes, idempotency_key: str | None) -> str:
    if idempotency_key:
        return "key:" + idempotency_key
    return hashlib.sha1(path.encode() + b"\0" + body).hexdigest()


class SessionStore:
    """Every session of one gateway; one event loop, not thread-safe."""

    def __init__(self, *, idle_timeout: float = 300.0, max_duration: float = 3600.0, finished_ttl: float = 600.0,
                 remembered: int = 100_000, replay_window: int = 8,
                 on_end: Callable[[GatewaySession], None] | None = None) -> None:
        self.idle_timeout = idle_timeout
        self.max_duration = max_duration
        self.finished_ttl = finished_ttl
        self.replay_window = replay_window
        self.on_end = on_end
        self.open: dict[str, GatewaySession] = {}
        self.by_key: dict[str, str] = {}
        self.ended: OrderedDict[str, GatewaySession] = OrderedDict()  # kept finished_ttl for their owners
        self.gone: OrderedDict[str, str] = OrderedDict()  # id or key -> why it ended
        self.remembered = remembered
        self.counters: Counter = Counter()
        self._seq = itertools.count(1)

    # -- lifecycle -----------------------------------------------------------------------

    def create(self, *, uid: str = "", group_id: str = "", sample: int = 0, task: str = "",
               metadata: dict[str, Any] | None = None, idle_timeout: float | None = None,
               max_duration: float | None = None) -> GatewaySession:
        now = time.monotonic()
        session = GatewaySession(
            id=f"s{next(self._seq)}-{secrets.token_hex(12)}", key=f"sk-agentrl-{secrets.token_urlsafe(24)}",
            created=now, last_active=now, idle_timeout=idle_timeout or self.idle_timeout,
            deadline=now + (max_duration or self.max_duration), uid=uid, group_id=group_id, sample=sample,
            task=task, metadata=dict(metadata or {}),
        )
        self.open[session.id] = session
        self.by_key[session.key] = session.id
        self.counters["created"] += 1
        return session

    def end(self, session: GatewaySession, reason: str) -> None:
        """Stop accepting calls; the record stays fetchable for ``finished_ttl`` seconds."""
        if session.state == "ended":
            return
        session.state = "ended"
        session.end_reason = reason
        session.ended_at = time.monotonic()
        self.open.pop(session.id, None)
        self.by_key.pop(session.key, None)
        self.ended[session.id] = session
        why = f"session {session.id} has ended ({reason})"
        for handle in (session.id, session.key):
            self.gone[handle] = why
        while len(self.gone) > self.remembered:
            self.gone.popitem(last=False)
        status, _ = session.outcome()
        self.counters[f"ended/{reason}"] += 1
        self.counters[f"status/{status}"] += 1
        if failure_kind(status) is FailureKind.INFRA:
            self.counters["infra"] += 1
        if self.on_end is not None:
            try:
                self.on_end(session)
            except Exception:  # an export that fails must not take the gateway down
                log.exception("recording the end of session %s failed", session.id)

    def pop_ended(self, session_id: str) -> GatewaySession | None:
        return self.ended.pop(session_id, None)

    def expire_due(self, now: float | None = None) -> list[GatewaySession]:
        """End sessions idle past their timeout or alive past their deadline; forget old ended ones."""
        now = time.monotonic() if now is None else now
        expired = []
        for session in list(self.open.values()):
            if session.in_flight:
                continue  # a call is running: the session is not idle
            if now - session.last_active > session.idle_timeout:
                self.end(session, f"idle for more than {session.idle_timeout:g} s")
                expired.append(session)
            elif now > session.deadline:
                self.end(session, "past its deadline")
                expired.append(session)
        while self.ended:
            first = next(iter(self.ended.values()))
            if now - first.ended_at <= self.finished_ttl:
                break
            self.ended.popitem(last=False)
        return expired

    # -- lookups -------------------------------------------------------------------------

    def get(self, session_id: str) -> GatewaySession:
        session = self.open.get(session_id)
        if session is None:
            raise SessionGone(self.gone.get(session_id) or f"unknown session {session_id!r}")
        return session

    def find(self, session_id: str) -> GatewaySession:
        """An open or recently ended session."""
        session = self.open.get(session_id) or self.ended.get(session_id)
        if session is None:
            raise SessionGone(self.gone.get(session_id) or f"unknown session {session_id!r}")
        return session

    def for_key(self, key: str) -> GatewaySession:
        session_id = self.by_key.get(key)
        if session_id is None:
            raise SessionGone(self.gone.get(key) or "unknown session key: create a session (POST /sessions) and "
                              "use its key, or its base URL /sessions/{id}/v1")
        return self.open[session_id]

    def stats(self) -> dict[str, Any]:
        return {"open": len(self.open), "ended_kept": len(self.ended),
                "in_flight": sum(s.in_flight for s in self.open.values()), **dict(self.counters)}
