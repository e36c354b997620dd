"""Turn message-level demonstrations into token sequences that look exactly like rollouts.

A demonstration (docs/architecture.md section 3; written by ``agentrl demos`` from an oracle) is
encoded the way the agent loop encodes a live episode: the first prompt (loss_mask 0),
then per assistant turn the template's rendering of the assistant message up to and
including end-of-turn (loss_mask 1), then the observation tokens of the environment's
reply (loss_mask 0). Supervised fine-tuning on these sequences therefore teaches exactly
the token format the model will produce and see during RL.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from attrs import frozen

from agentrl_core.errors import AgentrlError
from agentrl_core.rollout.chat_encoding import ChatEncoder

log = logging.getLogger(__name__)


@frozen
class SFTSequence:
    input_ids: list[int]
    loss_mask: list[int]
    task: str
    reward: float


def encode_demonstration(
    tokenizer: Any, record: dict[str, Any], *, max_total_len: int, encoder: ChatEncoder | None = None
) -> SFTSequence:
    """Encode one demonstration; sequences longer than ``max_total_len`` are cut there."""
    encoder = encoder or ChatEncoder(tokenizer, record.get("tools"))
    messages: Sequence[dict[str, Any]] = record["messages"]
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    if first is None or first == 0:
        raise AgentrlError(f"demonstration {record.get('task')}/{record.get('index')} has no prompt before its first assistant turn")
    ids = encoder.encode_prompt(messages[:first])
    mask = [0] * len(ids)
    i = first
    while i < len(messages):
        if messages[i].get("role") == "assistant":
            turn = encoder.encode_assistant(messages[i])
            ids += turn
            mask += [1] * len(turn)
            i += 1
            continue
        j = i
        while j < len(messages) and messages[j].get("role") != "assistant":
            j += 1
        if j < len(messages):  # observation tokens only matter if the model acts again after them
            observation = encoder.encode_observation(messages[i:j])
            ids += observation
            mask += [0] * len(observation)
        i = j
    return SFTSequence(ids[:max_total_len], mask[:max_total_len], str(record.get("task", "")), float(record.get("reward", 0.0)))


def encode_demonstrations(
    tokenizer: Any,
    records: Iterable[dict[str, Any]],
    *,
    max_total_len: int,
    min_reward: float | None = None,
) -> list[SFTSequence]:
    """Encode many demonstrations, sharing one encoder per tool list.

    ``min_reward`` keeps only episodes whose reward is at least that (e.g. 1.0 for
    rejection-sampled SFT); by default every demonstration is kept, mistakes included.
    """
    encoders: dict[str, ChatEncoder] = {}
    out = []
    for record in records:
        if min_reward is not None and float(record.get("reward", 0.0)) < min_reward:
            continue
        key = repr(record.get("tools"))
        if key not in encoders:
            encoders[key] = ChatEncoder(tokenizer, record.get("tools"))
        seq = encode_demonstration(tokenizer, record, max_total_len=max_total_len, encoder=encoders[key])
        if sum(seq.loss_mask):
            out.append(seq)
    return out
