"""Per-step training metrics from the batch's trajectories (docs/architecture.md section 7)."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from agentrl_core.types import Trajectory


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def batch_metrics(trajectories: Sequence[Trajectory], learner_version: int) -> dict[str, float]:
    """Reward, success, statuses, turns and tokens per task, and the version lag of action tokens.

    ``learner_version`` is the version of the weights being updated (steps done so far);
    a token sampled by version ``v`` has lag ``learner_version - v`` (0: on-policy).
    """
    out: dict[str, float] = {}
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_task[t.task].append(t)
    lags: list[float] = []
    lags_by_pool: dict[str, list[float]] = defaultdict(list)
    for task, trajs in sorted(by_task.items()):
        p = f"task/{task}/"
        out[p + "reward"] = statistics.fmean(t.reward for t in trajs)
        out[p + "training_reward"] = statistics.fmean(float(t.training_reward or 0.0) for t in trajs)
        out[p + "success"] = statistics.fmean(1.0 if t.reward >= 1.0 else 0.0 for t in trajs)
        out[p + "turns"] = statistics.fmean(t.num_turns for t in trajs)
        out[p + "tokens"] = statistics.fmean(len(t.input_ids) for t in trajs)
        out[p + "action_tokens"] = statistics.fmean(t.num_action_tokens for t in trajs)
        out[p + "trajectories"] = float(len(trajs))
        for status, n in Counter(t.status.value for t in trajs).items():
            out[p + f"status/{status}"] = float(n)
    for t in trajectories:
        for pool, version in action_token_versions(t):
            lag = float(learner_version - version)
            lags.append(lag)
            lags_by_pool[pool].append(lag)
    all_rewards = [t.reward for t in trajectories]
    out["reward"] = statistics.fmean(all_rewards) if all_rewards else 0.0
    out["success"] = statistics.fmean(1.0 if r >= 1.0 else 0.0 for r in all_rewards) if all_rewards else 0.0
    out["trajectories"] = float(len(trajectories))
    out["tokens"] = float(sum(len(t.input_ids) for t in trajectories))
    out["action_tokens"] = float(sum(t.num_action_tokens for t in trajectories))
    out["turns"] = statistics.fmean(t.num_turns for t in trajectories) if trajectories else 0.0
    if lags:
        out["version_lag/mean"] = statistics.fmean(lags)
        out["version_lag/p50"] = _quantile(lags, 0.5)
        out["version_lag/p90"] = _quantile(lags, 0.9)
        out["version_lag/max"] = max(lags)
    for pool, values in lags_by_pool.items():
        out[f"version_lag/{pool}/mean"] = statistics.fmean(values)
        out[f"version_lag/{pool}/max"] = max(values)
    gateway: Counter[str] = Counter()  # agent programs: calls appended, realigned, forked, replayed (summed)
    for t in trajectories:
        gateway.update({k: float(v) for k, v in t.metrics.items() if k.startswith("gateway/")
                        and isinstance(v, int | float) and not isinstance(v, bool)})
    out.update(gateway)
    return out


def action_token_versions(trajectory: Trajectory) -> list[tuple[str, int]]:
    """``(pool, version)`` of every action token in order: the version that sampled that very
    token (a turn continued across a weight sync holds several), the pool of its turn."""
    versions = [v for v, m in zip(trajectory.versions, trajectory.loss_mask, strict=True) if m]
    if len(versions) != sum(turn.num_tokens for turn in trajectory.turns):  # not built by the agent loop
        return [(turn.pool, turn.version) for turn in trajectory.turns for _ in range(turn.num_tokens)]
    out: list[tuple[str, int]] = []
    start = 0
    for turn in trajectory.turns:
        out.extend((turn.pool, v if v >= 0 else turn.version) for v in versions[start : start + turn.num_tokens])
        start += turn.num_tokens
    return out


def lag_histogram(trajectories: Sequence[Trajectory], learner_version: int) -> dict[int, int]:
    """Action tokens per version lag, each token by its own version (the throughput benchmark's distribution)."""
    hist: Counter[int] = Counter()
    for t in trajectories:
        for _, version in action_token_versions(t):
            hist[learner_version - version] += 1
    return dict(sorted(hist.items()))


ROLLOUT_WASTE_KEYS = ("aborted_turns", "discarded_tokens", "interrupted_turns", "mixed_version_tokens")


def rollout_waste_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """What weight syncs did to the step's trajectories (docs/architecture.md section 7), summed:

    * ``rollout/aborted_turns``: answers cut short by an abort;
    * ``rollout/discarded_tokens``: tokens generated and thrown away (the turns generated again
      with ``rollout.partial_rollouts: false``); 0 with partial rollouts on;
    * ``rollout/interrupted_turns``: turns paused by a weight sync and continued;
    * ``rollout/mixed_version_tokens``: action tokens of turns sampled by more than one version.
    """
    return {f"rollout/{key}": float(sum(t.metrics.get(key, 0) for t in trajectories)) for key in ROLLOUT_WASTE_KEYS}


def sample_rollouts(trajectories: Sequence[Trajectory], tokenizer: Any, count: int) -> list[dict[str, Any]]:
    """A few decoded rollouts for the logs: one per task first, best and worst reward."""
    if count <= 0 or not trajectories:
        return []
    picked: list[Trajectory] = []
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_task[t.task].append(t)
    for task in sorted(by_task):
        ranked = sorted(by_task[task], key=lambda t: (t.reward, t.uid))
        for t in (ranked[-1], ranked[0]):
            if t not in picked and len(picked) < count:
                picked.append(t)
    return [
        {
            "uid": t.uid, "task": t.task, "index": t.index, "reward": t.reward, "status": t.status.value,
            "text": tokenizer.decode(t.input_ids[t.prompt_length:], skip_special_tokens=False)[-4000:],
        }
        for t in picked
    ]


def pool_busy_metrics(pool: str, readings: dict[str, Any], previous: dict[str, tuple[float, float]]) -> dict[str, float]:
    """``engine/<pool>/*`` from one :class:`~agentrl_core.rollout.engine_client.BusyReading` per engine URL.

    Engines with cumulative ``forward_seconds``/``wall_seconds`` (agentrl's HF engine, the vLLM
    front) give the exact busy fraction since the previous reading, kept in ``previous`` (updated
    here); the pool's value is the mean over its engines. SGLang reports no forward time, only
    its requests at the moment of the reading (``/get_load``), so for it ``busy_fraction`` is the
    share of the pool's engines with at least one request running or waiting then. ``requests``
    (running + waiting) and ``waiting_requests`` sum what the engines report.
    """
    fractions: list[float] = []
    occupied: list[float] = []
    requests = waiting = 0
    counted = False
    for url, r in readings.items():
        if r.forward_seconds is not None:
            busy, wall = float(r.forward_seconds), float(r.wall_seconds or 0.0)
            prev_busy, prev_wall = previous.get(url, (0.0, 0.0))
            previous[url] = (busy, wall)
            if wall > prev_wall:
                fractions.append((busy - prev_busy) / (wall - prev_wall))
        elif r.requests is not None:
            occupied.append(1.0 if r.requests > 0 else 0.0)
        if r.requests is not None:
            counted = True
            requests += r.requests
            waiting += r.waiting or 0
    out: dict[str, float] = {}
    if fractions or occupied:
        values = fractions + occupied
        out[f"engine/{pool}/busy_fraction"] = sum(values) / len(values)
    if counted:
        out[f"engine/{pool}/requests"] = float(requests)
        out[f"engine/{pool}/waiting_requests"] = float(waiting)
    return out
