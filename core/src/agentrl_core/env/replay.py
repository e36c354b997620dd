"""Replaying recorded conversations against a live environment (the fidelity benchmarks' kit).

A search for the conversation a deduplicated third-party log was filtered from tries many
branches that share prefixes; :class:`PrefixReplayer` keeps one live session and answers the
environment's step for a sequence of turns, replaying the prefix in a fresh session only when
the session in hand has played a different one, and remembering every answer it has seen.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrl_core.env.api import Environment
from agentrl_core.types import Index, Message, Step


class PrefixReplayer:
    """One live session of ``env`` at ``split``/``index``; replays a prefix of turns on demand."""

    def __init__(self, env: Environment, split: str, index: Index) -> None:
        self.env, self.split, self.index = env, split, index
        self.session: Any = None
        self.played: list[str] = []  # the keys of the turns the live session has played
        self.steps: dict[tuple[str, ...], Step] = {}
        self.env_steps = 0  # steps played in any session, the budget of a search
        self.first: Step | None = None  # the step that started the live session

    async def restart(self) -> None:
        """Close the live session (if any) and start a fresh one."""
        await self.aclose()
        self.session = await self.env.open(self.split, self.index)
        self.first = await self.session.start()
        self.played = []

    async def answer(self, turns: Sequence[Message], keys: tuple[str, ...]) -> Step:
        """The environment's step for the last of ``turns`` after playing the others (``keys`` name them)."""
        if keys in self.steps:
            return self.steps[keys]
        if self.session is None or tuple(self.played) != keys[:-1]:
            await self.restart()
            for i, turn in enumerate(turns[:-1]):
                await self.session.step(turn)
                self.env_steps += 1
                self.played.append(keys[i])
        step = await self.session.step(turns[-1])
        self.env_steps += 1
        self.played.append(keys[-1])
        self.steps[keys] = step
        return step

    async def aclose(self) -> None:
        if self.session is not None:
            session, self.session = self.session, None
            await session.close()
