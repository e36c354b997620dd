"""The ``chat`` agent loop: one task episode in, one token-exact Trajectory out.

Per trajectory (docs/architecture.md section 5):

1. start a session through the environment client; encode system/user messages and tools
   with the model's chat template (loss_mask 0);
2. per turn: the sampler picks a pool, the pool an engine (sticky per trajectory); generate;
   append exactly the sampled ids (loss_mask 1, their log-probs and the weight version of
   each); a length stop appends the end-of-turn token with loss_mask 0. A weight sync in the
   middle of a turn: with ``rollout.partial_rollouts`` the engine keeps the turn going under
   the new weights (its answer tags each token with its version), and a turn that comes back
   ``abort`` anyway (an engine that can only abort) is continued from the tokens it has;
   without, an aborted turn is generated again from its start and its tokens are discarded
   (counted in ``metrics.discarded_tokens``);
3. parse tool calls, send the assistant message, append the observation tokens (loss_mask
   0, see :mod:`agentrl_core.rollout.chat_encoding`);
4. stop on finish, ``max_turns`` (``task limit reached``) or ``max_total_len`` (``agent
   context limit``); training reward and failure kind by the status table; the session is
   always ended, also on exception or cancellation.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import anyio
import attrs
from attrs import field, frozen

from agentrl_core.rollout.activity import note_phase
from agentrl_core.rollout.chat_encoding import ChatEncoder, TemplateError, probe_template
from agentrl_core.rollout.sampler import turn_rng
from agentrl_core.types import (
    FailureKind,
    Index,
    Message,
    Status,
    Trajectory,
    TurnContext,
    TurnRecord,
    failure_kind,
    training_reward,
)

log = logging.getLogger(__name__)


@frozen
class RolloutRequest:
    """One episode to play: a controller task (``db-std``) and a sample of it."""

    task: str
    index: Index
    group_id: str
    uid: str
    sample: int = 0
    split: str = ""
    env: str = ""


class EnvClient(Protocol):
    """What the loop needs from the environment side (the controller client implements it)."""

    async def start(self, task: str, index: Index) -> Any:
        """-> object with ``session_id``, ``messages``, ``tools``."""

    async def interact(self, session_id: Any, messages: Sequence[Message]) -> Any:
        """-> object with ``finish``, ``status``, ``reward``, ``messages``, ``metrics``."""

    async def cancel(self, session_id: Any) -> Any: ...


class GenerationPool(Protocol):
    name: str

    async def generate(self, key: str, input_ids: Sequence[int], sampling_params: Mapping[str, Any]) -> Any:
        """-> object with ``output_ids``, ``logprobs``, ``finish_reason``, ``weight_version``, ``engine``."""


class InfraFailure(Exception):
    """An engine or transport failure: the trajectory is not scored (retried or dropped)."""


@frozen
class LoopSettings:
    max_turns: int = 20
    max_total_len: int = 8192
    max_new_tokens: int = 1024
    temperature: float = 0.8
    top_p: float = 1.0
    top_k: int = -1
    incomplete_punishment: float = -0.2
    max_abort_retries: int = 100
    partial_rollouts: bool = True  # continue a turn cut by a weight sync instead of generating it again
    start_wait: float = 600.0  # seconds an episode waits for a free worker slot
    on_template_rewrite: str = field(default="keep_history")
    keep_messages: bool = True

    @classmethod
    def from_rollout_config(cls, rollout: Any, **overrides: Any) -> LoopSettings:
        return cls(
            max_turns=rollout.max_turns,
            max_total_len=rollout.max_total_len,
            max_new_tokens=rollout.max_new_tokens,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            incomplete_punishment=rollout.incomplete_punishment,
            partial_rollouts=rollout.partial_rollouts,
            **overrides,
        )


class ChatAgentLoop:
    """Plays episodes through an environment client and engine pools; see module docstring."""

    def __init__(
        self,
        config: Any = None,
        *,
        tokenizer: Any,
        env_client: EnvClient,
        pools: Mapping[str, GenerationPool],
        sampler: Any,
        tool_parser: Any,
        settings: LoopSettings | None = None,
        seed: int = 0,
        global_step: Callable[[], int] = lambda: 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.env_client = env_client
        self.pools = dict(pools)
        self.sampler = sampler
        self.tool_parser = tool_parser
        self.settings = settings or LoopSettings()
        self.seed = seed
        self.global_step = global_step
        self._encoders: dict[str, tuple[ChatEncoder, list[str]]] = {}
        missing = {p.name for p in sampler.pools()} - set(self.pools)
        if missing:
            raise ValueError(f"the sampler needs pools {sorted(missing)} but only {sorted(self.pools)} were given")

    def encoder_for(self, tools: Sequence[dict[str, Any]] | None) -> tuple[ChatEncoder, list[str]]:
        key = json.dumps(tools, sort_keys=True)
        if key not in self._encoders:
            encoder = ChatEncoder(self.tokenizer, tools)
            rewrites = probe_template(self.tokenizer, tools)
            if rewrites and self.settings.on_template_rewrite == "error":
                raise TemplateError("; ".join(rewrites) + " (set on_template_rewrite: keep_history to train anyway)")
            if rewrites:
                log.warning("%s: trajectories keep the history exactly as generated", "; ".join(rewrites))
            self._encoders[key] = (encoder, rewrites)
        return self._encoders[key]

    async def run(self, request: RolloutRequest) -> Trajectory:
        state = _State(request)
        session_id = None
        try:
            try:
                started = await self._start(request)
            except Exception as exc:  # the controller or worker failed: infrastructure
                log.warning("start of %s/%s failed: %s", request.task, request.index, exc)
                state.finish(Status.UNKNOWN, 0.0, {"infra_error": f"start: {exc}"})
                return self._trajectory(state)
            session_id = started.session_id
            state.session_open = True  # from here on the session is ours to end, whatever fails next
            if getattr(started, "finish", False):  # the sample could not be set up (or ended at once)
                state.finish(Status(started.status), float(getattr(started, "reward", 0.0) or 0.0),
                             {"infra_error": f"start: the session ended with {Status(started.status).value!r}"}
                             if failure_kind(started.status) is FailureKind.INFRA else {})
                state.session_open = False  # it ended on the worker already
                return self._trajectory(state)
            await self._play(state, started, session_id)
        except InfraFailure as exc:
            state.finish(Status.UNKNOWN, 0.0, {"infra_error": str(exc)})
        finally:
            if session_id is not None and state.session_open:
                with anyio.CancelScope(shield=True):
                    await self._end_session(session_id)
        return self._trajectory(state)

    async def _start(self, request: RolloutRequest) -> Any:
        """Start a session; while every worker of the task is full, wait and ask again.

        A full worker (406) is back-pressure from the control plane, not a failure: the
        episode waits for a slot with growing pauses, up to ``settings.start_wait`` seconds.
        """
        from agentrl_core.controlplane.client import NoCapacity

        deadline = time.monotonic() + self.settings.start_wait
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

    async def _end_session(self, session_id: Any) -> None:
        note_phase("ending its session")
        try:
            with anyio.fail_after(30):
                await self.env_client.cancel(session_id)
        except Exception as exc:  # the controller expires idle sessions anyway
            log.warning("cancel of session %s failed: %s", session_id, exc)

    async def _play(self, state: _State, started: Any, session_id: Any) -> None:
        s = self.settings
        encoder, rewrites = self.encoder_for(started.tools)
        if rewrites:
            state.metrics["template_rewrites_history"] = 1
        state.messages.extend(started.messages)
        state.append(encoder.encode_prompt(started.messages), mask=0)
        state.prompt_length = len(state.ids)
        for turn in range(s.max_turns):
            remaining = s.max_total_len - len(state.ids)
            if remaining <= 0:
                state.finish(Status.AGENT_CONTEXT_LIMIT, 0.0)
                return
            note_phase("generating", turn)
            result = await self._generate_turn(state, turn, encoder, min(s.max_new_tokens, remaining))
            ids = list(result.ids)
            state.append(ids, mask=1, logprobs=result.logprobs, versions=result.versions)
            ended = bool(ids) and ids[-1] in encoder.stop_token_ids
            if not ended:  # length stop: close the turn as the template would, not trained on
                state.append([encoder.eot_id], mask=0)
            text_ids = ids[:-1] if ended else ids
            state.turns.append(
                TurnRecord(result.pool, result.engine, result.version, len(ids), result.finish_reason, result.retries)
            )
            message = self._assistant_message(encoder.decode(text_ids), encoder.tools or [], state)
            state.messages.append(message)
            if len(state.ids) >= s.max_total_len:
                state.finish(Status.AGENT_CONTEXT_LIMIT, 0.0)
                return
            note_phase("in the environment", turn)
            try:
                reply = await self.env_client.interact(session_id, [message])
            except Exception as exc:
                raise InfraFailure(f"interact: {exc}") from exc
            state.messages.extend(reply.messages)
            state.env_metrics = dict(reply.metrics or {})
            if reply.finish:
                state.session_open = False  # the worker ended the session itself
                state.finish(Status(reply.status), float(reply.reward or 0.0))
                return
            state.append(encoder.encode_observation(reply.messages), mask=0)
        state.finish(Status.TASK_LIMIT_REACHED, 0.0)

    async def _generate_turn(self, state: _State, turn: int, encoder: ChatEncoder, max_new: int) -> Any:
        request = state.request
        context = TurnContext(
            group_id=request.group_id, sample=request.sample, turn=turn, task=request.task,
            rng=turn_rng(self.seed, request.group_id, request.sample, turn), global_step=self.global_step(),
        )
        pool_name = self.sampler.choose(context)
        pool = self.pools.get(pool_name)
        if pool is None:
            raise InfraFailure(f"the sampler chose pool {pool_name!r}, which does not exist")
        params = self.sampling_params(context, encoder, max_new)
        t0 = time.monotonic()
        try:
            result = await generate_turn(pool, request.uid, state.ids, params,
                                         stop_token_ids=params.get("stop_token_ids", ()),
                                         partial_rollouts=self.settings.partial_rollouts,
                                         max_abort_retries=self.settings.max_abort_retries)
        except InfraFailure as exc:
            raise InfraFailure(f"turn {turn}: {exc}") from exc
        state.generate_seconds += time.monotonic() - t0
        state.aborted_turns += result.aborted
        state.discarded_tokens += result.discarded_tokens
        state.interrupted_turns += result.interrupted
        state.mixed_version_tokens += len(result.ids) if result.mixed else 0
        return attrs.evolve(result, pool=pool_name)

    def sampling_params(self, context: TurnContext, encoder: ChatEncoder, max_new: int) -> dict[str, Any]:
        """The engine's sampling parameters for one turn; ``max_new`` already fits the context left.

        A subclass may change them per turn (the throughput benchmark's ``longtail`` loop draws
        each turn's length and sends ``ignore_eos`` with no stop tokens, so the model writes
        exactly that many tokens).
        """
        return {
            "temperature": self.settings.temperature,
            "top_p": self.settings.top_p,
            "top_k": self.settings.top_k,
            "max_new_tokens": max_new,
            "stop_token_ids": encoder.stop_token_ids,
        }

    def _assistant_message(self, text: str, tools: Sequence[dict[str, Any]], state: _State) -> Message:
        calls, normal_text, error = self.tool_parser.parse(text, tools)
        if error:
            state.parse_errors += 1
        message: Message = {"role": "assistant", "content": normal_text}
        if calls:
            message["tool_calls"] = calls
        return message

    def _trajectory(self, state: _State) -> Trajectory:
        request = state.request
        status = state.status or Status.UNKNOWN
        kind = failure_kind(status)
        reward = state.reward if kind is FailureKind.NONE else 0.0
        metrics = {
            **state.env_metrics,
            **state.metrics,
            "turns": len(state.turns),
            "aborted_turns": state.aborted_turns,
            "discarded_tokens": state.discarded_tokens,
            "interrupted_turns": state.interrupted_turns,
            "mixed_version_tokens": state.mixed_version_tokens,
            "parse_errors": state.parse_errors,
            "generate_seconds": state.generate_seconds,
        }
        return Trajectory(
            group_id=request.group_id,
            uid=request.uid,
            task=request.task,
            split=request.split,
            index=request.index,
            input_ids=state.ids,
            loss_mask=state.mask,
            rollout_logprobs=state.logprobs,
            versions=state.versions,
            turns=state.turns,
            reward=reward,
            training_reward=training_reward(status, reward, self.settings.incomplete_punishment),
            status=status,
            failure=kind,
            num_turns=len(state.turns),
            sample=request.sample,
            prompt_length=state.prompt_length,
            metrics=metrics,
            messages=state.messages if self.settings.keep_messages else None,
        )


async def generate_turn(
    pool: GenerationPool,
    key: str,
    prompt_ids: Sequence[int],
    params: Mapping[str, Any],
    *,
    stop_token_ids: Sequence[int] = (),
    partial_rollouts: bool = True,
    max_abort_retries: int = 100,
) -> TurnResult:
    """One assistant turn from ``pool``, whatever weight syncs happen meanwhile.

    An answer cut short by an ``abort`` (a weight sync paused an engine that can only abort,
    or an ``abort_request``) is continued from the tokens it has when ``partial_rollouts``:
    the next request is ``prompt + tokens so far`` with the remaining ``max_new_tokens``, so
    every token is kept with the log-prob and version of the weights that sampled it. Without
    partial rollouts the turn is generated again from its start and the cut tokens count as
    discarded. An engine that retracts instead (hf, vllm) answers once, its tokens already
    tagged with their versions. Raises :class:`InfraFailure` on engine errors, on a version
    that is not an integer, and after ``max_abort_retries + 1`` aborts in a row.
    """
    max_new = int(params["max_new_tokens"])
    stops = set(stop_token_ids)
    ids: list[int] = []  # what the turn has so far
    logprobs: list[float] = []
    versions: list[int] = []
    aborted = discarded = 0
    continued = False
    for retry in range(max_abort_retries + 1):
        try:
            out = await pool.generate(key, [*prompt_ids, *ids], {**params, "max_new_tokens": max_new - len(ids)})
        except Exception as exc:
            raise InfraFailure(f"engine ({getattr(pool, 'name', '?')}): {exc}") from exc
        out_versions = [_version(v) for v in (getattr(out, "versions", None)
                                                 or [out.weight_version] * len(out.output_ids))]
        reason = out.finish_reason
        if reason == "abort":
            aborted += 1
            if not partial_rollouts:  # generate the turn again from its start
                discarded += len(out.output_ids)
                continue
            continued = continued or bool(out.output_ids)
        ids += out.output_ids
        logprobs += out.logprobs
        versions += out_versions
        if reason == "abort":
            stopped = bool(ids) and ids[-1] in stops
            if not stopped and len(ids) < max_new:
                continue  # continue the turn from the tokens it has
            reason = "stop" if stopped else "length"
        mixed = len(set(versions)) > 1
        return TurnResult(
            ids=ids, logprobs=logprobs, versions=versions,
            version=versions[0] if versions else _version(out.weight_version), finish_reason=reason,
            engine=str(getattr(out, "engine", "")), pool=getattr(pool, "name", ""), retries=retry, aborted=aborted,
            discarded_tokens=discarded, interrupted=continued or mixed, mixed=mixed,
        )
    raise InfraFailure(f"aborted {max_abort_retries + 1} times in a row")


def _version(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InfraFailure(f"the engine reported weight version {value!r}, not an integer (start engines with "
                           "--weight-version 0 and sync versions as integers)") from None


@frozen
class TurnResult:
    """One generated turn (:func:`generate_turn`)."""

    ids: list[int]
    logprobs: list[float]
    versions: list[int]  # the weight version of each token
    version: int  # of the first token
    finish_reason: str  # stop | length
    engine: str
    pool: str
    retries: int  # requests sent after the first
    aborted: int = 0  # answers cut short by an abort
    discarded_tokens: int = 0  # tokens of aborted answers thrown away (partial rollouts off)
    interrupted: bool = False  # paused by a weight sync and continued (by the engine or by generate_turn)
    mixed: bool = False  # tokens of more than one version


class _State:
    def __init__(self, request: RolloutRequest) -> None:
        self.request = request
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.turns: list[TurnRecord] = []
        self.messages: list[Message] = []
        self.metrics: dict[str, Any] = {}
        self.env_metrics: dict[str, Any] = {}
        self.status: Status | None = None
        self.reward = 0.0
        self.session_open = False
        self.prompt_length = 0
        self.aborted_turns = 0  # answers cut short by an abort
        self.discarded_tokens = 0  # tokens of aborted answers that were thrown away (partial rollouts off)
        self.interrupted_turns = 0  # turns paused by a weight sync and continued
        self.mixed_version_tokens = 0  # tokens of turns sampled by more than one version
        self.parse_errors = 0
        self.generate_seconds = 0.0

    def append(self, ids: Sequence[int], *, mask: int, logprobs: Sequence[float] | None = None,
               versions: Sequence[int] | None = None) -> None:
        if mask and (logprobs is None or len(logprobs) != len(ids)):
            raise InfraFailure(f"the engine returned {len(ids)} tokens but {len(logprobs or [])} log-probs")
        if mask and (versions is None or len(versions) != len(ids)):
            raise InfraFailure(f"the engine returned {len(ids)} tokens but {len(versions or [])} weight versions")
        self.ids.extend(ids)
        self.mask.extend([mask] * len(ids))
        self.logprobs.extend(logprobs if mask else [0.0] * len(ids))
        self.versions.extend(versions if mask else [-1] * len(ids))

    def finish(self, status: Status, reward: float, metrics: dict[str, Any] | None = None) -> None:
        self.status = status
        self.reward = reward
        self.metrics.update(metrics or {})
