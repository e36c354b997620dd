"""Training an agent program: the gateway-backed agent loop of ``agentrl train`` (``agent: ...``).

:class:`GatewayAgentLoop` is an agent loop like ``chat`` (``run(request) -> Trajectory``),
so the rollout manager, the group buffer, infrastructure retries and staleness work
unchanged. Per episode:

1. open the environment session through the control plane (its first messages and tools);
2. open a gateway session and call the agent program with an :class:`AgentTask` and the
   session's base URL; the program talks to the model with its own client (the ``openai``
   SDK, the Agents SDK, LangGraph, ...) and acts on the environment with ``task.env.step``;
3. close the gateway session and turn what it captured into one Trajectory (several token
   sequences when calls forked; docs/architecture.md section 5).

The outcome, first that applies: a reward posted to the session (``POST
/sessions/{id}/reward`` or ``await task.report(reward)``), the number the program returned,
the environment's final status and reward, an agent context limit. Otherwise (the program
raised, ran past ``gateway.max_duration``, returned with no reward, or made no model call)
the episode is an infrastructure failure: never scored, retried or its group dropped.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from attrs import define, field, frozen

from agentrl_core.errors import ConfigError
from agentrl_core.gateway.client import GatewayClient, GatewayError
from agentrl_core.rollout.activity import current_episode, note_phase
from agentrl_core.types import (
    FailureKind,
    Index,
    Message,
    Status,
    Trajectory,
    TurnRecord,
    failure_kind,
    training_reward,
)

log = logging.getLogger(__name__)

RUNNING_PROGRAM = "running the agent program"  # its phase in the stall report (rollout/activity.py)

__all__ = ["AgentTask", "EnvironmentHandle", "Observation", "GatewayAgentLoop", "EpisodeFinished", "load_program"]


class EpisodeFinished(Exception):
    """``task.env.step`` was called after the environment ended the episode."""


class EnvironmentFailure(Exception):
    """The control plane failed during the episode (an infrastructure failure)."""


@frozen
class Observation:
    """What the environment answered one step: new messages (``tool`` or ``user``), and whether it ended."""

    messages: list[Message]
    finished: bool
    status: str
    reward: float
    metrics: dict[str, Any] = field(factory=dict)


def _as_message(message: Any) -> Message:
    if hasattr(message, "model_dump"):  # an openai SDK object
        message = message.model_dump(exclude_none=True)
    if not isinstance(message, dict):
        raise TypeError(f"task.env.step takes an assistant message (a dict or an openai message object), got "
                        f"{type(message).__name__}")
    out: Message = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {"id": c.get("id") or f"call_{i}", "type": "function",
             "function": {"name": c["function"]["name"], "arguments": c["function"].get("arguments") or "{}"}}
            for i, c in enumerate(message["tool_calls"])
        ]
    return out


class EnvironmentHandle:
    """The episode's environment session (through the control plane), for the agent program."""

    def __init__(self, env_client: Any, session_id: Any, started: Any) -> None:
        self._client = env_client
        self.session_id = session_id
        self.messages: list[Message] = list(started.messages)
        self.tools: list[dict[str, Any]] = list(started.tools or [])
        self.finished = bool(getattr(started, "finish", False))
        self.status = Status(getattr(started, "status", Status.RUNNING)).value
        self.reward = float(getattr(started, "reward", 0.0) or 0.0)
        self.metrics: dict[str, Any] = {}
        self.steps = 0
        self.failure = ""
        self._lock = anyio.Lock()
        self._activity = current_episode()  # the program may call step() from a thread of its own

    async def step(self, message: Any) -> Observation:
        """Send one assistant message (its first tool call acts, as in AgentBench); the observation comes back.

        A reply without a usable tool call gets an error observation and the episode goes on,
        exactly as in the ``chat`` loop; the environment ends the episode (and scores it) on
        its own terms, at the latest at its round limit.
        """
        async with self._lock:
            if self.finished:
                raise EpisodeFinished(f"the episode has ended with status {self.status!r}; stop acting and return")
            if self._activity is not None:
                self._activity.note("in the environment", self.steps)
            try:
                reply = await self._client.interact(self.session_id, [_as_message(message)])
            except Exception as exc:
                self.failure = f"interact: {exc}"  # kept even if the program swallows the exception
                raise EnvironmentFailure(self.failure) from exc
            finally:
                if self._activity is not None:
                    self._activity.note(RUNNING_PROGRAM, self.steps + 1)
            self.steps += 1
            self.metrics = dict(reply.metrics or {})
            if reply.finish:
                self.finished = True
                self.status = Status(reply.status).value
                self.reward = float(reply.reward or 0.0)
            return Observation(list(reply.messages), bool(reply.finish), Status(reply.status).value,
                               float(reply.reward or 0.0), dict(reply.metrics or {}))


