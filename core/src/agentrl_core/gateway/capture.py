"""Token capture: the exact tokens of every call of a session, cut into training samples.

The captured ids are the source of truth. A session's calls accumulate in a *sample*: the
prompt tokens (``loss_mask`` 0), then the tokens the engine sampled (``loss_mask`` 1, with
their log-probs and policy versions), then, at the next call, the tokens of the new
messages (``loss_mask`` 0), and so on. For each call :func:`plan_chat` (or
:func:`plan_text` for ``/v1/completions``) decides how its prompt relates to the sample:

* ``append``: the messages extend the previous call's messages with the reply as returned,
  and the template renders that reply to exactly the sampled tokens. Only the new messages
  are rendered (:meth:`ChatEncoder.encode_observation`), so a call costs the same whatever
  the number of turns before it;
* ``realign``: the same, except that the template would tokenize the reply differently
  (the same text in other tokens: a BPE merge the model did not take, a control token). The
  sample keeps the sampled tokens and the engine is given them, so nothing drifts;
* ``fork``: the rendered prompt does not extend the sample, as text: the agent edited or
  dropped history, changed the tools, or the template rewrote a reply (Qwen3 drops the
  ``<think>`` block of a turn once a new user message follows). The sample is closed as it
  is and the call starts a new one from its own fully rendered prompt;
* ``new``: the session's first call.

When the messages do not extend the previous call's (or the template is not append-only,
which :func:`~agentrl_core.rollout.chat_encoding.probe_template` tells once per tool list),
the whole prompt is rendered and compared with the sample as text, so re-tokenization alone
never forks. Every case is counted. Nothing here awaits: a plan and its commit each run
without interruption on the event loop, and a commit whose sample changed since its plan
(two calls of one session in flight together) starts a sample of its own.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from attrs import define, field, frozen

from agentrl_core.rollout.chat_encoding import ChatEncoder, TemplateError, probe_template
from agentrl_core.types import Message

__all__ = ["Renderer", "Conversation", "TokenSample", "Plan", "Sampled", "plan_chat", "plan_text", "commit",
           "align", "messages_extend"]

NEW, APPEND, REALIGN, FORK = "new", "append", "realign", "fork"


@define
class TokenSample:
    """One training sequence; every list has ``len(ids)`` entries."""

    ids: list[int] = field(factory=list)
    mask: list[int] = field(factory=list)
    logprobs: list[float] = field(factory=list)
    versions: list[int] = field(factory=list)
    prompt_length: int = 0
    calls: int = 0

    def extend(self, ids: Sequence[int], mask: int, logprobs: Sequence[float] | None = None,
               versions: Sequence[int] | None = None) -> None:
        n = len(ids)
        self.ids.extend(ids)
        self.mask.extend([mask] * n)
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * n)
        self.versions.extend(versions if versions is not None else [-1] * n)

    def as_dict(self) -> dict[str, Any]:
        return {"input_ids": self.ids, "loss_mask": self.mask, "rollout_logprobs": self.logprobs,
                "versions": self.versions, "prompt_length": self.prompt_length, "calls": self.calls}


class Renderer:
    """The model's tokenizer and chat template, with the per-tool-list encoders and probe results cached."""

    def __init__(self, tokenizer: Any, template: Any = None, *, max_cached: int = 256) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self._encoders: dict[str, tuple[ChatEncoder, bool]] = {}
        self._max_cached = max_cached

    def encoder(self, key: str, tools: Sequence[dict[str, Any]] | None,
                template_kwargs: dict[str, Any]) -> tuple[ChatEncoder, bool]:
        """The encoder of this tool list and template options, and whether the template is append-only."""
        cached = self._encoders.get(key)
        if cached is None:
            encoder = ChatEncoder(self.tokenizer, tools, template=self.template, template_kwargs=template_kwargs)
            append_only = not probe_template(self.tokenizer, tools, template=self.template,
                                             template_kwargs=template_kwargs)
            if len(self._encoders) >= self._max_cached:
                self._encoders.pop(next(iter(self._encoders)))
            cached = self._encoders[key] = (encoder, append_only)
        return cached

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def context_key(tools: Sequence[dict[str, Any]] | None, template_kwargs: dict[str, Any]) -> str:
    raw = json.dumps([tools or None, template_kwargs], sort_keys=True, ensure_ascii=False)
    return hashlib.sha1(raw.encode()).hexdigest()


# ---------------------------------------------------------------------------------------
# Comparing messages


