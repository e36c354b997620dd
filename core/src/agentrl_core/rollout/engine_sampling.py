"""Sampling for the HF engine: per-request parameters, one token per row, its log-prob.

The log-prob returned for a sampled token is ``log_softmax(logits / temperature)`` at that
token, in fp32 (the distribution the learner computes); top-p/top-k/min-p truncation only
restricts what may be drawn and does not renormalize the returned value. ``temperature ==
0`` is greedy and returns the log-prob under the unscaled logits. Tokens are drawn by
inverse-CDF sampling with one uniform number per row, from the request's own generator when
it has a seed (so its tokens do not depend on the rest of the batch).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from attrs import frozen

__all__ = ["SamplingParams", "sample", "truncate"]


@frozen
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    skip_special_tokens: bool = True

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-6

    @property
    def truncates(self) -> bool:
        return not self.greedy and (self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0)


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    rng: torch.Generator,
) -> tuple[list[int], list[float]]:
    """Sample one token per row; returns the tokens and their log-probs under logits/temperature."""
    batch = logits.shape[0]
    device = logits.device
    temps = torch.tensor([1.0 if p.greedy else p.temperature for p in params], dtype=logits.dtype, device=device)
    logp = torch.log_softmax(logits / temps[:, None], dim=-1)
    probs = logp.exp()
    for i, p in enumerate(params):
        if p.truncates:
            probs[i] = truncate(probs[i], top_k=p.top_k, top_p=p.top_p, min_p=p.min_p)
    # inverse-CDF sampling, one uniform number per row (seeded rows draw from their own generator);
    # a token of probability 0 owns an empty interval of the CDF and is never drawn
    uniform = torch.empty(batch, 1, dtype=probs.dtype)
    shared = [i for i, g in enumerate(generators) if g is None]
    if shared:
        uniform[shared] = torch.rand(len(shared), 1, dtype=probs.dtype, generator=rng)
    for i, g in enumerate(generators):
        if g is not None:
            uniform[i] = torch.rand(1, dtype=probs.dtype, generator=g)
    cdf = torch.cumsum(probs, dim=-1)
    uniform = uniform.to(device)
    choice = torch.searchsorted(cdf, uniform * cdf[:, -1:], right=True)[:, 0].clamp_(max=probs.shape[1] - 1)
    greedy = [i for i, p in enumerate(params) if p.greedy]
    if greedy:
        choice[greedy] = torch.argmax(logits[greedy], dim=-1)
    chosen = logp.gather(1, choice[:, None])[:, 0]
    return choice.tolist(), chosen.tolist() if batch else []


def truncate(probs: torch.Tensor, *, top_k: int = -1, top_p: float = 1.0, min_p: float = 0.0) -> torch.Tensor:
    """Zero the probabilities outside top-k / the top-p nucleus / below min_p * max (one row)."""
    probs = probs.clone()
    if 0 < top_k < probs.shape[-1]:
        kth = torch.topk(probs, top_k).values[-1]
        probs[probs < kth] = 0.0
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass strictly above each token
        drop = before > top_p
        drop[0] = False
        probs[order[drop]] = 0.0
    if min_p > 0.0:
        probs[probs < min_p * probs.max()] = 0.0
    return probs
