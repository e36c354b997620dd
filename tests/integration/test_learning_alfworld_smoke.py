"""The ALFWorld learning benchmark's plumbing, end to end on a very short run (not its +15 point target).

``benchmarks/learning_alfworld.py --quick`` runs the real command line on the ALFWorld
environment (TextWorld's PDDL engine in game processes): ``agentrl demos --env alfworld`` (expert
walkthroughs with detours) -> ``agentrl sft`` -> ``agentrl eval`` on alfworld-std -> ``agentrl
train`` on training games (Ray, embedded control plane, hf engine, FSDP2 learner) -> ``agentrl
eval``, and writes its JSON and PNG. This test checks that every stage ran on the games it names
and that the numbers recorded are the ones the evaluations and the training run produced.
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
UNKNOWN = ("xyzzy", "dance", "sing loudly", "jump")  # the oracle's commands the game does not know


def actions(demo: dict) -> list[str]:
    return [json.loads(c["function"]["arguments"])["action"] for m in demo["messages"] if m["role"] == "assistant"
            for c in m.get("tool_calls") or []]


TYPES = ("pick_and_place_simple", "pick_heat_then_place_in_recep")


def games_of(split: str, types: tuple[str, ...]) -> list[int]:
    from agentrl_env_alfworld.data import GameLibrary

    library = GameLibrary()
    return sorted(i for i in library.index_sets()[split] if library.ref(split, i).task_type in types)


def test_quick_alfworld_learning_benchmark_runs_every_stage(tmp_path, tiny_model_dir):
    out = tmp_path / "learning_alfworld_quick.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "learning_alfworld.py"), "--quick", "--work", str(tmp_path / "work"),
         "--out", str(out), "--model", str(tiny_model_dir), "--demo-stride", "2", "--task-types", ",".join(TYPES),
         "--rollout-temperature", "0.7", "--rl-lr", "1e-4"],
        capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 10_000
    params = result["params"]

    sft = result["sft"]
    kept = [json.loads(line) for line in (tmp_path / "work" / "demos.jsonl").read_text().splitlines()]
    # --task-types and --demo-stride 2: every other training game of those types played (agentrl demos
    # --indices), then --limit
    train_games = games_of("train", TYPES)
    assert [d["index"] for d in kept] == train_games[::2][: params["demo_limit"]]
    assert set(sft["demos_by_type"]) <= set(TYPES)
    assert sft["demos"] == len(kept) and sum(sft["demos_by_type"].values()) == len(kept)
    assert all(d["task"] == "alfworld" and d["split"] == "train" for d in kept)
    # the walkthroughs with detours still win (a detour is harmless), in more turns than the walkthrough
    assert sft["demo_success"] == 1.0 and sft["demo_turns_mean"] >= 3
    detours = [a for d in kept for a in actions(d) if a in ("look", "inventory", *UNKNOWN) or a.startswith("examine ")]
    assert detours  # --error-rate 0.3 over 16 games: some detours, which the model imitates too
    assert sft["sft_steps"] >= 1 and sft["sft_final_nll"] > 0
    # SFT keeps won demonstrations only (the searching oracle loses some; the walkthrough none)
    assert sft["demos_trained"] == len(kept)
    assert f"from {len(kept)} demonstrations (0 below sft.min_reward 1 left out)" in (
        tmp_path / "work" / "logs" / "sft.log").read_text()

    for ev in (result["before"], result["after"]):
        task = ev["tasks"]["std"]
        assert len(task["per_repeat"]) == params["eval_repeats"]
        assert task["episodes"] == params["eval_limit"] * params["eval_repeats"] and task["infra_failures"] == 0
        assert 0.0 <= task["success"] <= 1.0 and task["spread"] >= 0.0
        assert sum(t["episodes"] for t in ev["by_type"].values()) == task["episodes"]
        assert set(ev["by_type"]) == {"pick_and_place_simple"}  # std's first games
        seen = ev["tasks"]["train-seen"]  # two training games: a pick-and-place and a heat game
        assert seen["episodes"] == params["seen_games"] * params["eval_repeats"] and seen["infra_failures"] == 0
        kinds = ev["per_episode_mean"]  # every turn an action or a lost turn
        assert kinds["turns"] == pytest.approx(kinds["actions"] + kinds["no_call"]) and kinds["turns"] <= 3
        assert kinds["turns"] == pytest.approx(task["turns_mean"])
    assert result["change"]["std"] == pytest.approx(result["after"]["tasks"]["std"]["success"]
                                                    - result["before"]["tasks"]["std"]["success"])

    train = result["train"]
    assert train["steps"] == params["total_steps"] and not train["interrupted"]
    assert [p["step"] for p in train["curve"]] == list(range(1, train["steps"] + 1))
    assert all(0.0 <= p["reward"] <= 1.0 and p["trajectories"] > 0 for p in train["curve"])
    assert Path(train["model"]).name == "final_model" and train["model_step"] == train["steps"]
    evaluated = yaml.safe_load((tmp_path / "work" / "eval_sft" / "config.yaml").read_text())
    std, seen = evaluated["eval"]["tasks"]
    assert std["split"] == "std" and std["indices"] == games_of("std", TYPES)
    # of the training games of the two types, two spread over them
    assert seen["split"] == "train" and seen["indices"] == train_games[:: len(train_games) // 2][:2]
    config = yaml.safe_load((tmp_path / "work" / "grpo" / "config.yaml").read_text())
    assert [(t["env"], t["split"], t["limit"], t["indices"]) for t in config["tasks"]] == [
        ("alfworld", "train", params["train_limit"], train_games)]
    assert config["environments"]["alfworld"]["max_steps"] == 3  # the quick overrides reach the training run
    # --rollout-temperature and --rl-lr reach the training run only
    assert config["rollout"]["temperature"] == 0.7 and config["optim"]["lr"] == 1e-4
    assert evaluated["rollout"]["temperature"] == 1.0 and evaluated["optim"]["lr"] == 2e-4
    assert result["passed"] is None  # --quick checks the plumbing, never claims the target
