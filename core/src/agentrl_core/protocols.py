"""The contracts of docs/architecture.md section 3 as typed Protocols.

Plugins implement these; core only ever talks to components through them. Environment
plugins usually subclass :class:`agentrl_core.env.Environment` and
:class:`agentrl_core.env.ToolSession`, which implement the Environment and Session
protocols with the bookkeeping (turn limits, idempotent close, error observations) done once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from agentrl_core.types import AdvantageBatch, Index, Message, PoolSpec, Step, TurnContext


@runtime_checkable
class Session(Protocol):
    """One episode. ``close`` is always called by the owner and is idempotent."""

    async def start(self) -> Step: ...

    async def step(self, assistant_message: Message) -> Step: ...

    async def close(self) -> None: ...


@runtime_checkable
class Agent(Protocol):
    """A policy that plays a session through the same API a model does.

    ``act`` receives the whole conversation so far (system/user/assistant/tool messages)
    and returns the next assistant message (OpenAI format, usually with ``tool_calls``).
    """

    def act(self, messages: Sequence[Message]) -> Message: ...


@runtime_checkable
class Environment(Protocol):
    name: str
    tools: list[dict[str, Any]]
    concurrency: int

    def index_sets(self) -> Mapping[str, Sequence[Index]]: ...

    async def open(self, split: str, index: Index) -> Session: ...

    def oracle(self, split: str, index: Index, *, error_rate: float = 0.0, seed: int = 0) -> Agent: ...

    async def aclose(self) -> None: ...


class Sampler(Protocol):
    def pools(self) -> list[PoolSpec]: ...

    def choose(self, turn: TurnContext) -> str: ...


class AdvantageEstimator(Protocol):
    def __call__(self, rewards: Any, group_ids: Sequence[str], loss_mask: Any) -> Any:
        """Rewards ``[B]``, group ids (length B), loss mask ``[B, L]`` -> advantages ``[B, L]``."""


class AdvantageNormalizer(Protocol):
    def __call__(self, batch: AdvantageBatch) -> AdvantageBatch: ...


class PolicyLoss(Protocol):
    def __call__(
        self,
        logprobs: Any,
        old_logprobs: Any,
        ref_logprobs: Any,
        advantages: Any,
        loss_mask: Any,
        config: Any,
    ) -> tuple[Any, dict[str, float]]: ...


class WeightSyncTransport(Protocol):
    def connect(self, learner_rank0: Any, engines: Sequence[str]) -> None: ...

    def send(self, named_tensors: Any, version: int) -> None: ...

    def close(self) -> None: ...


class EngineDriver(Protocol):
    def launch(self, pool: str, model_path: str, devices: Sequence[Any]) -> list[str]: ...

    def shutdown(self) -> None: ...


class ToolParser(Protocol):
    def parse(self, text: str, tools: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], str, str | None]:
        """Return ``(tool_calls, normal_text, error)``; never raises."""


class AgentLoop(Protocol):
    async def run(self, request: Any) -> Any: ...


class ChatTemplate(Protocol):
    """Renders an OpenAI conversation into the model's prompt token ids."""

    def render(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None, *,
               add_generation_prompt: bool) -> list[int]: ...


class ReasoningParser(Protocol):
    def parse(self, text: str) -> tuple[str | None, str]:
        """Return ``(reasoning, content)``: the reasoning text (``None`` if there is none) and the rest; never raises."""


class AgentProgram(Protocol):
    """A third party's agent: plays one task through the OpenAI-compatible ``base_url``.

    Returns the reward (a number) or ``None`` when the reward comes from elsewhere (posted to
    the session, or computed by the environment). A plain function is fine too.
    """

    async def __call__(self, task: Any, base_url: str) -> float | None: ...


class Logger(Protocol):
    def log(self, step: int, metrics: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...
