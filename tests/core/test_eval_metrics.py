"""Evaluation statistics against hand-computed values."""

from __future__ import annotations

import pytest

from agentrl_core.eval.metrics import EpisodeResult, format_table, ks_for, pass_at_k, summarize


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 2, 4) == 1.0  # fewer than 4 failures: any 4 include a success
    assert pass_at_k(3, 0, 3) == 0.0
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)
    assert ks_for(8) == [1, 2, 4, 8] and ks_for(6) == [1, 2, 4, 6] and ks_for(1) == [1]


def test_summary_leaves_infra_failures_out_of_denominators():
    rows = [
        # index 0: repeat 0 success, repeat 1 failure
        EpisodeResult("db-std", 0, 0, 1.0, "completed", 3),
        EpisodeResult("db-std", 0, 1, 0.0, "task limit reached", 15),
        # index 1: repeat 0 success, repeat 1 success, plus one infra failure on repeat 1
        EpisodeResult("db-std", 1, 0, 1.0, "completed", 2),
        EpisodeResult("db-std", 1, 1, 1.0, "completed", 4),
        EpisodeResult("db-std", 2, 1, 0.0, "task error", 1),
    ]
    s = summarize(rows)["db-std"]
    assert s.episodes == 4 and s.infra_failures == 1
    assert s.per_repeat_success == [1.0, 0.5]  # repeat 1: 1 of 2 scored (the task error is left out)
    assert s.success_mean == pytest.approx(0.75) and s.success_std == pytest.approx(0.3535533906)
    assert s.pass_at[1] == pytest.approx((0.5 + 1.0) / 2)
    assert s.pass_at[2] == pytest.approx((1.0 + 1.0) / 2)
    assert s.statuses == {"completed": 3, "task error": 1, "task limit reached": 1}
    assert s.turns_mean == pytest.approx((3 + 15 + 2 + 4) / 4)
    table = format_table({"db-std": s})
    assert "0.750 ± 0.354" in table and "task error: 1" in table


def test_table_shows_completed_and_no_spread_for_one_repeat():
    rows = [EpisodeResult("calc-test", i, 0, float(i < 3), "completed" if i < 3 else "task limit reached", 2)
            for i in range(4)]
    s = summarize(rows)["calc-test"]
    table = format_table({"calc-test": s})
    assert "0.750" in table and "±" not in table  # one repeat: no spread to show
    assert "completed: 3, task limit reached: 1" in table


def test_training_table_takes_each_task_from_the_steps_that_had_it():
    from agentrl_core.jobs.training import training_table

    history = [
        {"step": 1, "task/calc/success": 0.25, "task/calc/reward": 0.5},
        {"step": 2, "task/calc/success": 0.5, "task/calc/reward": 0.75, "task/alfworld/success": 0.0,
         "task/alfworld/reward": 0.1},
        {"step": 3, "task/calc/success": 0.75, "task/calc/reward": 1.0},
    ]
    table = training_table(history)
    assert "nan" not in table
    lines = {line.split()[0]: line.split() for line in table.splitlines()}
    assert lines["calc"] == ["calc", "1-3", "0.250", "0.750", "0.500", "1.000"]
    assert lines["alfworld"] == ["alfworld", "2", "0.000", "0.000", "0.100", "0.100"]


def test_result_writer_keeps_what_produced_each_tasks_results(tmp_path):
    import json

    from agentrl_core.eval.runner import EvalRequest, ResultWriter
    from agentrl_core.rollout.agent_loop import RolloutRequest

    writer = ResultWriter(tmp_path)
    for task, index, source in (("db-std", 0, "db backend: sqlite (...)"), ("db-std", 1, "db backend: sqlite (...)"),
                                ("os-std", 0, None)):
        request = RolloutRequest(task=task, index=index, group_id=f"eval/{task}/{index}", uid=f"{task}/{index}")
        writer.add(EvalRequest(request, 0, "m"), {"status": "completed", "reward": 1.0, "turns": 2, "messages": [],
                                                  "result_source": source})
    writer.close()
    assert writer.sources == {"db-std": {"db backend: sqlite (...)"}}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["result_sources"] == {"db-std": ["db backend: sqlite (...)"]}


