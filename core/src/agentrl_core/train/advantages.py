"""Group advantage estimators and the batch-level normalizer pass (docs/architecture.md section 6).

Every estimator is a plain function ``(rewards [B], group_ids, loss_mask [B, L]) ->
advantages [B, L]``: a scalar per trajectory computed from its group's rewards, broadcast
to the trajectory's loss-masked tokens (zero elsewhere). The formulas are upstream's
(verl / slime):

* ``grpo``: ``(r - mean) / (std + 1e-6)`` with the unbiased std of the group; a group of
  one uses mean 0 and std 1.
* ``rloo``: ``r * n/(n-1) - mean * n/(n-1)`` (the leave-one-out baseline); a group of one
  keeps ``r``.
* ``reinforce_pp_baseline``: ``r - group mean`` broadcast to the tokens, then whitened
  over every loss-masked token of the batch (mean 0, unbiased variance 1).
* ``grpo_negated``: minus ``grpo``. A negative control, not a training method: it pushes
  the policy away from rewarded behaviour, so a run with it must not improve
  (``benchmarks/learning.py`` uses it to show that its improvement is not an artefact).

The ``*_estimator`` names are the registry factories: ``factory(config) -> estimator``.
:func:`apply_normalizers` runs the configured ``agentrl_advantage_normalizers`` after the
estimator, in order, re-applying the loss mask after each.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from agentrl_core.types import AdvantageBatch, AdvantageEstimatorSpec, AdvantageNormalizerSpec

GRPO_EPS = 1e-6
WHITEN_EPS = 1e-8

__all__ = [
    "grpo_advantages",
    "grpo_negated_advantages",
    "rloo_advantages",
    "reinforce_pp_baseline_advantages",
    "grpo_estimator",
    "grpo_negated_estimator",
    "rloo_estimator",
    "reinforce_pp_baseline_estimator",
    "masked_whiten",
    "apply_normalizers",
    "compute_advantages",
    "pad_rows",
    "build_advantage_fns",
]


def _groups(group_ids: Sequence[str]) -> dict[str, list[int]]:
    members: dict[str, list[int]] = {}
    for i, gid in enumerate(group_ids):
        members.setdefault(gid, []).append(i)
    return members


def _check(rewards: torch.Tensor, group_ids: Sequence[str], loss_mask: torch.Tensor) -> torch.Tensor:
    rewards = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1)
    if rewards.numel() != len(group_ids) or loss_mask.shape[0] != len(group_ids):
        raise ValueError(
            f"advantages: {rewards.numel()} rewards, {len(group_ids)} group ids and {loss_mask.shape[0]} "
            "loss-mask rows must be equal"
        )
    return rewards


def _broadcast(scores: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    mask = loss_mask.to(torch.float32)
    return scores.to(torch.float32).unsqueeze(-1) * mask


def grpo_advantages(rewards: Any, group_ids: Sequence[str], loss_mask: torch.Tensor) -> torch.Tensor:
    """GRPO: ``(r - group mean) / (unbiased group std + 1e-6)`` on the loss-masked tokens."""
    r = _check(rewards, group_ids, loss_mask)
    scores = torch.empty_like(r)
    for idx in _groups(group_ids).values():
        g = r[idx]
        if len(idx) == 1:
            mean, std = 0.0, 1.0
        else:
            mean, std = g.mean(), g.std(unbiased=True)
        scores[idx] = (g - mean) / (std + GRPO_EPS)
    return _broadcast(scores, loss_mask)


def grpo_negated_advantages(rewards: Any, group_ids: Sequence[str], loss_mask: torch.Tensor) -> torch.Tensor:
    """Minus :func:`grpo_advantages`: the sign-flipped control of the learning benchmark."""
    return -grpo_advantages(rewards, group_ids, loss_mask)


def rloo_advantages(rewards: Any, group_ids: Sequence[str], loss_mask: torch.Tensor) -> torch.Tensor:
    """RLOO: ``r * n/(n-1) - mean * n/(n-1)``, i.e. ``r`` minus the mean of the others."""
    r = _check(rewards, group_ids, loss_mask)
    scores = r.clone()
    for idx in _groups(group_ids).values():
        n = len(idx)
        if n > 1:
            g = r[idx]
            scores[idx] = g * n / (n - 1) - g.mean() * n / (n - 1)
    return _broadcast(scores, loss_mask)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = WHITEN_EPS) -> torch.Tensor:
    """``(v - mean) / sqrt(var + eps)`` over the masked entries, unbiased variance.

    With fewer than two masked entries the variance is undefined and ``values`` are
    returned unchanged.
    """
    m = mask.to(values.dtype)
    count = m.sum()
    if count < 2:
        return values
    mean = (values * m).sum() / count
    var = (((values - mean) ** 2) * m).sum() / (count - 1)
    return (values - mean) * torch.rsqrt(var + eps)


def reinforce_pp_baseline_advantages(rewards: Any, group_ids: Sequence[str], loss_mask: torch.Tensor) -> torch.Tensor:
    """REINFORCE++ with baseline: ``r - group mean`` on the tokens, whitened over the batch."""
    r = _check(rewards, group_ids, loss_mask)
    scores = r.clone()
    for idx in _groups(group_ids).values():
        if len(idx) > 1:
            scores[idx] = r[idx] - r[idx].mean()
    token_scores = scores.unsqueeze(-1) * loss_mask.to(torch.float64)
    whitened = masked_whiten(token_scores, loss_mask)
    return (whitened * loss_mask.to(torch.float64)).to(torch.float32)


def grpo_estimator(config: Any = None, **_: Any):
    """Registry factory for ``grpo``."""
    return grpo_advantages


def grpo_negated_estimator(config: Any = None, **_: Any):
    """Registry factory for ``grpo_negated`` (a control that must not learn; see the module docstring)."""
    return grpo_negated_advantages


def rloo_estimator(config: Any = None, **_: Any):
    """Registry factory for ``rloo``."""
    return rloo_advantages


def reinforce_pp_baseline_estimator(config: Any = None, **_: Any):
    """Registry factory for ``reinforce_pp_baseline``."""
    return reinforce_pp_baseline_advantages


def apply_normalizers(batch: AdvantageBatch, normalizers: Sequence[Any]) -> AdvantageBatch:
    """Run normalizers in order over the whole batch, re-applying the loss mask after each."""
    mask = batch.loss_mask.to(batch.advantages.dtype)
    for normalize in normalizers:
        out = normalize(batch)
        if not isinstance(out, AdvantageBatch):
            raise TypeError(f"advantage normalizer {normalize!r} must return an AdvantageBatch, got {type(out).__name__}")
        batch = AdvantageBatch(
            advantages=out.advantages * mask,
            loss_mask=batch.loss_mask,
            data_source=batch.data_source,
            group_id=batch.group_id,
        )
    return batch


def pad_rows(rows: Sequence[Sequence[float]], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Right-pad variable-length rows with zeros into a ``[B, max_len]`` tensor."""
    width = max((len(r) for r in rows), default=0)
    out = torch.zeros(len(rows), width, dtype=dtype)
    for i, row in enumerate(rows):
        if len(row):
            out[i, : len(row)] = torch.as_tensor(row, dtype=dtype)
    return out