def _norm_calls(calls: Any) -> list[tuple[str, Any]]:
    out = []
    for call in calls or ():
        function = call.get("function") or {}
        arguments = function.get("arguments")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            pass
        out.append((function.get("name"), arguments))
    return out


def same_message(a: Message, b: Message) -> bool:
    """Equal as the model sees them: role, text (``None`` is ``""``) and tool calls (ids and reasoning ignored)."""
    return (a.get("role") == b.get("role") and (a.get("content") or "") == (b.get("content") or "")
            and _norm_calls(a.get("tool_calls")) == _norm_calls(b.get("tool_calls")))


def messages_extend(messages: Sequence[Message], previous: Sequence[Message]) -> bool:
    return len(messages) > len(previous) and all(same_message(m, p) for m, p in zip(messages, previous))


def with_reasoning(messages: Sequence[Message], replies: dict[str, str]) -> list[Message]:
    """Put back the reasoning of replies the gateway returned, where the client sent them without it."""
    if not replies:
        return list(messages)
    out = []
    for m in messages:
        if m.get("role") == "assistant" and "reasoning_content" not in m:
            reasoning = replies.get(reply_key(m))
            if reasoning is not None:
                m = {**m, "reasoning_content": reasoning}
        out.append(m)
    return out


def reply_key(message: Message) -> str:
    return json.dumps([message.get("content") or "", _norm_calls(message.get("tool_calls"))], sort_keys=True)


# ---------------------------------------------------------------------------------------
# Plans


@frozen
class Plan:
    """How one call's prompt relates to the session's current sample."""

    kind: str  # new | append | realign | fork
    prompt_ids: list[int]
    base: int  # Conversation.generation the plan was made against
    key: str  # tools and template options (context_key; "" for completion calls)
    reuse: int = 0  # tokens of the current sample the prompt starts with (append, realign)
    reason: str = ""
    messages: list[Message] | None = None  # the conversation as rendered (chat), reasoning restored


@define
class Conversation:
    """The capture state of one session."""

    samples: list[TokenSample] = field(factory=list)
    current: TokenSample | None = None
    messages: list[Message] | None = None  # what the current sample holds, as messages (chat calls)
    reply_ids: list[int] = field(factory=list)  # the last reply's tokens as kept (sampled, + eot if added)
    key: str = ""  # tools and template options of the current sample
    generation: int = 0
    replies: dict[str, str] = field(factory=dict)  # reasoning of the replies returned, by reply_key
    counts: Counter = field(factory=Counter)
    fork_reasons: Counter = field(factory=Counter)


def _full(kind: str, ids: list[int], conv: Conversation, key: str, reason: str = "",
          messages: list[Message] | None = None) -> Plan:
    return Plan(kind, ids, conv.generation, key, 0, reason, messages)


def plan_chat(conv: Conversation, renderer: Renderer, messages: Sequence[Message],
              tools: Sequence[dict[str, Any]] | None, template_kwargs: dict[str, Any], *,
              keep_history: bool = False) -> Plan:
    """Plan one chat call (see the module docstring).

    ``keep_history`` (``gateway.on_template_rewrite: keep_history``): when the messages extend
    the previous call's but the template would show the model other text than it wrote (a
    reformatted tool call, a dropped ``<think>`` block), keep what it wrote and append, as the
    ``chat`` loop does, counted as ``realign``; only changed history then forks.
    """
    key = context_key(tools, template_kwargs)
    encoder, append_only = renderer.encoder(key, tools, template_kwargs)
    if conv.current is None:
        effective = with_reasoning(messages, conv.replies)
        return _full(NEW, encoder.encode(effective, add_generation_prompt=True), conv, key, messages=effective)
    if key != conv.key:
        effective = with_reasoning(messages, conv.replies)
        reason = "a chat call after completion calls" if not conv.key else "the tools or chat_template_kwargs changed"
        return _full(FORK, encoder.encode(effective, add_generation_prompt=True), conv, key, reason, effective)
    previous = conv.messages
    if previous is not None and append_only and messages_extend(messages, previous):
        new = list(messages[len(previous):])
        effective = [*previous, *new]
        try:
            canonical = encoder.encode_assistant(previous[-1])
        except TemplateError:  # the reply's first token merges with the generation prompt's: compare in full
            canonical = None
        kind = "" if canonical is None else APPEND if canonical == conv.reply_ids else (
            REALIGN if renderer.decode(canonical) == renderer.decode(conv.reply_ids) else "")
        if kind:
            reuse = len(conv.current.ids)
            return Plan(kind, [*conv.current.ids, *encoder.encode_observation(new)], conv.generation, key, reuse, "",
                        effective)
        # the template renders the reply as other text: compare the whole rendering below
    if keep_history and previous is not None and messages_extend(messages, previous):
        new = list(messages[len(previous):])
        reuse = len(conv.current.ids)
        return Plan(REALIGN, [*conv.current.ids, *encoder.encode_observation(new)], conv.generation, key, reuse, "",
                    [*previous, *new])
    effective = with_reasoning(messages, conv.replies)
    rendered = encoder.encode(effective, add_generation_prompt=True)
    return _aligned(conv, renderer, rendered, key, effective,
                    "the rendered prompt does not extend the session's tokens (history edited, or the template "
                    "rewrote an earlier turn)")


