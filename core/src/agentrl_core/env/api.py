"""Base classes environment plugins build on.

An :class:`Environment` declares its tools, index sets and concurrency and opens
sessions. A :class:`ToolSession` implements the Session protocol for the usual
AgentBench-FC shape: one tool call per turn, a round limit, error observations for bad
turns (status stays ``running``, ``metrics.invalid_turns`` counts them), a guard against
stepping a finished or busy session, and an idempotent ``close``. Subclasses write only
``on_start``, ``on_tool_call`` and, when they hold resources, ``on_close``.

Blocking engines (a TextWorld game, a synchronous driver) run through :func:`run_blocking`
or :class:`ThreadedSession`, so they never block the event loop.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import attrs

from agentrl_core.env.tools import BadTurn, ToolCall, first_tool_call, tool_calls_of
from agentrl_core.errors import EnvError, SessionError
from agentrl_core.protocols import Agent, Session
from agentrl_core.types import Index, Message, Status, Step

T = TypeVar("T")


class UnknownIndexError(EnvError, KeyError):
    """A split or index the environment does not have (the worker answers 400)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class Environment(abc.ABC):
    """Base class of environments. ``config`` is the plugin's validated config section."""

    name: str = ""
    tools: list[dict[str, Any]] = []
    concurrency: int = 16

    def __init__(self, config: Any = None) -> None:
        self.config = config

    @abc.abstractmethod
    def index_sets(self) -> Mapping[str, Sequence[Index]]:
        """Named index sets, e.g. ``{"std": [0, 1, ...], "dev": [...]}``."""

    @abc.abstractmethod
    async def open(self, split: str, index: Index) -> Session:
        """Prepare a session for one sample; ``start()`` is called next."""

    def oracle(self, split: str, index: Index, *, error_rate: float = 0.0, seed: int = 0) -> Agent:
        """A scripted agent that solves ``(split, index)``; with ``error_rate`` > 0 it errs on purpose."""
        raise NotImplementedError(f"environment {self.name!r} has no oracle")

    async def aclose(self) -> None:
        """Release environment-wide resources (connection pools, caches)."""

    def resource_count(self) -> int | None:
        """Live per-session resources (containers, databases), or None if not tracked.

        The conformance checker uses it to prove that ``close`` releases everything.
        """
        return None

    # -- helpers for subclasses ----------------------------------------------------------

    def check_index(self, split: str, index: Index) -> Index:
        """Return ``index`` normalized to the index set's type, or raise UnknownIndexError.

        Int indices map onto string index lists by position, as upstream.
        """
        sets = self.index_sets()
        if split not in sets:
            raise UnknownIndexError(
                f"environment {self.name!r} has no index set {split!r}; available: {', '.join(sorted(sets))}"
            )
        indices = sets[split]
        if index in _index_lookup(self, split, indices):
            return index
        if isinstance(index, str) and index.lstrip("-").isdigit() and int(index) in _index_lookup(self, split, indices):
            return int(index)
        if (isinstance(index, int) and not isinstance(index, bool) and indices and isinstance(indices[0], str)
                and 0 <= index < len(indices)):
            return indices[index]
        raise UnknownIndexError(f"index {index!r} is not in {self.name}/{split} ({len(indices)} samples)")


def _index_lookup(env: Environment, split: str, indices: Sequence[Index]) -> set:
    cache = env.__dict__.setdefault("_agentrl_index_cache", {})
    key = (split, id(indices), len(indices))
    if key not in cache:
        cache[key] = set(indices)
    return cache[key]