def compute_advantages(trajectories: Sequence[Any], estimator: Any, normalizers: Sequence[Any] = (),
                       reward_scales: Mapping[str, float] | None = None) -> AdvantageBatch:
    """Estimator then normalizers for a batch of :class:`~agentrl_core.types.Trajectory`.

    Returns an :class:`AdvantageBatch` whose ``[B, L]`` tensors are right-padded to the
    longest trajectory; row ``i`` belongs to ``trajectories[i]``. A trajectory without a
    training reward (an infrastructure failure) must never reach this point.
    ``reward_scales``: task name -> factor on its training rewards before the estimator
    (``tasks[].reward_scale``); tasks not named keep theirs.
    """
    scales = reward_scales or {}
    rewards = []
    for t in trajectories:
        if t.training_reward is None:
            raise ValueError(
                f"trajectory {t.uid} of group {t.group_id} has no training reward (status {t.status}); "
                "infrastructure failures must be retried or their group dropped by the buffer"
            )
        rewards.append(float(t.training_reward) * scales.get(t.task, 1.0))
    loss_mask = pad_rows([t.loss_mask for t in trajectories], dtype=torch.float32)
    group_ids = [t.group_id for t in trajectories]
    advantages = estimator(torch.tensor(rewards, dtype=torch.float64), group_ids, loss_mask)
    batch = AdvantageBatch(
        advantages=advantages.to(torch.float32) * loss_mask,
        loss_mask=loss_mask,
        data_source=[t.task for t in trajectories],
        group_id=group_ids,
    )
    return apply_normalizers(batch, normalizers)


def build_advantage_fns(advantage_config: Any, registry: Any = None) -> tuple[Any, list[Any]]:
    """The configured estimator and normalizers (``advantage`` config section), via the registry.

    Each component gets its validated sub-section (``advantage.<name>``) as its config.
    """
    if registry is None:
        from agentrl_core.registry import Registry

        registry = Registry()
    options = getattr(advantage_config, "options", {}) or {}
    name = advantage_config.estimator
    estimator = registry.build(AdvantageEstimatorSpec, name, options.get(name))
    normalizers = [registry.build(AdvantageNormalizerSpec, n, options.get(n)) for n in advantage_config.normalizers]
    return estimator, normalizers
