"""Task-level advantage normalization (the AgentRL paper's second normalization level).

After the group estimator (GRPO etc.), for each task (``data_source``) in the batch:
collect the advantages of all loss-masked tokens of that task's trajectories, and
standardize the task's whole advantage rows with that mean and unbiased std::

    A_task = (A_task - mean) / (std + eps)        eps = 1e-6

so that tasks with long trajectories (many tokens) or high reward variance do not drown
the others. Edge cases (docs/architecture.md section 6): a task with fewer than 2 loss tokens is left
unchanged; masks are re-applied after; trajectories of zero-advantage groups (every
member got the same reward) take part and shift like every other token, as upstream,
unless ``keep_zero: true``, which leaves them at zero and out of the statistics.
"""

from __future__ import annotations

import attrs
import torch
from attrs import field, frozen

from agentrl_core.structure import in_range
from agentrl_core.types import AdvantageBatch


@frozen
class TaskNormConfig:
    """Config section ``advantage.task``."""

    eps: float = field(default=1e-6, validator=in_range(0.0, lo_open=True))
    keep_zero: bool = False
    min_tokens: int = field(default=2, validator=in_range(2))


class TaskNormalizer:
    def __init__(self, config: TaskNormConfig | None = None) -> None:
        self.config = config or TaskNormConfig()
        self.last_stats: dict[str, dict[str, float]] = {}

    def __call__(self, batch: AdvantageBatch) -> AdvantageBatch:
        advantages = batch.advantages
        mask = batch.loss_mask.to(advantages.dtype)
        if advantages.shape != mask.shape or advantages.shape[0] != len(batch.data_source):
            raise ValueError(
                f"advantages {tuple(advantages.shape)}, loss_mask {tuple(mask.shape)} and "
                f"{len(batch.data_source)} data_source entries do not match"
            )
        out = advantages.clone()
        stats: dict[str, dict[str, float]] = {}
        sources = batch.data_source
        for task in sorted(set(sources)):
            rows = torch.tensor([s == task for s in sources], dtype=torch.bool, device=advantages.device)
            if self.config.keep_zero:
                row_has_signal = ((advantages != 0) & (mask > 0)).any(dim=1)
                stat_rows = rows & row_has_signal
            else:
                stat_rows = rows
            values = advantages[stat_rows][mask[stat_rows] > 0]
            n = values.numel()
            if n < self.config.min_tokens:
                stats[task] = {"tokens": float(n), "mean": float("nan"), "std": float("nan"), "normalized": 0.0}
                continue
            mean = values.mean()
            std = values.std(unbiased=True)
            out[stat_rows] = (advantages[stat_rows] - mean) / (std + self.config.eps)
            stats[task] = {"tokens": float(n), "mean": float(mean), "std": float(std), "normalized": 1.0}
        self.last_stats = stats
        return attrs.evolve(batch, advantages=out * mask)

    def metrics(self) -> dict[str, float]:
        """Per-task statistics of the last call, for the training logs."""
        out = {}
        for task, s in self.last_stats.items():
            for key, value in s.items():
                out[f"advnorm/{task}/{key}"] = value
        return out
