"""The ``replay`` environment: the recorded workload of the real environments, replayed.

``benchmarks/workloads/record.py`` plays the oracles of the real environment plugins and
records, per episode, the number of turns, the latency of ``open + start`` and of every
``step``, and the lengths of the prompt and of every observation. This environment serves
those episodes back through the ordinary Environment/Session API (so through the real task
worker and controller): index set ``<env>`` (``db``, ``kg``, ``webshop``, ``alfworld``,
``os``) holds one index per recorded episode, and episode ``i`` of it

* answers ``start()`` after the recorded start latency with a prompt of the recorded length,
  and offers the recorded environment's real tool schemas;
* answers the k-th ``step()`` after the k-th recorded step latency with an observation of the
  k-th recorded length (a ``tool`` message when the model called a tool, else a ``user``
  message; a turn without a tool call is counted in ``metrics.invalid_turns``);
* ends after exactly the recorded number of turns, with the recorded status and reward.

So the workload (turns per episode, environment latency per turn, observation lengths) is the
recorded one whatever the model writes, and identical for every training mode. Observation
text is cut from real observation text of the same environment, so it tokenizes like the real
thing. ``latency_scale`` multiplies every latency (1.0: as recorded).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
from attrs import field, frozen

from agentrl_core.env import Environment, Status, Step
from agentrl_core.errors import ConfigError, SessionError
from agentrl_core.structure import in_range
from agentrl_core.types import Index, Message

DEFAULT_WORKLOAD = Path(__file__).resolve().parents[1] / "oracle_workload.json"


@frozen
class ReplayConfig:
    """Config section ``environments.replay``."""

    workload: str | None = None  # recorded workload JSON; None: benchmarks/workloads/oracle_workload.json
    latency_scale: float = field(default=1.0, validator=in_range(0.0))
    concurrency: int = field(default=512, validator=in_range(1))


@frozen
class RecordedEpisode:
    turns: int
    start_s: float
    step_s: tuple[float, ...]
    close_s: float
    prompt_chars: int
    obs_chars: tuple[int, ...]
    status: str
    reward: float

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], where: str) -> RecordedEpisode:
        try:
            episode = cls(int(raw["turns"]), float(raw["start_s"]), tuple(map(float, raw["step_s"])),
                          float(raw.get("close_s", 0.0)), int(raw["prompt_chars"]), tuple(map(int, raw["obs_chars"])),
                          str(raw["status"]), float(raw["reward"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: a recorded episode is malformed ({type(exc).__name__}: {exc})") from None
        if episode.turns < 1 or len(episode.step_s) != episode.turns or len(episode.obs_chars) != episode.turns:
            raise ConfigError(f"{where}: an episode needs turns >= 1 and one step latency and observation per turn")
        Status(episode.status)  # a status the rest of the system knows
        return episode


class ReplayEnvironment(Environment):
    name = "replay"
    tools: list[dict[str, Any]] = []  # each index set has the tools of the environment it replays

    def __init__(self, config: ReplayConfig | None = None) -> None:
        super().__init__(config or ReplayConfig())
        path = Path(self.config.workload) if self.config.workload else DEFAULT_WORKLOAD
        if not path.is_file():
            raise ConfigError(f"replay workload {str(path)!r} does not exist; record one with "
                              "python benchmarks/workloads/record.py")
        data = json.loads(path.read_text())
        self.concurrency = self.config.concurrency
        self.episodes: dict[str, list[RecordedEpisode]] = {}
        self.split_tools: dict[str, list[dict[str, Any]]] = {}
        self.texts: dict[str, str] = {}
        for env_name, recorded in data["environments"].items():
            where = f"{path.name}: {env_name}"
            self.episodes[env_name] = [RecordedEpisode.from_json(e, where) for e in recorded["episodes"]]
            self.split_tools[env_name] = list(recorded["tools"])
            self.texts[env_name] = "\n".join(recorded.get("text_sample") or []) or "observation text "
        self.tools = next(iter(self.split_tools.values()), [])

    def index_sets(self) -> Mapping[str, Sequence[Index]]:
        return {env_name: list(range(len(eps))) for env_name, eps in self.episodes.items()}

    async def open(self, split: str, index: Index) -> ReplaySession:
        index = self.check_index(split, index)
        return ReplaySession(self.episodes[split][int(index)], self.split_tools[split], self.texts[split],
                             seed=int(index), latency_scale=self.config.latency_scale)

    def oracle(self, split: str, index: Index, *, error_rate: float = 0.0, seed: int = 0) -> ReplayOracle:
        self.check_index(split, index)
        return ReplayOracle(self.split_tools[split])


def filler_text(corpus: str, length: int, offset: int) -> str:
    """``length`` characters of ``corpus`` starting at ``offset`` (wrapping around)."""
    if length <= 0:
        return ""
    start = offset % len(corpus)
    out = corpus[start:start + length]
    while len(out) < length:
        out += "\n" + corpus[: length - len(out) - 1]
    return out[:length]


class ReplaySession:
    """One recorded episode; see the module docstring."""

    def __init__(self, episode: RecordedEpisode, tools: list[dict[str, Any]], corpus: str, *, seed: int,
                 latency_scale: float) -> None:
        self.episode = episode
        self.tools = tools
        self.corpus = corpus
        self.seed = seed
        self.scale = latency_scale
        self.turn = 0
        self.invalid_turns = 0
        self.started = False
        self.finished = False
        self.closed = False

    async def start(self) -> Step:
        if self.closed or self.started:
            raise SessionError("start() on a closed or already started session")
        self.started = True
        await anyio.sleep(self.episode.start_s * self.scale)
        prompt = filler_text(self.corpus, self.episode.prompt_chars, self.seed * 7919)
        return Step([{"role": "user", "content": prompt}], metrics=self._metrics())

    async def step(self, assistant_message: Message) -> Step:
        if self.closed or not self.started or self.finished:
            raise SessionError("step() on a closed, unstarted or finished session")
        k = self.turn
        self.turn += 1
        calls = (assistant_message.get("tool_calls") or []) if isinstance(assistant_message, Mapping) else []
        if not calls:
            self.invalid_turns += 1
        await anyio.sleep(self.episode.step_s[k] * self.scale)
        text = filler_text(self.corpus, self.episode.obs_chars[k], self.seed * 7919 + 104729 * (k + 1))
        observation: Message = (
            {"role": "tool", "tool_call_id": str(calls[0].get("id") or "call_0"), "content": text}
            if calls and isinstance(calls[0], Mapping) else {"role": "user", "content": text}
        )
        if self.turn >= self.episode.turns:
            self.finished = True
            return Step([observation] if text else [], Status(self.episode.status), self.episode.reward, self._metrics())
        return Step([observation], metrics=self._metrics())

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.started:
            with anyio.CancelScope(shield=True):
                await anyio.sleep(self.episode.close_s * self.scale)

    def _metrics(self) -> dict[str, Any]:
        return {"rounds": self.turn, "invalid_turns": self.invalid_turns, "recorded_turns": self.episode.turns}


class ReplayOracle:
    """Calls the first tool every turn (the replay ends episodes by the recording, not by the answer)."""

    def __init__(self, tools: list[dict[str, Any]]) -> None:
        self.name = tools[0]["function"]["name"] if tools else "noop"
        self.calls = 0

    def act(self, messages: Sequence[Message]) -> Message:
        self.calls += 1
        return {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"call_{self.calls}", "type": "function", "function": {"name": self.name, "arguments": "{}"}}]}