def plan_text(conv: Conversation, renderer: Renderer, prompt_ids: list[int]) -> Plan:
    """``/v1/completions``: the prompt's tokens against the sample, as text."""
    if conv.current is None:
        return _full(NEW, prompt_ids, conv, "")
    if conv.key != "":
        return _full(FORK, prompt_ids, conv, "", "a completion call after chat calls")
    return _aligned(conv, renderer, prompt_ids, "", None, "the prompt does not extend the session's text")


def _aligned(conv: Conversation, renderer: Renderer, rendered: list[int], key: str, messages: list[Message] | None,
             reason: str) -> Plan:
    assert conv.current is not None
    record = conv.current.ids
    k = align(record, rendered, renderer.decode)
    if k is None or k >= len(rendered):  # no new tokens after the sample: it is a new prompt, not a turn
        return _full(FORK, rendered, conv, key, reason if k is None else "the prompt adds nothing after the last reply",
                     messages)
    kind = APPEND if rendered[: len(record)] == record else REALIGN
    return Plan(kind, [*record, *rendered[k:]], conv.generation, key, len(record), "", messages)


def align(record: Sequence[int], rendered: Sequence[int], decode: Callable[[Sequence[int]], str]) -> int | None:
    """The ``k`` for which ``rendered[:k]`` is ``record`` as text (token for token where they agree), or None.

    Compares token by token up to the first difference, then the rest of ``record`` as text
    against growing spans of ``rendered``.
    """
    n = 0
    limit = min(len(record), len(rendered))
    while n < limit and record[n] == rendered[n]:
        n += 1
    if n == len(record):
        return n
    tail = decode(record[n:])
    for k in range(n + 1, len(rendered) + 1):
        text = decode(rendered[n:k])
        if text == tail:
            return k
        if len(text) > len(tail) or not tail.startswith(text.rstrip("\ufffd")):
            return None
    return None


# ---------------------------------------------------------------------------------------
# Commit


@frozen
class Sampled:
    """What the engine produced for one call."""

    ids: list[int]
    logprobs: list[float]
    versions: list[int]
    ended: bool  # the last token ends the turn (a stop token was sampled)


def commit(conv: Conversation, plan: Plan, sampled: Sampled, *, reply: Message | None, reasoning: str | None,
           close_turn_id: int | None) -> str:
    """File the call's tokens into the conversation; returns the kind it was counted as.

    ``close_turn_id``: the end-of-turn token appended (``loss_mask`` 0) after a reply that did
    not end with one, as the template would render it (chat calls; ``None`` for completions).
    """
    kind, reason = plan.kind, plan.reason
    if kind in (APPEND, REALIGN) and (conv.generation != plan.base or conv.current is None):
        kind, reason = FORK, "another call of this session finished first (concurrent calls)"
    if kind in (NEW, FORK):
        conv.current = TokenSample()
        conv.samples.append(conv.current)
        conv.current.extend(plan.prompt_ids, 0)
        conv.current.prompt_length = len(plan.prompt_ids)
    else:
        assert conv.current is not None
        conv.current.extend(plan.prompt_ids[plan.reuse:], 0)
    sample = conv.current
    sample.extend(sampled.ids, 1, sampled.logprobs, sampled.versions)
    kept = list(sampled.ids)
    if close_turn_id is not None and not sampled.ended:
        sample.extend([close_turn_id], 0)
        kept.append(close_turn_id)
    sample.calls += 1
    conv.reply_ids = kept
    conv.key = plan.key
    conv.messages = [*plan.messages, reply] if plan.messages is not None and reply is not None else None
    if reply is not None and reasoning is not None:
        conv.replies[reply_key(reply)] = reasoning
    conv.generation += 1
    conv.counts[kind] += 1
    if kind == FORK:
        conv.fork_reasons[reason] += 1
    return kind
