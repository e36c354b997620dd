"""Dual-clip PPO with a k3 KL penalty, aggregated exactly over the step batch.

The formulas are docs/architecture.md section 6 (as slime / verl):

* ratio ``r = exp(logp - old_logp)`` where ``old_logp`` are the rollout log-probs;
* ``L = max(-A*r, -A*clip(r, 1-clip_low, 1+clip_high))``, and for ``A < 0`` only
  ``L = min(L, -c*A)`` (the dual clip, ``c > 1``);
* ``d = ref_logp - logp``, ``k3 = exp(d) - d - 1`` clamped to ``[-kl_clamp, kl_clamp]``;
* ``loss = pg + kl_coef * k3 - entropy_coef * entropy``.

With ``loss.off_policy: decoupled`` the policy term is AReaL's decoupled PPO (Fu et al.,
2025): the ratio and its clip are taken against the *proximal* policy ``prox_logp`` (the
learner's weights before this step's update) instead of the behaviour policy, and each
token's loss is multiplied by the behaviour importance weight ``w = exp(prox_logp -
old_logp)``, a constant (no gradient), set to 0 where it exceeds ``behave_weight_cap``.
The learner takes one optimizer step per batch, so the weights before the update are the
ones of this very forward: ``prox_logp = logp.detach()`` is the exact recomputation (no
extra pass, no approximation), ``r = 1`` in value and the clip never binds in this step;
the gradient is ``-A * w * grad(logp)``.

Aggregation is exact over the whole step batch however it is split into micro-batches and
ranks: each call gets the batch-wide denominators (``num_tokens`` for ``token-mean``,
``num_seqs`` for ``seq-mean``) and returns its *contribution*, so summing the losses (and
every metric) of all micro-batches on all ranks gives the batch value. Without the
denominators the call's own batch is the whole batch.
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl_core.config import LossConfig

__all__ = ["ppo_dual_clip", "ppo_dual_clip_loss", "k3_kl", "dual_clip_pg", "decoupled_pg", "aggregate",
           "batch_denominators"]


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, clamp: float = 10.0) -> torch.Tensor:
    """Per-token k3 estimate of KL(actor || reference): ``exp(d) - d - 1``, ``d = ref - logp``."""
    d = ref_logprobs.float() - logprobs.float()
    return (d.exp() - d - 1).clamp(min=-clamp, max=clamp)


def dual_clip_pg(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip_c: float = 3.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token dual-clip PPO loss and per-token indicators (ratio, clipped, dual-clipped)."""
    if not dual_clip_c > 1.0:
        raise ValueError(f"dual_clip_c must be > 1, got {dual_clip_c}")
    ratio = torch.exp(logprobs.float() - old_logprobs.float())
    adv = advantages.float()
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(unclipped, clipped)
    dual_bound = -dual_clip_c * adv
    negative = adv < 0
    loss = torch.where(negative, torch.minimum(pg, dual_bound), pg)
    info = {
        "ratio": ratio.detach(),
        "clipped": (clipped > unclipped).float(),
        "dual_clipped": (negative & (dual_bound < pg)).float(),
    }
    return loss, info


