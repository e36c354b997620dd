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
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
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


_TAKE = re.compile(r"^take (\S+) (\d+) from (.+)$")
# the receptacle a step acts at: put/move X to Y, heat/cool/clean X with Y
_DESTINATION = re.compile(r"^(?:put .+ in/on|move .+ to|(?:heat|cool|clean) .+ with) (\S+ \d+)$")


def receptacle_type(name: str) -> str:
    """``"countertop 1"`` -> ``"countertop"``."""
    return name.rsplit(" ", 1)[0] if name.rsplit(" ", 1)[-1].isdigit() else name


def where_taken(walkthroughs: Iterable[Sequence[str]]) -> dict[str, Counter[str]]:
    """Object type -> how often each receptacle type is where a walkthrough took one: the prior a
    searching agent visits receptacles by (an apple is on a countertop or in the fridge)."""
    prior: dict[str, Counter[str]] = {}
    for steps in walkthroughs:
        for step in steps:
            take = _TAKE.match(step)
            if take:
                prior.setdefault(take.group(1), Counter())[receptacle_type(take.group(3))] += 1
    return prior


def search_plan(walkthrough: Sequence[str]) -> list[tuple[str, str]]:
    """The walkthrough with each way to an object replaced by a search for its type.

    ``go to`` (and ``open Y``) right before ``take O N from Y`` become ``("search", "O N")``;
    every other step stays ``("step", text)``. The walkthrough knows where the object is; the
    search only knows the room's receptacles and where such objects usually are.
    """
    plan: list[tuple[str, str]] = []
    for step in walkthrough:
        take = _TAKE.match(step)
        if take:
            place = take.group(3)
            # the way there: opening it, and the go to before (to it, or to one beside it: "go to desk 1",
            # "take keychain 1 from drawer 1")
            if plan and plan[-1] == ("step", f"open {place}"):
                plan.pop()
            if plan and plan[-1][0] == "step" and plan[-1][1].startswith("go to "):
                plan.pop()
            plan.append(("search", f"{take.group(1)} {take.group(2)}"))
        else:
            plan.append(("step", step))
    return plan


class SearchingOracle(WalkthroughOracle):
    """Finds each object the walkthrough takes by looking for it, as an agent must.

    The walkthrough goes straight to where the game put the object, which the agent cannot know
    from what it sees; a model imitating it learns to guess. This oracle instead visits the
    room's receptacles (those with a ``go to`` command), the likeliest first by ``prior``
    (:func:`where_taken` over the training games) and then in the listed order, opens a closed
    one, and takes the first object of the wanted type it sees (not one it already moved); the
    walkthrough's later steps then name that object, and those the search made wrong are mended
    (going to a destination the walkthrough stood beside, opening one it had opened on its way,
    skipping an ``open`` of what is open). Mistakes are made as :class:`WalkthroughOracle` makes
    them. A search can run out of steps in a large room where the walkthrough would not.
    """

    def __init__(self, game_file: Callable[[], str | Path], *, prior: dict[str, Counter[str]] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(game_file, **kwargs)
        self.prior = prior or {}
        self._plan: list[tuple[str, str]] | None = None
        self.renamed: dict[str, str] = {}  # walkthrough object -> the one found instead
        self.moved: set[str] = set()  # objects taken so far: not searched for again
        self.visited: set[str] = set()  # receptacles gone to
        self.here: str | None = None
        self.seen: dict[str, str] = {}  # receptacle -> the observation that last showed what is in/on it
        self._last: str | None = None  # the last action sent

    @property
    def plan(self) -> list[tuple[str, str]]:
        if self._plan is None:
            self._plan = search_plan(self.walkthrough)
        return self._plan

    def act(self, messages: Sequence[Message]) -> Message:
        last = next((m for m in reversed(messages) if m.get("role") in ("user", "tool")), {})
        observation, admissible = parse_observation(str(last.get("content") or ""))
        done = self._last is not None and not observation.startswith("Nothing happens")
        if done and self._last.startswith("go to "):
            self.here = self._last[len("go to "):]
            self.visited.add(self.here)
        if done and self.here is not None and self._last in (f"go to {self.here}", f"open {self.here}"):
            self.seen[self.here] = observation  # what is there, as last seen
        if self._pending and done:
            kind, target = self.plan[self.position]
            if kind == "search":  # the take was accepted: the search is over
                taken = _TAKE.match(self._last)
                found = f"{taken.group(1)} {taken.group(2)}"
                self.renamed[target] = found
                self.moved.add(found)
            self.position += 1
        self._pending = False
        while self.position < len(self.plan) and self._needless(self.plan[self.position], admissible):
            self.position += 1
        if self.position >= len(self.plan):
            action = "look"
        elif self.error_rate > 0 and self.rng.random() < self.error_rate:
            harmless = [c for c in admissible if c.startswith(_HARMLESS)]
            action = self.rng.choice(harmless) if harmless and self.rng.random() < 0.5 else self.rng.choice(_UNKNOWN)
        else:
            kind, target = self.plan[self.position]
            if kind == "search":
                action, self._pending = self._search(target, observation, admissible)
            else:
                action = to_command(self._renamed(target), admissible, self.wording)
                self._pending = True
                place = _DESTINATION.match(action)
                if action not in admissible and place is not None:
                    if place.group(1) != self.here and f"go to {place.group(1)}" in admissible:
                        # the walkthrough was there already (its object lay next to it), the search was not
                        action, self._pending = f"go to {place.group(1)}", False
                    elif f"open {self.here}" in admissible and "is closed" in observation:
                        # the walkthrough opened this receptacle on its way to the object, the search did not
                        action, self._pending = f"open {self.here}", False
        self._last = action
        self.calls += 1
        return assistant_tool_call("take_action", {"action": action}, call_id=f"call_{self.calls}")

    def _needless(self, item: tuple[str, str], admissible: Sequence[str]) -> bool:
        """A walkthrough step the search made needless: going where it already is, opening what it opened
        (the game would snap that to "close")."""
        kind, step = item
        return kind == "step" and (step == f"go to {self.here}" or (step.startswith("open ") and step not in admissible))

    def _renamed(self, step: str) -> str:
        for old, new in self.renamed.items():
            step = re.sub(rf"\b{re.escape(old)}\b", new, step)
        return step

    def _search(self, target: str, observation: str, admissible: Sequence[str]) -> tuple[str, bool]:
        """The next action of a search for an object of ``target``'s type; True when it is the take."""
        kind = target.rsplit(" ", 1)[0]

        def unmoved(place: str) -> list[str]:
            found = re.findall(rf"\b{re.escape(kind)} (\d+)\b", self.seen.get(place, ""))
            return [f"{kind} {n}" for n in found if f"{kind} {n}" not in self.moved]

        if self.here is not None:
            for obj in unmoved(self.here):
                if f"take {obj} from {self.here}" in admissible:
                    return f"take {obj} from {self.here}", True
            if f"open {self.here}" in admissible and "is closed" in observation:
                return f"open {self.here}", False
        for place in self.seen:  # one seen on the way to an earlier object
            if place != self.here and unmoved(place) and f"go to {place}" in admissible:
                return f"go to {place}", False
        places = [c[len("go to "):] for c in admissible if c.startswith("go to ")]
        places = [p for p in places if p not in self.visited and p != self.here]
        if not places:
            return "look", False  # searched everywhere: nothing of the kind left
        likely = self.prior.get(kind, Counter())
        order = {p: i for i, p in enumerate(places)}
        return f"go to {min(places, key=lambda p: (-likely[receptacle_type(p)], order[p]))}", False


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
