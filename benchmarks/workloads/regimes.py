"""The regime sweep's arithmetic: per point, the async/sync ratio against its analytic bound.

Every quantity is per trained token and measured in the same sweep point's runs (the
analysis ``throughput.analyse`` makes of each run):

* sync: ``S = G_s + L_s + O_s`` seconds of wall time, where ``G_s`` is the generation phase
  (the learner waiting for the batch, so it includes the wait for the batch's slowest
  trajectory: ``G_s = G_bulk + G_tail``, the tail being the time with at most a quarter of
  the batch still running), ``L_s`` training and ``O_s`` the rest (advantages, weight sync);
* async: the learner's busy seconds ``A_L`` (train + advantages + weight sync) and the
  engine's busy seconds ``A_G`` (prefill and decode passes and sampling, re-prefills after
  an interruption and turns generated again included).

Async cannot beat its busier resource: its wall time per token is at least
``max(A_L, A_G)``, so ``ratio = S / A_wall <= bound = S / max(A_L, A_G)``, and ``ratio /
bound`` is the busy share of async's bottleneck. The generation share of the point is
``G_s / S``: how much of a synchronous step is generation, its long tail included.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _sum(runs: Sequence[dict[str, Any]], get: Any) -> float:
    return float(sum(get(a) for a in runs))


def engine_busy_s(analysis: dict[str, Any]) -> float:
    """The engines' busy seconds: forward passes and sampling (the hf engine times both)."""
    return sum(e["seconds"].get("forward", 0.0) + e["seconds"].get("sampling", 0.0)
               for e in analysis["engines"].values())


def sync_terms(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Seconds per trained token of the sync runs: total, generation (bulk + tail), training, other."""
    tokens = _sum(runs, lambda a: a["trained_tokens"])
    if not tokens:
        raise ValueError("the sync runs trained no tokens")
    wall = _sum(runs, lambda a: a["wall_s"]) / tokens
    gen = _sum(runs, lambda a: a["learner_seconds"]["wait_rollout"]) / tokens
    train = _sum(runs, lambda a: a["learner_seconds"]["train"]) / tokens
    tail = _sum(runs, lambda a: a.get("sync_long_tail", {}).get("tail_s", 0.0)) / tokens
    return {"total": wall, "generation": gen, "generation_tail": min(tail, gen), "generation_bulk": gen - min(tail, gen),
            "training": train, "other": wall - gen - train}


def async_terms(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Seconds per trained token of the async runs: wall, learner busy, engine busy."""
    tokens = _sum(runs, lambda a: a["trained_tokens"])
    if not tokens:
        raise ValueError("the async runs trained no tokens")
    busy = _sum(runs, lambda a: sum(v for k, v in a["learner_seconds"].items() if k != "wait_rollout"))
    return {"total": _sum(runs, lambda a: a["wall_s"]) / tokens, "learner": busy / tokens,
            "engine": _sum(runs, engine_busy_s) / tokens}


def bound(sync: dict[str, float], async_: dict[str, float]) -> dict[str, Any]:
    """The ratio, the bound ``S / max(A_L, A_G)``, their quotient and async's bottleneck."""
    floor = max(async_["learner"], async_["engine"])
    ratio = sync["total"] / async_["total"]
    limit = sync["total"] / floor if floor else float("inf")
    return {"ratio": round(ratio, 3), "bound": round(limit, 3), "ratio_over_bound": round(ratio / limit, 3),
            "bottleneck": "learner" if async_["learner"] >= async_["engine"] else "engine"}


def summarize_point(by_mode: dict[str, list[dict[str, Any]]], sync_mode: str = "sync") -> dict[str, Any]:
    """One sweep point: per mode its throughput and counters; per async mode the ratio and bound."""
    out: dict[str, Any] = {"modes": {}}
    for mode, runs in by_mode.items():
        tokens = _sum(runs, lambda a: a["trained_tokens"])
        wall = _sum(runs, lambda a: a["wall_s"])
        lag: dict[str, float] = {}
        for a in runs:
            for k, v in a.get("version_lag_tokens", {}).items():
                lag[k] = lag.get(k, 0.0) + v
        lag_total = sum(lag.values())
        out["modes"][mode] = {
            "trained_tokens_per_s": round(tokens / wall, 2) if wall else 0.0,
            "per_round_tokens_per_s": [a["trained_tokens_per_s"] for a in runs],
            "engine_busy_fraction": round(_sum(runs, engine_busy_s) / wall, 4) if wall else 0.0,
            "learner_idle_fraction": round(_sum(runs, lambda a: a["learner_seconds"]["wait_rollout"]) / wall, 4)
            if wall else 0.0,
            "discarded_tokens": _sum(runs, lambda a: a["discarded_tokens"]),
            "aborted_turns": _sum(runs, lambda a: a["aborted_turns"]),
            "interrupted_turns": _sum(runs, lambda a: a["interrupted_turns"]),
            "mixed_version_tokens": _sum(runs, lambda a: a["mixed_version_tokens"]),
            "version_lag_histogram": {k: round(v / lag_total, 4) for k, v in sorted(lag.items(), key=lambda kv: int(kv[0]))}
            if lag_total else {},
        }
    if sync_mode not in by_mode:
        return out
    sync = sync_terms(by_mode[sync_mode])
    out["sync_seconds_per_1k_tokens"] = {k: round(1000 * v, 4) for k, v in sync.items()}
    out["generation_share"] = round(sync["generation"] / sync["total"], 4)
    out["generation_tail_share"] = round(sync["generation_tail"] / sync["total"], 4)
    for mode, runs in by_mode.items():
        if mode == sync_mode:
            continue
        terms = async_terms(runs)
        out["modes"][mode]["seconds_per_1k_tokens"] = {k: round(1000 * v, 4) for k, v in terms.items()}
        out["modes"][mode].update(bound(sync, terms))
    return out


def plot(points: dict[str, dict[str, Any]], path: Any, title: str) -> None:
    """Ratio (markers) and bound (dashed) of each async mode against the generation share."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    measured = [(p["generation_share"], name, p) for name, p in points.items() if "generation_share" in p]
    measured.sort(key=lambda x: x[0])
    modes = sorted({m for _, _, p in measured for m, v in p["modes"].items() if "ratio" in v})
    for i, mode in enumerate(modes):
        xs = [x for x, _, p in measured if "ratio" in p["modes"].get(mode, {})]
        ratio = [p["modes"][mode]["ratio"] for _, _, p in measured if "ratio" in p["modes"].get(mode, {})]
        limit = [p["modes"][mode]["bound"] for _, _, p in measured if "ratio" in p["modes"].get(mode, {})]
        color = f"C{i}"
        ax.plot(xs, ratio, "o-", color=color, label=f"{mode}: async/sync")
        ax.plot(xs, limit, "s--", color=color, alpha=0.6, label=f"{mode}: bound")
    for x, name, _ in measured:
        ax.annotate(name, (x, 0.0), textcoords="offset points", xytext=(0, 4), fontsize=7, ha="center", rotation=90)
    ax.axhline(2.0, color="grey", lw=0.8, ls=":", label="target 2.0")
    ax.axhline(1.0, color="black", lw=0.6)
    ax.set_xlabel("generation share of a synchronous step (its long tail included)")
    ax.set_ylabel("trained tokens/s, async over sync")
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(bottom=0.0)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