def decoupled_pg(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip_c: float = 3.0,
    behave_weight_cap: float | None = 5.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token decoupled PPO loss: dual-clip PPO against ``proximal_logprobs``, times the
    behaviour weight ``exp(proximal - old)`` (no gradient; 0 above ``behave_weight_cap``)."""
    prox = proximal_logprobs.detach().float()
    pg, info = dual_clip_pg(logprobs, prox, advantages, clip_low, clip_high, dual_clip_c)
    weight = torch.exp(prox - old_logprobs.float())
    kept = weight <= behave_weight_cap if behave_weight_cap is not None else torch.ones_like(weight, dtype=torch.bool)
    weight = torch.where(kept, weight, torch.zeros_like(weight))
    info["behave_weight"] = weight
    info["behave_capped"] = (~kept).float()
    return pg * weight, info


def aggregate(
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> torch.Tensor:
    """Reduce ``[B, L]`` per-token values to this call's share of the batch mean.

    ``token-mean``: ``sum(values * mask) / num_tokens``; ``seq-mean``: the token-mean of
    each row, summed, divided by ``num_seqs``. The defaults are this call's own counts.
    """
    mask = loss_mask.to(values.dtype)
    masked = torch.where(loss_mask.bool(), values, torch.zeros_like(values))  # no nan * 0 from padding
    if mode == "token-mean":
        denominator = mask.sum().clamp(min=1) if num_tokens is None else num_tokens
        return masked.sum() / denominator
    if mode == "seq-mean":
        per_seq = masked.sum(-1) / mask.sum(-1).clamp(min=1)
        denominator = max(values.shape[0], 1) if num_seqs is None else num_seqs
        return per_seq.sum() / denominator
    raise ValueError(f"unknown loss aggregation {mode!r}; use 'token-mean' or 'seq-mean'")


def batch_denominators(loss_masks: list[Any]) -> tuple[float, float]:
    """``(num_tokens, num_seqs)`` of a step batch given every trajectory's loss mask."""
    num_tokens = float(sum(int(sum(m)) for m in loss_masks))
    return max(num_tokens, 1.0), float(max(len(loss_masks), 1))


def ppo_dual_clip(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: LossConfig | None = None,
    *,
    entropy: torch.Tensor | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    proximal_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The ``ppo_dual_clip`` policy loss on ``[B, L]`` tensors.

    ``ref_logprobs`` may be ``None`` when there is no reference model (then the KL term
    is zero); ``entropy`` (per token) is needed only when ``entropy_coef != 0`` and is
    reported when given. With ``config.off_policy == "decoupled"`` the policy term is
    :func:`decoupled_pg` against ``proximal_logprobs`` (default: ``logprobs.detach()``, the
    weights before this step's single update). Returns ``(loss, metrics)``; metric values
    are detached scalar tensors that, like the loss, are contributions to the batch mean.
    """
    cfg = config or LossConfig()
    agg = dict(mode=cfg.aggregation, num_tokens=num_tokens, num_seqs=num_seqs)
    decoupled = getattr(cfg, "off_policy", "ppo") == "decoupled"
    if decoupled:
        prox = logprobs.detach() if proximal_logprobs is None else proximal_logprobs
        pg_tokens, info = decoupled_pg(logprobs, prox, old_logprobs, advantages, cfg.clip_low, cfg.clip_high,
                                       cfg.dual_clip_c, cfg.behave_weight_cap)
    else:
        pg_tokens, info = dual_clip_pg(logprobs, old_logprobs, advantages, cfg.clip_low, cfg.clip_high,
                                       cfg.dual_clip_c)
    pg_loss = aggregate(pg_tokens, loss_mask, **agg)
    loss = pg_loss
    metrics = {
        "pg_loss": pg_loss.detach(),
        "clipfrac": aggregate(info["clipped"], loss_mask, **agg),
        "dual_clipfrac": aggregate(info["dual_clipped"], loss_mask, **agg),
        "ratio": aggregate(info["ratio"], loss_mask, **agg),  # decoupled: against the proximal policy
        "rollout_kl": aggregate((old_logprobs.float() - logprobs.float()).detach(), loss_mask, **agg),
    }
    if decoupled:
        metrics["behave_weight"] = aggregate(info["behave_weight"], loss_mask, **agg)
        metrics["behave_capped_frac"] = aggregate(info["behave_capped"], loss_mask, **agg)
    if ref_logprobs is not None:
        kl = aggregate(k3_kl(logprobs, ref_logprobs, cfg.kl_clamp), loss_mask, **agg)
        metrics["kl"] = kl.detach()
        if cfg.kl_coef:
            loss = loss + cfg.kl_coef * kl
    if entropy is not None:
        ent = aggregate(entropy.float(), loss_mask, **agg)
        metrics["entropy"] = ent.detach()
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * ent
    elif cfg.entropy_coef:
        raise ValueError("loss.entropy_coef is set but no per-token entropy was passed to the loss")
    metrics["loss"] = loss.detach()
    return loss, metrics


def ppo_dual_clip_loss(config: Any = None, **_: Any):
    """Registry factory for ``ppo_dual_clip``: returns :func:`ppo_dual_clip`."""
    return ppo_dual_clip


def sft_nll_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, ref_logprobs: Any, advantages: torch.Tensor,
                 loss_mask: torch.Tensor, config: Any, *, num_tokens: float | None = None,
                 num_seqs: float | None = None, **_: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """Negative log-likelihood of the loss-masked tokens, this call's share of the batch mean."""
    nll = -logprobs.float()
    loss = aggregate(nll, loss_mask, "token-mean", num_tokens=num_tokens)
    return loss, {"loss": float(loss.detach()), "nll": float(loss.detach())}