class ToolSession(abc.ABC):
    """Session base for tool-calling environments (AgentBench-FC semantics)."""

    def __init__(self, tools: Sequence[dict[str, Any]], *, max_rounds: int) -> None:
        if max_rounds < 1:
            raise ValueError("max_rounds must be >= 1")
        self.tools = list(tools)
        self.max_rounds = max_rounds
        self.rounds = 0
        self.invalid_turns = 0
        self.status = Status.RUNNING
        self.reward = 0.0
        self._started = False
        self._busy = False
        self._closed = False

    @abc.abstractmethod
    async def on_start(self) -> Step:
        """Set up the sample and return the first messages (system/user prompt)."""

    @abc.abstractmethod
    async def on_tool_call(self, call: ToolCall, message: Message) -> Step:
        """Execute one validated tool call and return its observation."""

    async def on_text(self, message: Message) -> Step | None:
        """Handle an assistant message without tool calls; None means "bad turn" (default)."""
        return None

    async def on_bad_turn(self, bad: BadTurn, message: Message) -> Step:
        """Answer a malformed turn; the default sends the error observation and continues."""
        return Step(bad.observation)

    async def on_close(self) -> None:
        """Release this session's resources. Called exactly once."""

    def metrics(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "invalid_turns": self.invalid_turns}

    # -- Session protocol -------------------------------------------------------------

    async def start(self) -> Step:
        if self._closed:
            raise SessionError("the session is closed")
        if self._started:
            raise SessionError("start() was already called on this session")
        self._started = True
        step = await self._guarded(self.on_start())
        return self._finish_step(step)

    async def step(self, assistant_message: Message) -> Step:
        if self._closed:
            raise SessionError("the session is closed")
        if not self._started:
            raise SessionError("call start() before step()")
        if self.status is not Status.RUNNING:
            raise SessionError(f"the episode already finished with status {self.status.value!r}")
        self.rounds += 1
        step = await self._guarded(self._dispatch(assistant_message))
        if not step.finish and self.rounds >= self.max_rounds:
            step = attrs.evolve(step, status=Status.TASK_LIMIT_REACHED)
        return self._finish_step(step)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.on_close()

    # -- internals ----------------------------------------------------------------------

    async def _dispatch(self, message: Message) -> Step:
        parsed = first_tool_call(message, self.tools)
        if isinstance(parsed, ToolCall):
            return await self.on_tool_call(parsed, message)
        if isinstance(message, Mapping) and not tool_calls_of(message):
            text_step = await self.on_text(message)
            if text_step is not None:
                return text_step
        self.invalid_turns += 1
        return await self.on_bad_turn(parsed, message)

    async def _guarded(self, coro: Any) -> Step:
        if self._busy:
            coro.close()
            raise SessionError("another call on this session is still running")
        self._busy = True
        try:
            return await coro
        finally:
            self._busy = False

    def _finish_step(self, step: Step) -> Step:
        if step.finish:
            self.status = step.status
            self.reward = step.reward
        return attrs.evolve(step, metrics={**self.metrics(), **step.metrics})


async def run_blocking(fn: Callable[..., T], *args: Any, limiter: anyio.CapacityLimiter | None = None) -> T:
    """Run a blocking call in a worker thread (the event loop keeps serving)."""
    return await anyio.to_thread.run_sync(fn, *args, limiter=limiter)


class ThreadedSession:
    """Adapt a blocking session (``start() / step(msg) / close()``) to the async protocol.

    Each call runs in a worker thread; ``timeout`` bounds start and step (a call past it
    raises TimeoutError, which the worker reports as ``task error``). A thread cannot be
    killed: engines that may hang forever should run in a subprocess instead.
    """

    def __init__(self, blocking: Any, *, limiter: anyio.CapacityLimiter | None = None, timeout: float | None = None):
        self._blocking = blocking
        self._limiter = limiter
        self._timeout = timeout
        self._closed = False

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._timeout is None:
            return await run_blocking(fn, *args, limiter=self._limiter)
        with anyio.fail_after(self._timeout):
            return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter, abandon_on_cancel=True)

    async def start(self) -> Step:
        return await self._call(self._blocking.start)

    async def step(self, assistant_message: Message) -> Step:
        return await self._call(self._blocking.step, assistant_message)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            await run_blocking(self._blocking.close, limiter=self._limiter)