def test_metric_means_by_hand_leave_infra_failures_out():
    rows = [
        EpisodeResult("alf", 0, 0, 1.0, "completed", 5, metrics={"nothing_happens": 1.0, "won": 1.0}),
        EpisodeResult("alf", 1, 0, 0.0, "task limit reached", 20, metrics={"nothing_happens": 6.0, "won": 0.0}),
        EpisodeResult("alf", 2, 0, 0.0, "task limit reached", 20, metrics={"nothing_happens": 2.0}),
        EpisodeResult("alf", 3, 0, 0.0, "task error", 0, metrics={"nothing_happens": 100.0}),  # infra: left out
    ]
    s = summarize(rows)["alf"]
    # each metric over the scored episodes that reported it
    assert s.metrics_mean == {"nothing_happens": pytest.approx(3.0), "won": pytest.approx(0.5)}
    assert s.to_json()["metrics_mean"] == s.metrics_mean


def test_result_writer_keeps_each_episodes_metrics_and_their_means(tmp_path):
    import json

    from agentrl_core.eval.metrics import numeric_metrics
    from agentrl_core.eval.runner import EvalRequest, ResultWriter
    from agentrl_core.rollout.agent_loop import RolloutRequest

    assert numeric_metrics({"a": 2, "b": True, "c": "pick", "d": float("nan"), "e": None, "f": [1]}) == {
        "a": 2.0, "b": 1.0}
    writer = ResultWriter(tmp_path)
    episodes = [  # what an environment reports at the end: numbers, a label, and things JSON cannot hold
        {"nothing_happens": 4, "task_type": "pick_and_place_simple", "won": False, "raw": object()},
        {"nothing_happens": 1, "task_type": "look_at_obj_in_light", "won": True, "raw": object()},
    ]
    for index, metrics in enumerate(episodes):
        request = RolloutRequest(task="alf-std", index=index, group_id=f"eval/alf-std/{index}", uid=f"alf-std/{index}")
        writer.add(EvalRequest(request, 0, "m"), {"status": "completed", "reward": float(index), "turns": 3,
                                                  "messages": [], "metrics": metrics})
    writer.close()
    lines = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert [line["metrics"] for line in lines] == [
        {"nothing_happens": 4, "task_type": "pick_and_place_simple", "won": False},
        {"nothing_happens": 1, "task_type": "look_at_obj_in_light", "won": True},
    ]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["models"]["m"]["alf-std"]["metrics_mean"] == {"nothing_happens": 2.5, "won": 0.5}


def test_select_indices_by_value_and_by_position():
    from agentrl_core.config import TaskConfig
    from agentrl_core.errors import ConfigError

    def select(indices, available, limit=None):
        return TaskConfig(env="alfworld", split="train", indices=indices, limit=limit).select_indices(
            available, role="eval task")

    with pytest.raises(ConfigError, match=r"^eval task 'alfworld-train': indices 99 are not in split 'train' of "
                                          r"'alfworld' \(6 indices\)$"):
        select([0, 1, 99, 165], [0, 1, 2, 98, 100, 165])  # a split with gaps (ALFWorld train)
    assert select(["1", 2], [0, 1, 2]) == ["1", 2]  # "1" from YAML names index 1
    # string index sets take an int as a position, as environments do
    assert select([0, 2, "fixed_9"], ["fixed_0", "fixed_1", "fixed_9"]) == [0, 2, "fixed_9"]
    with pytest.raises(ConfigError, match="indices 3 are not"):
        select([0, 3], ["fixed_0", "fixed_1", "fixed_9"])
    with pytest.raises(ConfigError, match="indices 10, 11, 12, 13, 14 and 2 more are not"):
        select(list(range(17)), list(range(10)))
    assert select(None, [5, 6, 7], limit=2) == [5, 6] and select([7, 5], [5, 6, 7], limit=1) == [7]