@define
class AgentTask:
    """What an agent program gets for one episode (besides its base URL).

    ``messages`` and ``tools`` are the environment's first messages and its tools (OpenAI
    format); ``env.step(message)`` acts. ``model`` and ``api_key`` are what to pass to the
    OpenAI client (the base URL already binds the session; the key does too, on ``/v1``).
    ``options`` is the program's validated config section (``agent.<name>``).
    """

    name: str  # the controller task, e.g. calc-train
    index: Index
    split: str
    sample: int
    group_id: str
    uid: str
    messages: list[Message]
    tools: list[dict[str, Any]]
    env: EnvironmentHandle | None
    model: str
    api_key: str
    session_id: str
    base_url: str
    options: Any = None
    _report: Callable[..., Any] | None = None

    async def report(self, reward: float, status: str | None = None, metrics: dict[str, Any] | None = None) -> None:
        """Post the episode's reward to the gateway session (the same as ``POST /sessions/{id}/reward``)."""
        if self._report is None:
            raise RuntimeError("this task has no gateway session to report to")
        await self._report(self.session_id, reward, status, metrics)


def load_program(name: str, *, registry: Any, options: Any = None, base_dir: str | Path | None = None) -> Any:
    """The agent program ``name``: a registered program, ``module:function`` or ``path/to/file.py:function``."""
    from agentrl_core.types import AgentProgramSpec

    if ":" not in name:
        return registry.build(AgentProgramSpec, name, options)
    target, _, attr = name.rpartition(":")
    try:
        if target.endswith(".py") or "/" in target:
            path = Path(target)
            if not path.is_absolute() and base_dir is not None and not path.exists():
                path = Path(base_dir) / path
            if not path.is_file():
                raise ConfigError(f"agent {name!r}: {target} is not a file (relative paths are from the working "
                                  "directory or the config file's folder)")
            module_name = f"agentrl_agent_program_{path.stem}"
            spec = importlib.util.spec_from_file_location(module_name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
        program = module
        for part in attr.split("."):
            program = getattr(program, part)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"agent {name!r} cannot be loaded: {type(exc).__name__}: {exc}") from exc
    if not callable(program):
        raise ConfigError(f"agent {name!r} is not a function: give 'module:function' or 'file.py:function', an "
                          "async function (task, base_url) -> reward or None")
    return program


