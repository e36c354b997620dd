"""Evaluation statistics (docs/architecture.md section 7).

Per task: success rate (reward == 1; WebShop also mean reward) over R repeats as mean ±
std, pass@k with the unbiased estimator of Chen et al. (2021), the termination-status
distribution, mean turns, and the mean of every numeric episode metric the environment or
the agent loop reported (``metrics_mean``: e.g. ALFWorld's ``nothing_happens``, DB's
``sql_errors``, the loop's ``parse_errors``). Infrastructure failures (``task error``, ``cancelled``,
``unknown``) are left out of every denominator and counted apart.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from attrs import field, frozen

from agentrl_core.types import FailureKind, failure_kind


@frozen
class EpisodeResult:
    task: str
    index: Any
    repeat: int
    reward: float
    status: str
    turns: int
    model: str = ""
    # the episode's numeric metrics (environment's and agent loop's); see numeric_metrics()
    metrics: dict[str, float] = field(factory=dict)

    @property
    def infra(self) -> bool:
        return failure_kind(self.status) is FailureKind.INFRA

    @property
    def success(self) -> bool:
        return self.reward >= 1.0


def numeric_metrics(metrics: dict[str, Any] | None) -> dict[str, float]:
    """The numeric entries of an episode's metrics (booleans as 0/1), the ones a mean is taken of."""
    out = {}
    for key, value in (metrics or {}).items():
        if isinstance(value, bool | int | float) and math.isfinite(value):
            out[str(key)] = float(value)
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with ``n`` samples of which ``c`` are correct."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def ks_for(n: int) -> list[int]:
    """k = 1, 2, 4, ... up to n (and n itself)."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    if ks and ks[-1] != n:
        ks.append(n)
    return ks


@frozen
class TaskSummary:
    task: str
    episodes: int
    infra_failures: int
    success_mean: float
    success_std: float
    reward_mean: float
    pass_at: dict[int, float]
    statuses: dict[str, int]
    turns_mean: float
    per_repeat_success: list[float]
    # metric -> mean over the scored episodes that reported it
    metrics_mean: dict[str, float] = field(factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "episodes": self.episodes,
            "infra_failures": self.infra_failures,
            "success_mean": self.success_mean,
            "success_std": self.success_std,
            "reward_mean": self.reward_mean,
            "pass_at_k": {str(k): v for k, v in self.pass_at.items()},
            "statuses": self.statuses,
            "turns_mean": self.turns_mean,
            "per_repeat_success": self.per_repeat_success,
            "metrics_mean": self.metrics_mean,
        }


def summarize(results: Iterable[EpisodeResult]) -> dict[str, TaskSummary]:
    """One :class:`TaskSummary` per task."""
    by_task: dict[str, list[EpisodeResult]] = defaultdict(list)
    for r in results:
        by_task[r.task].append(r)
    return {task: _summarize_task(task, rs) for task, rs in sorted(by_task.items())}


def _summarize_task(task: str, results: Sequence[EpisodeResult]) -> TaskSummary:
    scored = [r for r in results if not r.infra]
    infra = len(results) - len(scored)
    by_repeat: dict[int, list[EpisodeResult]] = defaultdict(list)
    for r in scored:
        by_repeat[r.repeat].append(r)
    per_repeat = [sum(r.success for r in rs) / len(rs) for _, rs in sorted(by_repeat.items())]
    success_mean = statistics.fmean(per_repeat) if per_repeat else float("nan")
    success_std = statistics.stdev(per_repeat) if len(per_repeat) > 1 else 0.0
    by_index: dict[Any, list[EpisodeResult]] = defaultdict(list)
    for r in scored:
        by_index[r.index].append(r)
    pass_at: dict[int, float] = {}
    if by_index:
        n_min = min(len(v) for v in by_index.values())
        for k in ks_for(n_min):
            pass_at[k] = statistics.fmean(pass_at_k(len(v), sum(r.success for r in v), k) for v in by_index.values())
    statuses = Counter(r.status for r in results)
    values: dict[str, list[float]] = defaultdict(list)
    for r in scored:
        for key, value in r.metrics.items():
            values[key].append(value)
    return TaskSummary(
        task=task,
        episodes=len(scored),
        infra_failures=infra,
        success_mean=success_mean,
        success_std=success_std,
        reward_mean=statistics.fmean(r.reward for r in scored) if scored else float("nan"),
        pass_at=pass_at,
        statuses=dict(sorted(statuses.items())),
        turns_mean=statistics.fmean(r.turns for r in scored) if scored else float("nan"),
        per_repeat_success=per_repeat,
        metrics_mean={key: statistics.fmean(v) for key, v in sorted(values.items())},
    )


def format_table(summaries: dict[str, TaskSummary]) -> str:
    """A plain-text per-task table (the end of ``agentrl eval`` and ``agentrl train``)."""
    ks = sorted({k for s in summaries.values() for k in s.pass_at})
    header = ["task", "n", "success", "reward", *[f"pass@{k}" for k in ks], "turns", "infra", "statuses"]
    rows = [header]
    for s in summaries.values():
        status_text = ", ".join(f"{k}: {v}" for k, v in s.statuses.items())
        # a spread needs two repeats or more: one repeat has none to show
        spread = f" ± {s.success_std:.3f}" if len(s.per_repeat_success) > 1 else ""
        rows.append([
            s.task,
            str(s.episodes),
            f"{s.success_mean:.3f}{spread}",
            f"{s.reward_mean:.3f}",
            *[f"{s.pass_at[k]:.3f}" if k in s.pass_at else "-" for k in ks],
            f"{s.turns_mean:.1f}",
            str(s.infra_failures),
            status_text or "-",
        ])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
