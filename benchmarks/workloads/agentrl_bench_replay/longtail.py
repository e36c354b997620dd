"""The ``longtail`` agent loop: the chat loop with heavy-tailed action lengths (benchmarks only).

Reasoning models write answers whose lengths span orders of magnitude: a few turns are ten
times the median. An untrained tiny model cannot be asked for that, so this loop draws each
turn's length and makes the engine write exactly that many tokens: ``max_new_tokens`` = the
drawn length, ``ignore_eos`` and no stop tokens (sampling parameters every engine driver
takes). Everything else is the ``chat`` loop (`agentrl_core.rollout.agent_loop`).

Lengths are log-normal: ``round(median * exp(sigma * z))`` with ``z`` standard normal, clipped
to ``[1, max_tokens]`` (and to the context left). ``p99 / p50 = exp(2.326 * sigma)``: 10.2 at
the default ``sigma`` 1.0. The draw is seeded by (run seed, group, sample, turn), so every
training mode faces the same lengths for the same groups. Config ``rollout.agent_loop_options``.
"""

from __future__ import annotations

import math
import random
from typing import Any

from attrs import field, frozen

from agentrl_core.rollout.agent_loop import ChatAgentLoop
from agentrl_core.rollout.chat_encoding import ChatEncoder
from agentrl_core.structure import in_range
from agentrl_core.types import TurnContext

Z_P99 = 2.3263478740408408  # the standard normal's 99th percentile


@frozen
class LongTailConfig:
    """``rollout.agent_loop_options`` of the ``longtail`` loop."""

    median: int = field(default=256, validator=in_range(1))  # tokens
    sigma: float = field(default=1.0, validator=in_range(0.0))  # of log(length); p99/p50 = exp(2.326 sigma)
    max_tokens: int = field(default=4096, validator=in_range(1))

    @property
    def p99_over_p50(self) -> float:
        return math.exp(Z_P99 * self.sigma)


def draw_length(config: LongTailConfig, seed: int, group_id: str, sample: int, turn: int) -> int:
    """The length of one turn: the same for the same (seed, group, sample, turn) in every mode."""
    z = random.Random(f"longtail/{seed}/{group_id}/{sample}/{turn}").gauss(0.0, 1.0)
    return max(1, min(config.max_tokens, round(config.median * math.exp(config.sigma * z))))


class LongTailAgentLoop(ChatAgentLoop):
    """The chat loop; each turn is exactly as long as :func:`draw_length` says (or the context left)."""

    def __init__(self, config: LongTailConfig | None = None, **kwargs: Any) -> None:
        super().__init__(None, **kwargs)
        self.lengths = config or LongTailConfig()

    def sampling_params(self, context: TurnContext, encoder: ChatEncoder, max_new: int) -> dict[str, Any]:
        length = draw_length(self.lengths, self.seed, context.group_id, context.sample, context.turn)
        return {**super().sampling_params(context, encoder, max_new),
                "max_new_tokens": min(max_new, length), "ignore_eos": True, "stop_token_ids": []}
