"""agentrl eval end to end: the tiny model on the calc environment through a real controller,
task worker and engine; and the same through the OpenAI-compatible endpoint of the engine."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest
import yaml

pytestmark = [pytest.mark.processes]


def run_eval(tmp_path, config: dict, *extra: str) -> dict:
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(config))
    out = subprocess.run([sys.executable, "-m", "agentrl_core.cli.main", "eval", str(path), "--out",
                          str(tmp_path / "out"), *extra], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "calc-test" in out.stdout and "pass@1" in out.stdout
    return json.loads((tmp_path / "out" / "summary.json").read_text())


def base_config(tmp_path, model) -> dict:
    return {
        "run": {"name": "eval", "output_dir": str(tmp_path)},
        "model": {"path": str(model)},
        "rollout": {"max_turns": 3, "max_total_len": 1024, "max_new_tokens": 32, "temperature": 1.0},
        "eval": {"tasks": [{"env": "calc", "split": "test", "limit": 6}], "repeats": 2, "concurrency": 8},
    }


def test_eval_single_model_through_controller_worker_and_engine(tmp_path, tiny_model_dir):
    summary = run_eval(tmp_path, base_config(tmp_path, tiny_model_dir))
    task = summary["models"]["default"]["calc-test"]
    # 6 indices x 2 repeats, none lost to infrastructure; an untrained model rarely succeeds
    assert task["episodes"] == 12 and task["infra_failures"] == 0
    assert set(task["pass_at_k"]) == {"1", "2"}
    assert sum(task["statuses"].values()) == 12
    lines = (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 12 and json.loads(lines[0])["messages"][0]["role"] == "system"
    # each episode keeps its metrics (the environment's and the agent loop's), and the summary their means
    episodes = [json.loads(line) for line in lines]
    assert all(e["metrics"]["turns"] == e["turns"] and "parse_errors" in e["metrics"] for e in episodes)
    assert all("rounds" in e["metrics"] and "invalid_turns" in e["metrics"] for e in episodes)  # every env reply
    rounds = [e["metrics"]["rounds"] for e in episodes]
    assert task["metrics_mean"]["rounds"] == pytest.approx(sum(rounds) / len(rounds))
    assert task["metrics_mean"]["turns"] == pytest.approx(task["turns_mean"])
    # the trajectory store has the same 12 episodes, each with its tokens
    from agentrl_core.train.trajstore import read_tokens

    conn = sqlite3.connect(tmp_path / "out" / "trajectories.sqlite")
    stored = conn.execute("SELECT id, kind, task, task_index, sample, status, reward, num_tokens, num_action_tokens "
                          "FROM trajectories ORDER BY task_index, sample").fetchall()
    by_episode = {(e["index"], e["repeat"]): e for e in map(json.loads, lines)}
    assert len(stored) == 12 and {r[1:3] for r in stored} == {("eval", "calc-test")}
    for traj_id, _, _, index, sample, status, reward, num_tokens, num_action in stored:
        assert (status, reward) == (by_episode[(index, sample)]["status"], by_episode[(index, sample)]["reward"])
        tokens = read_tokens(conn, traj_id)
        assert len(tokens["input_ids"]) == num_tokens and sum(tokens["loss_mask"]) == num_action > 0
        assert all(v is not None and v <= 0 for v, m in zip(tokens["logprobs"], tokens["loss_mask"]) if m)
        assert tokens["learner_logprobs"] is None  # evaluation trains nothing
    conn.close()


def test_eval_openai_endpoint_baseline(tmp_path, tiny_model_dir):
    from agentrl_core.rollout.hf_driver import HFDriver

    driver = HFDriver(log_dir=str(tmp_path / "engine"))
    try:
        url = driver.launch("baseline", str(tiny_model_dir), [])[0]
        summary = run_eval(tmp_path, base_config(tmp_path, tiny_model_dir), "--engine", "openai",
                           "--base-url", f"{url}/v1", "--model", "baseline")
    finally:
        driver.shutdown()
    task = summary["models"]["openai"]["calc-test"]
    assert task["episodes"] + task["infra_failures"] == 12 and task["infra_failures"] == 0
    episodes = [json.loads(line) for line in (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()]
    assert all(e["metrics"]["turns"] == e["turns"] and "rounds" in e["metrics"] for e in episodes)
    assert task["metrics_mean"]["rounds"] == pytest.approx(sum(e["metrics"]["rounds"] for e in episodes) / 12)
    conn = sqlite3.connect(tmp_path / "out" / "trajectories.sqlite")  # an endpoint's episodes: messages, no tokens
    assert conn.execute("SELECT count(*), count(DISTINCT model), sum(json_array_length(messages) > 1) "
                        "FROM trajectories").fetchone() == (12, 1, 12)
    assert conn.execute("SELECT count(*) FROM tokens").fetchone() == (0,)
    stored = [json.loads(m) for (m,) in conn.execute("SELECT metrics FROM trajectories")]
    assert all("rounds" in m and m["error"] is None for m in stored)  # the episode's metrics, as in the jsonl
    conn.close()


def test_eval_of_a_run_folder_evaluates_its_final_policy_and_says_so(tmp_path, tiny_model_dir):
    # a finished run's folder as agentrl train leaves it: its config, and summary.json naming the final model
    import shutil

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    final = shutil.copytree(tiny_model_dir, run_dir / "final_model")
    config = base_config(tmp_path, tmp_path / "the_sft_model_that_is_gone")
    config["run"]["output_dir"] = str(run_dir)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    (run_dir / "summary.json").write_text(json.dumps({"steps": 2, "final_model": str(final)}))
    out = subprocess.run([sys.executable, "-m", "agentrl_core.cli.main", "eval", str(run_dir), "--set",
                          "eval.repeats=1"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"evaluating the trained policy of run folder {run_dir}: {final}" in out.stdout
    assert f"model default: {final} (model.path)" in out.stdout
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    assert summary["models"]["default"]["calc-test"]["episodes"] == 6


def test_eval_task_indices_outside_the_split_are_one_sentence(tmp_path, tiny_model_dir):
    config = base_config(tmp_path, tiny_model_dir)
    config["eval"]["tasks"] = [{"env": "calc", "split": "test", "indices": [0, 1, 99999, 100000]}]
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(config))
    out = subprocess.run([sys.executable, "-m", "agentrl_core.cli.main", "eval", str(path), "--out",
                          str(tmp_path / "out")], capture_output=True, text=True, timeout=900)
    assert out.returncode != 0
    assert "eval task 'calc-test': indices 99999, 100000 are not in split 'test' of 'calc'" in out.stderr, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
