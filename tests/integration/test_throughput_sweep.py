"""The throughput benchmark's regime sweep: the bound's arithmetic, the long-tail lengths, the quick run.

``benchmarks/throughput.py --quick`` runs the real command line (``agentrl train``: Ray, the
embedded control plane with the replay environment, the hf engine, the learner) for two sweep
points (the recorded workload and a small long-tail one) in the three modes, and writes its
JSON and plot. The smoke test checks the plumbing, not the targets.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "workloads"))

from agentrl_bench_replay.longtail import LongTailConfig, draw_length  # noqa: E402
from regimes import async_terms, bound, summarize_point, sync_terms  # noqa: E402


def run(tokens, wall, wait, train, sync=0.0, forward=0.0, tail=None, sampling=0.0, **counters):
    analysis = {"trained_tokens": tokens, "wall_s": wall, "trained_tokens_per_s": tokens / wall,
                "learner_seconds": {"wait_rollout": wait, "advantages": 0.0, "train": train, "weight_sync": sync},
                "engines": {"engine/current/0": {"seconds": {"forward": forward, "sampling": sampling}}},
                "discarded_tokens": 0.0, "aborted_turns": 0.0, "interrupted_turns": 0.0, "mixed_version_tokens": 0.0,
                "version_lag_tokens": {}}
    if tail is not None:
        analysis["sync_long_tail"] = {"tail_s": tail}
    return {**analysis, **counters}


def test_the_bound_by_hand():
    # sync: 1000 tokens in 100 s: 60 s generating (20 s of it waiting for the slowest trajectory), 38 s training
    sync = sync_terms([run(1000, 100.0, 60.0, 38.0, sync=2.0, tail=20.0)])
    assert sync == pytest.approx({"total": 0.1, "generation": 0.06, "generation_tail": 0.02,
                                  "generation_bulk": 0.04, "training": 0.038, "other": 0.002})
    # async: 1000 tokens in 50 s; learner busy 30 + 1 = 31 s, engine busy 32 s forward + 8 s sampling: engine-bound
    terms = async_terms([run(1000, 50.0, 19.0, 30.0, sync=1.0, forward=32.0, sampling=8.0)])
    assert terms == pytest.approx({"total": 0.05, "learner": 0.031, "engine": 0.04})
    # ratio 0.1 / 0.05 = 2.0; bound 0.1 / max(0.031, 0.04) = 2.5; 2.0 / 2.5 = 0.8
    assert bound(sync, terms) == {"ratio": 2.0, "bound": 2.5, "ratio_over_bound": 0.8, "bottleneck": "engine"}


def test_a_point_sums_its_rounds_and_reports_the_generation_share():
    point = summarize_point({
        "sync": [run(500, 50.0, 30.0, 19.0, tail=10.0), run(500, 50.0, 30.0, 19.0, tail=10.0)],
        "async_interrupt": [run(1000, 40.0, 0.0, 38.0, sync=1.0, forward=20.0, version_lag_tokens={"0": 30, "1": 10},
                                interrupted_turns=3.0)],
        "async_abort": [run(800, 40.0, 4.0, 30.0, sync=1.0, forward=24.0, discarded_tokens=120.0,
                            version_lag_tokens={"1": 40})],
    })
    assert point["generation_share"] == 0.6 and point["generation_tail_share"] == 0.2
    a = point["modes"]["async_interrupt"]
    # ratio (100/1000) / (40/1000) = 2.5; learner-bound: bound 0.1 / 0.039 = 2.564
    assert (a["ratio"], a["bound"], a["bottleneck"]) == (2.5, 2.564, "learner")
    assert a["version_lag_histogram"] == {"0": 0.75, "1": 0.25} and a["interrupted_turns"] == 3.0
    assert a["engine_busy_fraction"] == 0.5 and a["learner_idle_fraction"] == 0.0
    b = point["modes"]["async_abort"]
    assert b["ratio"] == 2.0 and b["discarded_tokens"] == 120.0 and b["learner_idle_fraction"] == 0.1
    assert point["modes"]["sync"]["trained_tokens_per_s"] == 10.0 and "ratio" not in point["modes"]["sync"]


def test_long_tail_lengths_have_the_asked_median_and_tail_and_repeat():
    config = LongTailConfig(median=256, sigma=1.0, max_tokens=4096)
    lengths = sorted(draw_length(config, 0, f"{g:08d}-replay-db-e0-{g}", s, t)
                     for g in range(500) for s in range(4) for t in range(5))
    p50, p99 = lengths[len(lengths) // 2], lengths[int(0.99 * len(lengths))]
    assert 230 <= p50 <= 285 and p99 / p50 >= 8 and lengths[-1] <= 4096
    assert config.p99_over_p50 == pytest.approx(math.exp(2.3263), rel=1e-4)
    assert draw_length(config, 0, "g", 1, 2) == draw_length(config, 0, "g", 1, 2)
    assert len({draw_length(config, 0, "g", 1, t) for t in range(20)}) > 10


@pytest.mark.processes
@pytest.mark.slow
@pytest.mark.timeout(1800)  # six training runs: ~15 min at load 20 on 2 cores, a few on a quiet machine
def test_quick_sweep_runs_every_point_and_mode(tmp_path, tiny_model_dir):
    out = tmp_path / "sweep_quick.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "throughput.py"), "--quick", "--work-dir", str(tmp_path / "work"),
         "--out", str(out), "--model", str(tiny_model_dir)],
        capture_output=True, text=True, timeout=1700,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert result["checks_targets"] is False  # --quick checks the plumbing, never claims the targets
    assert set(result["points"]) == {"recorded", "longtail:16"}
    for name, point in result["points"].items():
        assert set(point["modes"]) == {"async_interrupt", "async_abort", "sync"}
        assert 0.0 < point["generation_share"] < 1.0
        for mode in ("async_interrupt", "async_abort"):
            m = point["modes"][mode]
            assert m["trained_tokens_per_s"] > 0 and 0.0 < m["ratio_over_bound"] <= 1.0, (name, mode, m)
            assert 0.0 < m["engine_busy_fraction"] <= 1.0 and m["version_lag_histogram"]
        assert point["modes"]["async_interrupt"]["discarded_tokens"] == 0  # interruption keeps every token
        assert point["modes"]["sync"]["version_lag_histogram"] == {"0": 1.0}
    lengths = result["points"]["longtail:16"]["action_lengths_drawn"]
    assert 10 <= lengths["p50"] <= 24 and lengths["max"] <= 16 * 16
    config = result["points"]["longtail:16"]["config"]["rollout"]
    assert config["agent_loop"] == "longtail" and config["agent_loop_options"]["median"] == 16
