"""The WebShop learning benchmark's plumbing, end to end on a very short run (not its +15 point target).

``benchmarks/learning_webshop.py --quick`` runs the real command line on the WebShop environment
(the bundled catalog, BM25 search, WebShop's reward): ``agentrl demos --env webshop`` (the oracle
with mistakes) -> ``agentrl sft`` on the won runs -> ``agentrl eval`` on bundled-test and seen
training goals -> ``agentrl train`` on bundled-train (Ray, embedded control plane, hf engine, FSDP2
learner) -> ``agentrl eval``, and writes its JSON and PNG. This test checks that every stage ran on
the goals it names and that the numbers recorded are the ones the runs produced.
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
TRAIN_GOALS = list(range(800, 3716))  # bundled-train in the bundled catalog's manifest


def test_quick_webshop_learning_benchmark_runs_every_stage(tmp_path, tiny_model_dir):
    out = tmp_path / "learning_webshop_quick.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "learning_webshop.py"), "--quick", "--work", str(tmp_path / "work"),
         "--out", str(out), "--model", str(tiny_model_dir), "--rollout-temperature", "0.7", "--rl-lr", "1e-4"],
        capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 10_000
    params = result["params"]

    sft = result["sft"]
    demos = [json.loads(line) for line in (tmp_path / "work" / "demos.jsonl").read_text().splitlines()]
    assert [d["index"] for d in demos] == TRAIN_GOALS[: params["demo_limit"]]
    assert all(d["task"] == "webshop" and d["split"] == "bundled-train" for d in demos)
    won = [d for d in demos if d["reward"] >= 1.0]
    # --error-rate 0.3: some runs buy the wrong thing (left out of SFT), most still win
    assert 0 < len(won) < len(demos) and sft["demos"] == len(demos) and sft["demos_trained"] == len(won)
    assert f"from {len(demos)} demonstrations ({len(demos) - len(won)} below sft.min_reward 1 left out)" in (
        tmp_path / "work" / "logs" / "sft.log").read_text()
    assert sft["sft_steps"] >= 1 and sft["sft_final_nll"] > 0 and sft["trained_turns_mean"] >= 3

    scripted = result["scripted"]  # two scripted shoppers on the same held-out goals, for scale
    assert set(scripted) == {"first_result", "goal_product"}
    assert all(v["episodes"] == params["eval_limit"] and 0.0 <= v["success"] <= v["reward_mean"] <= 1.0
               for v in scripted.values())

    for ev in (result["before"], result["after"]):
        test = ev["tasks"]["bundled-test"]
        assert len(test["per_repeat"]) == params["eval_repeats"]
        assert test["episodes"] == params["eval_limit"] * params["eval_repeats"] and test["infra_failures"] == 0
        assert 0.0 <= test["success"] <= test["reward_mean"] + 1e-9 <= 1.0 + 1e-9  # success is reward 1
        seen = ev["tasks"]["train-seen"]
        assert seen["episodes"] == params["seen_goals"] * params["eval_repeats"] and seen["infra_failures"] == 0
        kinds = ev["per_episode_mean"]  # every turn a search, a click or a lost turn
        assert kinds["turns"] == pytest.approx(kinds["searches"] + kinds["clicks"] + kinds["no_call"])
        assert kinds["turns"] == pytest.approx(test["turns_mean"]) and kinds["turns"] <= 3
        assert kinds["listed"] <= kinds["clicks"] and kinds["buy"] <= kinds["clicks"]
    assert result["change"]["bundled-test"] == pytest.approx(result["after"]["tasks"]["bundled-test"]["success"]
                                                             - result["before"]["tasks"]["bundled-test"]["success"])

    train = result["train"]
    assert train["steps"] == params["total_steps"] and not train["interrupted"]
    assert all(0.0 <= p["success"] <= p["reward"] + 1e-9 <= 1.0 + 1e-9 and p["trajectories"] > 0
               for p in train["curve"])
    assert Path(train["model"]).name == "final_model" and train["model_step"] == train["steps"]
    evaluated = yaml.safe_load((tmp_path / "work" / "eval_sft" / "config.yaml").read_text())
    test_task, seen_task = evaluated["eval"]["tasks"]
    assert (test_task["split"], test_task["limit"]) == ("bundled-test", params["eval_limit"])
    # two training goals spread over bundled-train
    assert seen_task["split"] == "bundled-train" and seen_task["indices"] == [800, 2258]
    assert evaluated["eval"]["temperature"] == 0.3
    config = yaml.safe_load((tmp_path / "work" / "grpo" / "config.yaml").read_text())
    assert [(t["env"], t["split"], t["limit"]) for t in config["tasks"]] == [
        ("webshop", "bundled-train", params["train_limit"])]
    assert config["environments"]["webshop"]["max_rounds"] == 3  # the quick overrides reach the training run
    # --rollout-temperature and --rl-lr reach the training run only
    assert config["rollout"]["temperature"] == 0.7 and config["optim"]["lr"] == 1e-4
    assert evaluated["rollout"]["temperature"] == 1.0 and evaluated["optim"]["lr"] == 2e-4
    assert result["passed"] is None  # --quick checks the plumbing, never claims the target
