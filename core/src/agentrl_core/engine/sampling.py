"""Sampling for the HF engine: per-request parameters, one token per row, its log-prob.

The log-prob returned for a sampled token is ``log_softmax(logits / temperature)`` at that
token, in fp32 (the distribution the learner computes); top-p/top-k/min-p truncation only
restricts what may be drawn and does not renormalize the returned value. ``temperature ==
0`` is greedy and returns the log-prob under the unscaled logits. Tokens are drawn by
inverse-CDF sampling with one uniform number per row, from the request's own generator when
it has a seed (so its tokens do not depend on the rest of the batch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from attrs import frozen

from agentrl_core.http.server import HTTPError

__all__ = ["SamplingParams", "parse_sampling_params", "sample", "truncate"]

_SAMPLING_KEYS = {
    "temperature", "top_p", "top_k", "min_p", "max_new_tokens", "stop", "stop_token_ids", "ignore_eos",
    "skip_special_tokens", "seed", "sampling_seed", "no_stop_trim", "n", "frequency_penalty", "presence_penalty",
    "repetition_penalty", "min_new_tokens", "spaces_between_special_tokens",
}
_NEUTRAL = {"n": 1, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0}


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


def parse_sampling_params(raw: Any) -> tuple[SamplingParams, bool]:
    """SGLang ``sampling_params`` -> (SamplingParams, no_stop_trim); a clear 400 for anything wrong."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise HTTPError(400, "sampling_params must be a JSON object")
    unknown = sorted(set(raw) - _SAMPLING_KEYS)
    if unknown:
        raise HTTPError(400, f"unknown sampling_params {unknown}; the hf engine takes {sorted(_SAMPLING_KEYS)}")
    for key, neutral in _NEUTRAL.items():
        if key in raw and raw[key] is not None and raw[key] != neutral:
            raise HTTPError(400, f"sampling_params.{key}={raw[key]!r} is not supported by the hf engine "
                                 f"(only {neutral!r})")

    def number(key: str, default: float, kind: type = float) -> Any:
        value = raw.get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
            raise HTTPError(400, f"sampling_params.{key} must be {'an integer' if kind is int else 'a number'}, "
                                 f"got {value!r}")
        return kind(value)

    temperature = number("temperature", 1.0)
    top_p = number("top_p", 1.0)
    top_k = number("top_k", -1, int)
    min_p = number("min_p", 0.0)
    max_new = number("max_new_tokens", 128, int)
    if temperature < 0:
        raise HTTPError(400, f"sampling_params.temperature must be >= 0, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise HTTPError(400, f"sampling_params.top_p must be in (0, 1], got {top_p}")
    if not 0.0 <= min_p <= 1.0:
        raise HTTPError(400, f"sampling_params.min_p must be in [0, 1], got {min_p}")
    if max_new < 1:
        raise HTTPError(400, f"sampling_params.max_new_tokens must be >= 1, got {max_new}")
    stop = raw.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise HTTPError(400, "sampling_params.stop must be a string or a list of non-empty strings")
    stop_ids = raw.get("stop_token_ids") or ()
    if not isinstance(stop_ids, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                          for t in stop_ids):
        raise HTTPError(400, "sampling_params.stop_token_ids must be a list of token ids")
    seed = raw.get("seed", raw.get("sampling_seed"))
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise HTTPError(400, f"sampling_params.seed must be an integer, got {seed!r}")
    if seed is not None and not -(2**63) <= seed < 2**64:  # torch's generator takes 64 bits
        raise HTTPError(400, f"sampling_params.seed must be a 64-bit integer, got {seed}")
    params = SamplingParams(
        temperature=temperature, top_p=top_p, top_k=top_k if top_k > 0 else -1, min_p=min_p,
        max_new_tokens=max_new, stop_token_ids=tuple(stop_ids), stop=tuple(stop),
        ignore_eos=bool(raw.get("ignore_eos", False)), seed=seed,
        skip_special_tokens=bool(raw.get("skip_special_tokens", True)),
    )
    return params, bool(raw.get("no_stop_trim", False))
