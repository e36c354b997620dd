"""The learning benchmark's plumbing, end to end on a very short run (not its +25 point target).

``benchmarks/learning.py --quick`` runs the real command line: ``agentrl demos`` -> ``agentrl
sft`` -> ``agentrl eval`` -> ``agentrl train`` (Ray, embedded control plane, hf engine, FSDP2
learner) -> ``agentrl eval``, and writes its JSON and PNG. This test runs one arm, the
sign-flipped control ``grpo_negated`` (each arm is the same code path; the GRPO arm trains in
the other integration tests), and checks that every stage ran, that the control really
trained with the negated estimator, and that the curves and evaluations are recorded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.processes, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_quick_learning_benchmark_runs_every_stage(tmp_path, tiny_model_dir):
    out = tmp_path / "learning_quick.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "learning.py"), "--quick", "--work", str(tmp_path / "work"),
         "--out", str(out), "--model", str(tiny_model_dir), "--arms", "grpo_negated"],
        capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 10_000

    sft = result["sft"]
    assert sft["demos"] == result["params"]["demos"] and 0 < sft["demo_success"] < 1  # a mix of right and wrong
    assert sft["sft_steps"] >= 1 and sft["sft_final_nll"] > 0
    before = result["before"]
    assert before["tasks"]["calc-test"]["episodes"] == result["params"]["eval_limit"]
    assert 0.0 <= before["success"] <= 1.0

    assert set(result["runs"]) == {"grpo_negated"}
    for arm in ("grpo_negated",):
        run = result["runs"][arm]
        train = run["train"]
        assert train["steps"] == result["params"]["total_steps"] and not train["interrupted"]
        assert [p["step"] for p in train["curve"]] == list(range(1, train["steps"] + 1))
        assert all(0.0 <= p["reward"] <= 1.0 and p["trajectories"] > 0 for p in train["curve"])
        assert Path(train["model"]).name == "final_model" and train["model_step"] == train["steps"]
        assert run["after"]["tasks"]["calc-test"]["episodes"] == result["params"]["eval_limit"]
        assert run["improvement"] == pytest.approx(run["after"]["success"] - before["success"])
        config = yaml.safe_load((tmp_path / "work" / arm / "config.yaml").read_text())
        assert config["advantage"]["estimator"] == arm  # the control really trained with the flipped sign
    assert result["passed"] is None  # --quick checks the plumbing, never claims the target
