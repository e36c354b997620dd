"""An in-process environment client: the controller's start/interact/cancel over Environment objects.

The agent loop talks to environments through a client with ``start``, ``interact`` and
``cancel``. :class:`LocalEnvClient` implements that interface without HTTP, for unit
tests and notebooks; training and evaluation use the controller client
(:mod:`agentrl_core.controlplane.client`), which adds worker isolation, capacity accounting
and fault handling. It answers with the same records (``Started``, ``Result``), and its
semantics match the controller's: an exception inside a session becomes ``task error`` for
that session, and a finished session is closed.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence

from agentrl_core.controlplane.client import Result, Started
from agentrl_core.errors import SessionError
from agentrl_core.protocols import Environment, Session
from agentrl_core.types import Index, Message, Status

log = logging.getLogger(__name__)


class LocalEnvClient:
    """Serve tasks named ``<env>-<split>`` (or given names) from in-process environments."""

    def __init__(self, tasks: Mapping[str, tuple[Environment, str]]) -> None:
        self.tasks = dict(tasks)
        self._ids = itertools.count(1)
        self._sessions: dict[int, Session] = {}

    @classmethod
    def for_environments(cls, envs: Sequence[Environment]) -> LocalEnvClient:
        return cls({f"{env.name}-{split}": (env, split) for env in envs for split in env.index_sets()})

    async def get_indices(self, task: str) -> list[Index]:
        env, split = self._task(task)
        return list(env.index_sets()[split])

    def _task(self, task: str) -> tuple[Environment, str]:
        if task not in self.tasks:
            raise SessionError(f"unknown task {task!r}; available: {', '.join(sorted(self.tasks))}")
        return self.tasks[task]

    async def start(self, task: str, index: Index) -> Started:
        env, split = self._task(task)
        session = await env.open(split, index)
        try:
            step = await session.start()
        except Exception as exc:  # as the worker does: a failed set-up is a task error of this session
            await session.close()
            log.warning("start of %s/%s failed: %s", task, index, exc)
            return Started(messages=[], status=Status.TASK_ERROR, finish=True, reward=0.0, session_id=next(self._ids),
                           tools=list(env.tools))
        except BaseException:
            await session.close()
            raise
        sid = next(self._ids)
        if step.finish:
            await session.close()
        else:
            self._sessions[sid] = session
        return Started.from_step(step, metrics={}, session_id=sid, tools=list(env.tools))

    async def interact(self, session_id: int, messages: Sequence[Message]) -> Result:
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionError(f"no such session {session_id}")
        assistant = [m for m in messages if m.get("role") == "assistant"]
        try:
            step = await session.step(assistant[-1] if assistant else dict(messages[-1]))
        except Exception as exc:  # as the worker does: the session fails, the others go on
            log.warning("session %s failed: %s", session_id, exc)
            await self._close(session_id)
            return Result(messages=[], status=Status.TASK_ERROR, finish=True, reward=0.0, metrics={"error": str(exc)})
        if step.finish:
            await self._close(session_id)
        return Result.from_step(step)

    async def cancel(self, session_id: int) -> None:
        await self._close(session_id)

    async def _close(self, session_id: int) -> None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            await session.close()
