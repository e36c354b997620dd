"""Frozen records shared by core and plugins.

Two families live here:

* registration records (``EnvironmentSpec`` and friends) that plugins yield from their
  registration hooks: a validated lowercase ``name``, a lazy ``"module:attr"`` factory and
  an optional config schema (an attrs class, or a ``"module:attr"`` string naming one);
* the data records that flow through the system: :class:`Status`, :class:`Step`,
  :class:`Trajectory` and the small records of the sampler and advantage contracts.

Nothing here imports torch; tensors travel as plain lists until the learner.
"""

from __future__ import annotations

import enum
import importlib
import re
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import attrs
from attrs import field, frozen

from agentrl_core.errors import PluginError

if TYPE_CHECKING:  # the component each kind builds, named as a string in ComponentSpec[...]
    from agentrl_core.protocols import (  # noqa: F401
        AdvantageEstimator,
        AdvantageNormalizer,
        AgentLoop,
        AgentProgram,
        ChatTemplate,
        EngineDriver,
        Environment,
        Logger,
        PolicyLoss,
        ReasoningParser,
        Sampler,
        ToolParser,
        WeightSyncTransport,
    )

C = TypeVar("C")  # the component a spec's factory builds

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_FACTORY_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def _check_name(instance: Any, attribute: attrs.Attribute, value: str) -> None:
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise PluginError(
            f"{type(instance).__name__} name {value!r} is invalid: use lowercase letters, "
            "digits and underscores, starting with a letter (e.g. 'db' or 'ppo_dual_clip')."
        )


