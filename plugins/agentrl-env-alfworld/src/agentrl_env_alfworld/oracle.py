"""The oracle: plays the expert walkthrough stored in each game file.

Every ``game.tw-pddl`` carries the walkthrough that ALFWorld's hand-coded expert found when
the game was generated (3 to 10 commands; ALFWorld >= 0.4 wording). Under AgentBench's
wording "move X to Y" reads "put X in/on Y"; the oracle picks the admissible command that
matches. It follows the session like a model: it reads the admissible commands from the last
observation, and a step counts as done only when the game did not answer "Nothing happens.".

With ``error_rate`` > 0 it makes mistakes on purpose before a walkthrough step, with that
probability: a harmless admissible command (look, inventory, examine ...) or a command the
game does not know. Mistakes cost steps and can trip the repeated-action rule, as a model's would.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentrl_core.env import assistant_tool_call
from agentrl_core.types import Message

_MOVE = re.compile(r"^move (.+) to (.+)$")
_MARKER = " AVAILABLE ACTIONS: "
_HARMLESS = ("look", "inventory", "examine ")
# No word in common with any command, so BLEU snapping leaves them alone.
_UNKNOWN = ("xyzzy", "dance", "sing loudly", "jump")


def walkthrough_of(path: str | Path) -> list[str]:
    return list(json.loads(Path(path).read_text(encoding="utf-8")).get("walkthrough") or [])


def to_command(step: str, admissible: Sequence[str], wording: str) -> str:
    """The admissible command for one walkthrough step (the step itself if none matches)."""
    if step in admissible or wording != "agentbench":
        return step
    move = _MOVE.match(step)
    if move:
        put = f"put {move.group(1)} in/on {move.group(2)}"
        if put in admissible or not admissible:
            return put
    return step


def parse_observation(content: str) -> tuple[str, list[str]]:
    """Split a user/tool message into the observation and its admissible commands."""
    if _MARKER not in content:
        return content, []
    observation, _, listing = content.partition(_MARKER)
    return observation, [line for line in listing.split("\n") if line]


class WalkthroughOracle:
    def __init__(
        self,
        game_file: Callable[[], str | Path],
        *,
        wording: str = "agentbench",
        error_rate: float = 0.0,
        seed: int = 0,
    ) -> None:
        self._game_file = game_file
        self.wording = wording
        self.error_rate = error_rate
        self.rng = random.Random(seed)
        self._walkthrough: list[str] | None = None
        self.position = 0  # walkthrough steps the game has accepted
        self._pending = False  # the last action was the walkthrough step at ``position``
        self.calls = 0

    @property
    def walkthrough(self) -> list[str]:
        if self._walkthrough is None:
            # Read lazily: by the first act() the session has started, so the game file is unpacked.
            self._walkthrough = walkthrough_of(self._game_file())
        return self._walkthrough

    def act(self, messages: Sequence[Message]) -> Message:
        last = next((m for m in reversed(messages) if m.get("role") in ("user", "tool")), {})
        observation, admissible = parse_observation(str(last.get("content") or ""))
        if self._pending and not observation.startswith("Nothing happens"):
            self.position += 1
        self._pending = False
        steps = self.walkthrough
        if self.position >= len(steps):
            action = "look"  # the walkthrough is exhausted without a win: nothing left to try
        elif self.error_rate > 0 and self.rng.random() < self.error_rate:
            harmless = [c for c in admissible if c.startswith(_HARMLESS)]
            action = self.rng.choice(harmless) if harmless and self.rng.random() < 0.5 else self.rng.choice(_UNKNOWN)
        else:
            action = to_command(steps[self.position], admissible, self.wording)
            self._pending = True
        self.calls += 1
        return assistant_tool_call("take_action", {"action": action}, call_id=f"call_{self.calls}")


async def play_oracle(
    env: Any,
    split: str,
    indices: Sequence[int],
    *,
    concurrency: int = 2,
    error_rate: float = 0.0,
    seed: int = 0,
    on_episode: Callable[[int, Any], None] | None = None,
) -> list[Any]:
    """Play the oracle on ``indices`` with ``concurrency`` episodes at a time; episodes in index order.

    An episode that raises (an infrastructure failure) is returned as the exception.
    ``on_episode(index, episode)`` is called as each one finishes (benchmarks sample memory there).
    """
    import anyio

    from agentrl_core.env import play_episode

    results: dict[int, Any] = {}
    queue = list(indices)

    async def runner() -> None:
        while queue:
            index = queue.pop(0)
            try:
                agent = env.oracle(split, index, error_rate=error_rate, seed=seed + index)
                results[index] = await play_episode(env, split, index, agent)
            except Exception as exc:  # reported per episode by the caller
                results[index] = exc
            if on_episode is not None:
                on_episode(index, results[index])

    async with anyio.create_task_group() as tg:
        for _ in range(max(1, concurrency)):
            tg.start_soon(runner)
    return [results[i] for i in indices]


def miss_cause(episode: Any) -> str:
    """One line on why an oracle episode did not win."""
    if isinstance(episode, BaseException):
        return f"{type(episode).__name__}: {episode}"
    actions = [m for m in episode.messages if m.get("role") == "assistant"]
    last = next((m for m in reversed(episode.messages) if m.get("role") in ("user", "tool")), {})
    observation, _ = parse_observation(str(last.get("content") or ""))
    action = ""
    if actions and actions[-1].get("tool_calls"):
        action = json.loads(actions[-1]["tool_calls"][0]["function"]["arguments"]).get("action", "")
    return f"{episode.status.value} after {len(actions)} actions; last {action!r} -> {observation[:120]!r}"
