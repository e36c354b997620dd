"""The ablation benchmark's pass@k study: solved sets and their aggregation, by hand.

``benchmarks/ablation.py --study cross_passk`` evaluates the SFT model and each trained model
with several repeats per held-out problem; a problem is *solved* when one repeat succeeds, and
a trained model *loses* the problems the SFT model solved that it no longer does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from ablation import pass_k, resample_floor, solved_sets  # noqa: E402


def test_solved_sets_count_a_problem_once_any_repeat_succeeds(tmp_path):
    episodes = [("a", 1, 0.0), ("a", 1, 1.0), ("a", 2, 0.0), ("a", 2, 0.0), ("a", 3, 1.0), ("b", 7, 0.0)]
    (tmp_path / "trajectories.jsonl").write_text(
        "".join(json.dumps({"task": t, "index": i, "repeat": r, "reward": w}) + "\n"
                for r, (t, i, w) in enumerate(episodes)))
    # a task with no success is still listed, with no problem solved
    assert solved_sets(tmp_path) == {"a": [1, 3], "b": []}


def test_pass_k_means_over_seeds_and_counts_lost_and_gained_problems():
    sft = {"pass_at_k": {"t": {"1": 0.3, "2": 0.5}}, "solved": {"t": [1, 2, 3]}}
    runs = [
        {"pass_at_k": {"t": {"1": 0.6, "2": 0.7}}, "solved": {"t": [1, 4]}},     # lost 2, 3; gained 4
        {"pass_at_k": {"t": {"1": 0.4, "2": 0.9}}, "solved": {"t": [1, 2, 3]}},  # lost none, gained none
    ]
    out = pass_k(runs, sft, ["t"])
    assert out["pass_at_k"]["t"]["1"] == {"mean": pytest.approx(0.5), "std": pytest.approx(0.1414, abs=1e-4),
                                          "per_seed": [0.6, 0.4]}
    assert out["pass_at_k"]["t"]["2"]["mean"] == pytest.approx(0.8)
    assert out["problems_lost"]["t"] == {"mean": 1.0, "std": pytest.approx(1.4142, abs=1e-4), "per_seed": [2, 0]}
    assert out["problems_gained"]["t"]["per_seed"] == [1, 0]


def test_pass_k_is_absent_without_repeats():
    assert pass_k([{"heldout": {"t": 0.5}}], None, ["t"]) == {}


def test_the_resample_floor_compares_two_evaluations_of_one_model():
    floor = resample_floor({"t": [1, 2, 3]}, {"t": [2, 5]}, {"t": {"1": 0.2}})
    assert floor == {"t": {"lost": 2, "gained": 1, "pass_at_k": {"1": 0.2}}}