def _check_ref(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is None or (attribute.name == "config_schema" and attrs.has(value)):
        return
    if callable(value) and attribute.name == "factory":
        return
    if not isinstance(value, str) or not _FACTORY_RE.match(value):
        raise PluginError(
            f"{type(instance).__name__} {instance.name!r}: {attribute.name} must be a "
            f"'module:attr' string, got {value!r}."
        )


def resolve(ref: Any) -> Any:
    """Import a ``"module:attr"`` reference (or return a non-string as it is)."""
    if not isinstance(ref, str):
        return ref
    module_name, _, attr_path = ref.partition(":")
    obj = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    return obj


@frozen
class ComponentSpec(Generic[C]):
    """Base of every registration record.

    ``factory`` is called with the validated config section (an instance of
    ``config_schema``, or ``None`` when the component has no schema) and returns the
    component (``C``, one of :mod:`agentrl_core.protocols`). It is imported only when the
    component is first used.

    Each subclass is the one declaration of its kind: ``kind`` (the name used in errors and
    ``Registry.build("environment", ...)``), ``hook`` (its registration hook in
    :mod:`agentrl_core.hookspecs`) and ``install_pattern`` (the distribution naming
    convention behind "install agentrl-...?" hints). :data:`SPEC_TYPES` lists them all.
    """

    kind: ClassVar[str] = "component"
    hook: ClassVar[str] = ""
    install_pattern: ClassVar[str | None] = None

    name: str = field(validator=_check_name)
    factory: Any = field(validator=_check_ref)
    config_schema: Any = field(default=None, validator=_check_ref)
    description: str = ""

    def load_factory(self) -> Any:
        return resolve(self.factory)

    def load_config_schema(self) -> type | None:
        schema = resolve(self.config_schema)
        if schema is not None and not attrs.has(schema):
            raise PluginError(
                f"{self.kind} {self.name!r}: config_schema {self.config_schema!r} is not an attrs class."
            )
        return schema


@frozen
class EnvironmentSpec(ComponentSpec["Environment"]):
    kind: ClassVar[str] = "environment"
    hook: ClassVar[str] = "agentrl_environments"
    install_pattern: ClassVar[str | None] = "agentrl-env-{}"


@frozen
class SamplerSpec(ComponentSpec["Sampler"]):
    kind: ClassVar[str] = "sampler"
    hook: ClassVar[str] = "agentrl_samplers"
    install_pattern: ClassVar[str | None] = "agentrl-sampler-{}"


@frozen
class AdvantageEstimatorSpec(ComponentSpec["AdvantageEstimator"]):
    kind: ClassVar[str] = "advantage_estimator"
    hook: ClassVar[str] = "agentrl_advantage_estimators"


@frozen
class AdvantageNormalizerSpec(ComponentSpec["AdvantageNormalizer"]):
    kind: ClassVar[str] = "advantage_normalizer"
    hook: ClassVar[str] = "agentrl_advantage_normalizers"
    install_pattern: ClassVar[str | None] = "agentrl-advnorm-{}"


@frozen
class PolicyLossSpec(ComponentSpec["PolicyLoss"]):
    kind: ClassVar[str] = "policy_loss"
    hook: ClassVar[str] = "agentrl_policy_losses"


@frozen
class WeightSyncTransportSpec(ComponentSpec["WeightSyncTransport"]):
    kind: ClassVar[str] = "weight_sync_transport"
    hook: ClassVar[str] = "agentrl_weight_sync_transports"


@frozen
class RolloutEngineSpec(ComponentSpec["EngineDriver"]):
    kind: ClassVar[str] = "rollout_engine"
    hook: ClassVar[str] = "agentrl_rollout_engines"


@frozen
class ToolParserSpec(ComponentSpec["ToolParser"]):
    kind: ClassVar[str] = "tool_parser"
    hook: ClassVar[str] = "agentrl_tool_parsers"


@frozen
class AgentLoopSpec(ComponentSpec["AgentLoop"]):
    kind: ClassVar[str] = "agent_loop"
    hook: ClassVar[str] = "agentrl_agent_loops"


@frozen
class LoggerSpec(ComponentSpec["Logger"]):
    kind: ClassVar[str] = "logger"
    hook: ClassVar[str] = "agentrl_loggers"


@frozen
class ChatTemplateSpec(ComponentSpec["ChatTemplate"]):
    kind: ClassVar[str] = "chat_template"
    hook: ClassVar[str] = "agentrl_chat_templates"


@frozen
class ReasoningParserSpec(ComponentSpec["ReasoningParser"]):
    kind: ClassVar[str] = "reasoning_parser"
    hook: ClassVar[str] = "agentrl_reasoning_parsers"


@frozen
class AgentProgramSpec(ComponentSpec["AgentProgram"]):
    kind: ClassVar[str] = "agent_program"
    hook: ClassVar[str] = "agentrl_agent_programs"


# Every component kind, declared once; the registry, config validation and the tests of the
# hookspecs, the built-ins and the docs derive from this tuple.
SPEC_TYPES: tuple[type[ComponentSpec[Any]], ...] = (
    EnvironmentSpec,
    SamplerSpec,
    AdvantageEstimatorSpec,
    AdvantageNormalizerSpec,
    PolicyLossSpec,
    WeightSyncTransportSpec,
    RolloutEngineSpec,
    ToolParserSpec,
    AgentLoopSpec,
    LoggerSpec,
    ChatTemplateSpec,
    ReasoningParserSpec,
    AgentProgramSpec,
)

# ---------------------------------------------------------------------------------------
# Episodes


class Status(str, enum.Enum):
    """Episode status strings, identical to AgentBench / AgentRL ``SampleStatus``."""

    RUNNING = "running"
    COMPLETED = "completed"
    AGENT_CONTEXT_LIMIT = "agent context limit"
    AGENT_VALIDATION_FAILED = "agent validation failed"
    AGENT_INVALID_ACTION = "agent invalid action"
    TASK_LIMIT_REACHED = "task limit reached"
    UNKNOWN = "unknown"
    TASK_ERROR = "task error"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value


class FailureKind(str, enum.Enum):
    NONE = "none"
    AGENT = "agent"
    INFRA = "infra"

    def __str__(self) -> str:
        return self.value


AGENT_FAILURES = frozenset(
    {
        Status.TASK_LIMIT_REACHED,
        Status.AGENT_CONTEXT_LIMIT,
        Status.AGENT_VALIDATION_FAILED,
        Status.AGENT_INVALID_ACTION,
    }
)


def failure_kind(status: Status | str) -> FailureKind:
    """Classify an episode status by the status table of docs/architecture.md section 4."""
    status = Status(status)
    if status is Status.COMPLETED or status is Status.RUNNING:
        return FailureKind.NONE
    if status in AGENT_FAILURES:
        return FailureKind.AGENT
    return FailureKind.INFRA


def training_reward(status: Status | str, reward: float, incomplete_punishment: float = -0.2) -> float | None:
    """The reward the learner sees; ``None`` for infrastructure failures (never scored)."""
    kind = failure_kind(status)
    if kind is FailureKind.NONE:
        return float(reward)
    if kind is FailureKind.AGENT:
        return float(incomplete_punishment)
    return None


Index = int | str
Message = dict[str, Any]


@frozen
class Step:
    """What an environment returns for ``start()`` and for each ``step()``.

    ``messages`` are the *new* messages (OpenAI chat format: ``tool`` messages answering
    the assistant's tool calls, or ``user`` messages). Any status other than ``running``
    finishes the episode; ``reward`` is meaningful when it does.
    """

    messages: list[Message] = field(factory=list)
    status: Status = field(default=Status.RUNNING, converter=Status)
    reward: float = field(default=0.0, converter=float)
    metrics: dict[str, Any] = field(factory=dict)

    @property
    def finish(self) -> bool:
        return self.status is not Status.RUNNING


# ---------------------------------------------------------------------------------------
# Rollout records


@frozen
class TurnRecord:
    """One assistant turn: which pool and engine produced it, at which policy version."""

    pool: str
    engine: str
    version: int
    num_tokens: int
    finish_reason: str
    aborted_retries: int = 0


@frozen
class Trajectory:
    """One finished episode as the learner sees it (docs/architecture.md section 3).

    ``input_ids``, ``loss_mask``, ``rollout_logprobs`` and ``versions`` have the same
    length: model tokens carry ``loss_mask=1``, the engine's log-prob and the version of
    the weights that sampled them; environment and template tokens carry ``loss_mask=0``,
    log-prob 0 and version -1. ``reward`` is the raw environment reward,
    ``training_reward`` the one after the status table (``None`` for infra failures).

    ``sequence_lengths`` (``None``: one sequence) cuts the token arrays into several
    sequences that the learner trains separately, each from its own first token: a gateway
    session whose calls did not extend one another (docs/architecture.md section 5) is one
    episode, with one reward and one advantage, made of several token sequences.
    """

    group_id: str
    uid: str
    task: str
    split: str
    index: Index
    input_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    versions: list[int]
    turns: list[TurnRecord]
    reward: float
    training_reward: float | None
    status: Status = field(converter=Status)
    failure: FailureKind = field(converter=FailureKind)
    num_turns: int = 0
    sample: int = 0
    prompt_length: int = 0
    metrics: dict[str, Any] = field(factory=dict)
    messages: list[Message] | None = None
    sequence_lengths: list[int] | None = None

    def __attrs_post_init__(self) -> None:
        n = len(self.input_ids)
        for name in ("loss_mask", "rollout_logprobs", "versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Trajectory {self.uid}: {name} has {len(getattr(self, name))} entries, input_ids {n}")
        lengths = self.sequence_lengths
        if lengths is not None and (sum(lengths) != n or any(k < 1 for k in lengths)):
            raise ValueError(f"Trajectory {self.uid}: sequence_lengths {lengths} must be positive and add up to "
                             f"the {n} tokens")

    def sequences(self) -> list[tuple[int, int]]:
        """``(start, end)`` of each token sequence the learner trains separately."""
        if not self.sequence_lengths:
            return [(0, len(self.input_ids))]
        bounds, start = [], 0
        for length in self.sequence_lengths:
            bounds.append((start, start + length))
            start += length
        return bounds

    @property
    def num_action_tokens(self) -> int:
        return sum(self.loss_mask)


# ---------------------------------------------------------------------------------------
# Sampler and advantage contracts


@frozen
class PoolSpec:
    """An engine pool a sampler needs: its share of rollout devices and sync schedule.

    ``sync_every=1`` gets new weights after every learner step; ``sync_every=25`` only when
    ``global_step % 25 == 0``. Every pool is synced at start and on resume.
    """

    name: str = field(validator=_check_name)
    device_share: float = field(default=1.0)
    sync_every: int = field(default=1)

    @device_share.validator
    def _share(self, attribute: attrs.Attribute, value: float) -> None:
        if not 0.0 < value <= 1.0:
            raise ValueError(f"pool {self.name!r}: device_share must be in (0, 1], got {value}")

    @sync_every.validator
    def _every(self, attribute: attrs.Attribute, value: int) -> None:
        if value < 1:
            raise ValueError(f"pool {self.name!r}: sync_every must be >= 1, got {value}")


@frozen
class TurnContext:
    """What a sampler sees when it picks the pool for one turn.

    ``rng`` is a ``random.Random`` seeded from (run seed, group_id, sample, turn), so the
    choice is reproducible whatever order trajectories complete in.
    """

    group_id: str
    sample: int
    turn: int
    task: str
    rng: Any
    global_step: int = 0


@frozen
class AdvantageBatch:
    """Per-token advantages of one training batch with what normalizers need.

    ``advantages`` and ``loss_mask`` are ``[B, L]`` tensors; ``data_source`` and
    ``group_id`` are lists of length B.
    """

    advantages: Any
    loss_mask: Any
    data_source: list[str]
    group_id: list[str]