class GatewayAgentLoop:
    """Plays episodes by running an agent program against the gateway; see the module docstring."""

    def __init__(self, *, program: Callable[..., Any], gateway: GatewayClient, env_client: Any,
                 incomplete_punishment: float = -0.2, timeout: float = 3600.0, start_wait: float = 600.0,
                 threads: int = 64, options: Any = None) -> None:
        self.program = program
        self.gateway = gateway
        self.env_client = env_client
        self.incomplete_punishment = incomplete_punishment
        self.timeout = timeout
        self.start_wait = start_wait
        self.options = options
        # an async function, or an object whose __call__ is one
        self.is_async = inspect.iscoroutinefunction(program) or inspect.iscoroutinefunction(type(program).__call__)
        self.threads = anyio.CapacityLimiter(threads)
        self.empty_sessions = 0

    async def run(self, request: Any) -> Trajectory:
        try:
            started = await self._start(request)
        except Exception as exc:  # the control plane failed: infrastructure
            log.warning("start of %s/%s failed: %s", request.task, request.index, exc)
            return self._empty(request, Status.UNKNOWN, {"infra_error": f"start: {exc}"})
        if getattr(started, "finish", False):  # the sample could not be set up (or ended at once)
            status = Status(started.status)
            return self._empty(request, status, {"infra_error": f"start: the session ended with {status.value!r}"}
                               if failure_kind(status) is FailureKind.INFRA else {}, float(started.reward or 0.0))
        env = EnvironmentHandle(self.env_client, started.session_id, started)
        record: dict[str, Any] | None = None
        returned: Any = None
        error = ""
        t0 = time.monotonic()
        try:
            session = await self.gateway.create_session(uid=request.uid, group_id=request.group_id,
                                                        sample=request.sample, task=request.task)
            task = AgentTask(
                name=request.task, index=request.index, split=request.split, sample=request.sample,
                group_id=request.group_id, uid=request.uid, messages=list(env.messages), tools=list(env.tools),
                env=env, model=session["model"], api_key=session["key"], session_id=session["id"],
                base_url=session["base_url"], options=self.options, report=self.gateway.post_reward,
            )
            note_phase(RUNNING_PROGRAM, 0)
            try:
                with anyio.fail_after(self.timeout):
                    returned = await self._call(task)
            except TimeoutError:
                error = f"the agent program did not finish within {self.timeout:g} s (gateway.max_duration)"
            except EnvironmentFailure as exc:
                error = f"environment: {exc}"
            except Exception as exc:  # the team's code: reported, never scored
                error = f"the agent program raised {type(exc).__name__}: {exc}"
                log.warning("agent program on %s/%s: %s", request.task, request.index, error)
            finally:
                note_phase("ending its session")
                with anyio.CancelScope(shield=True):
                    record = await self._close(session["id"], returned)
        except GatewayError as exc:
            error = error or f"gateway: {exc}"
        finally:
            if not env.finished:
                with anyio.CancelScope(shield=True):
                    await self._cancel(env.session_id)
        return self._trajectory(request, env, record, returned, error, time.monotonic() - t0)

    async def _start(self, request: Any) -> Any:
        """Start the environment session; while every worker is full, wait (back-pressure, not a failure)."""
        from agentrl_core.controlplane.client import NoCapacity

        deadline = time.monotonic() + self.start_wait
        pause = 0.5
        while True:
            try:
                return await self.env_client.start(request.task, request.index)
            except NoCapacity:
                if time.monotonic() + pause > deadline:
                    raise
                note_phase("waiting for a free worker slot")
                await anyio.sleep(pause)
                pause = min(pause * 2, 10.0)

    async def _call(self, task: AgentTask) -> Any:
        if self.is_async:
            return await self.program(task, task.base_url)
        result = await anyio.to_thread.run_sync(self.program, task, task.base_url, limiter=self.threads)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def _close(self, session_id: str, returned: Any) -> dict[str, Any] | None:
        try:
            with anyio.fail_after(60):
                return await self.gateway.close_session(session_id, reason="the agent program returned")
        except (GatewayError, TimeoutError) as exc:
            log.warning("closing gateway session %s failed: %s", session_id, exc)
            return None

    async def _cancel(self, session_id: Any) -> None:
        try:
            with anyio.fail_after(30):
                await self.env_client.cancel(session_id)
        except Exception as exc:  # the controller expires idle sessions anyway
            log.warning("cancel of environment session %s failed: %s", session_id, exc)

    # -- the trajectory -------------------------------------------------------------------------

    def _outcome(self, env: EnvironmentHandle, record: dict[str, Any], returned: Any) -> tuple[Status, float, str]:
        if record.get("posted"):
            return Status(record["status"]), float(record["reward"] or 0.0), "posted"
        if isinstance(returned, int | float) and not isinstance(returned, bool):
            return Status.COMPLETED, float(returned), "returned"
        if env.finished:
            return Status(env.status), env.reward, "environment"
        if record.get("status") == Status.AGENT_CONTEXT_LIMIT.value:
            return Status.AGENT_CONTEXT_LIMIT, 0.0, "context_limit"
        return Status.CANCELLED, 0.0, ""

    def _trajectory(self, request: Any, env: EnvironmentHandle, record: dict[str, Any] | None, returned: Any,
                    error: str, seconds: float) -> Trajectory:
        if record is None:
            return self._empty(request, Status.UNKNOWN, {"infra_error": error or "the gateway session was lost"})
        samples = record.get("sample_records") or []
        status, reward, source = self._outcome(env, record, returned)
        metrics: dict[str, Any] = {**env.metrics, **record.get("outcome_metrics", {}),
                                   "agent_seconds": seconds, "env_steps": env.steps,
                                   "gateway/samples": len(samples),
                                   **{f"gateway/{k}": v for k, v in (record.get("counts") or {}).items()}}
        if error and not source:
            status, reward = Status.CANCELLED, 0.0
            metrics["infra_error"] = error
        elif error:  # the episode has an outcome all the same (e.g. the SDK raised on the context limit)
            metrics["agent_error"] = error
        if failure_kind(status) is not FailureKind.INFRA and not any(sum(s["loss_mask"]) for s in samples):
            self.empty_sessions += 1
            if self.empty_sessions == 1:
                log.warning("an agent program ended an episode without any model call through the gateway: pass "
                            "task.base_url (and task.api_key) to its OpenAI client; such episodes are not scored")
            status, reward = Status.CANCELLED, 0.0
            metrics["infra_error"] = "the agent program made no model call through the gateway's base URL"
        elif failure_kind(status) is FailureKind.INFRA and "infra_error" not in metrics:
            metrics["infra_error"] = f"environment: {env.failure}" if env.failure else ("the episode ended without a reward: the agent program neither posted nor "
                                      "returned one, and the environment did not finish it")
        ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        for s in samples:
            ids += s["input_ids"]
            mask += s["loss_mask"]
            logprobs += s["rollout_logprobs"]
            versions += s["versions"]
        turns = [TurnRecord(t["pool"], t["engine"], int(t["version"]), int(t["num_tokens"]), t["finish_reason"],
                            int(t.get("aborted_retries", 0))) for t in record.get("turns") or []]
        kind = failure_kind(status)
        reward = reward if kind is FailureKind.NONE else 0.0
        return Trajectory(
            group_id=request.group_id, uid=request.uid, task=request.task, split=request.split, index=request.index,
            input_ids=ids, loss_mask=mask, rollout_logprobs=logprobs, versions=versions, turns=turns,
            reward=reward, training_reward=training_reward(status, reward, self.incomplete_punishment),
            status=status, failure=kind, num_turns=len(turns), sample=request.sample,
            prompt_length=samples[0]["prompt_length"] if samples else 0, metrics=metrics,
            sequence_lengths=[len(s["input_ids"]) for s in samples] if len(samples) > 1 else None,
        )

    def _empty(self, request: Any, status: Status, metrics: dict[str, Any], reward: float = 0.0) -> Trajectory:
        kind = failure_kind(status)
        reward = reward if kind is FailureKind.NONE else 0.0
        return Trajectory(
            group_id=request.group_id, uid=request.uid, task=request.task, split=request.split, index=request.index,
            input_ids=[], loss_mask=[], rollout_logprobs=[], versions=[], turns=[], reward=reward,
            training_reward=training_reward(status, reward, self.incomplete_punishment), status=status, failure=kind,
            sample=request.sample, metrics=metrics,
        )

