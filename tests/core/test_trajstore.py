"""The trajectory store: schema, what a step writes, the bound on steps, the writer thread."""

from __future__ import annotations

import json
import math
import sqlite3

import pytest
import torch

from agentrl_core.train.trajstore import FILENAME, SCHEMA_VERSION, TrajectoryStore, read_tokens, tool_calls_of
from agentrl_core.types import Trajectory, TurnRecord

MESSAGES = [
    {"role": "user", "content": "2 + 3?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
    {"role": "tool", "tool_call_id": "c0", "content": "5"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "answer", "arguments": '{"x": 5}'}}]},
]


def traj(group: str, sample: int, *, reward: float = 1.0, status: str = "completed", ids=None, mask=None,
         sequence_lengths=None) -> Trajectory:
    ids = ids or [11, 12, 13, 14, 15, 16]
    mask = mask or [0, 0, 1, 1, 0, 1]
    logprobs = [-0.5 * (i + 1) if m else 0.0 for i, m in enumerate(mask)]
    versions = [3 if m else -1 for m in mask]
    return Trajectory(group_id=group, uid=f"{group}/{sample}", task="calc-train", split="train", index=7, sample=sample,
                      input_ids=ids, loss_mask=mask, rollout_logprobs=logprobs, versions=versions,
                      turns=[TurnRecord("current", "http://e0", 3, 2, "stop"), TurnRecord("current", "http://e0", 3, 1, "stop")],
                      reward=reward, training_reward=reward if status == "completed" else -0.2, status=status,
                      failure="none" if status == "completed" else "agent", num_turns=2, prompt_length=2,
                      metrics={"invalid_turns": 0, "score": float("nan")}, messages=MESSAGES,
                      sequence_lengths=sequence_lengths)


def rows(path, sql, *args):
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def test_tool_calls_are_flattened_with_their_turn():
    assert tool_calls_of(MESSAGES) == [
        {"turn": 0, "id": "c0", "name": "add", "arguments": '{"a": 2, "b": 3}'},
        {"turn": 1, "id": "c1", "name": "answer", "arguments": '{"x": 5}'},
    ]
    assert tool_calls_of(None) == []


def test_a_step_is_written_with_its_tokens_learner_logprobs_and_ratios(tmp_path):
    path = tmp_path / FILENAME
    a, b = traj("g0", 0, reward=1.0), traj("g0", 1, reward=0.0, status="task limit reached")
    advantages = torch.tensor([[0.0, 0.0, 0.7, 0.7, 0.0, 0.7, 0.0], [0.0, 0.0, -0.7, -0.7, 0.0, -0.7, 0.0]])
    # loss tokens of a: positions 2, 3, 5 with rollout log-probs -1.5, -2.0, -3.0
    learner = {0: [-1.4, -2.0, math.log(2.0) - 3.0], 1: [-1.5, -2.0, -3.0]}
    with TrajectoryStore(path, run="r", max_steps=10) as store:
        assert store.add_step(1, [a, b], advantages=advantages, learner_logprobs=learner, metrics={"reward": 0.5})
    assert rows(path, "SELECT value FROM meta WHERE key = 'schema_version'") == [(str(SCHEMA_VERSION),)]
    conn = sqlite3.connect(path)
    got = conn.execute("SELECT id, run, kind, step, uid, task, split, task_index, group_id, sample, status, failure, "
                       "reward, training_reward, advantage, num_turns, num_tokens, num_action_tokens, min_version, "
                       "max_version, tool_calls, turns, metrics FROM trajectories ORDER BY sample").fetchall()
    assert [r[1:20] for r in got] == [
        ("r", "train", 1, "g0/0", "calc-train", "train", 7, "g0", 0, "completed", "none", 1.0, 1.0,
         pytest.approx(0.7), 2, 6, 3, 3, 3),
        ("r", "train", 1, "g0/1", "calc-train", "train", 7, "g0", 1, "task limit reached", "agent", 0.0, -0.2,
         pytest.approx(-0.7), 2, 6, 3, 3, 3),
    ]
    assert [c["name"] for c in json.loads(got[0][20])] == ["add", "answer"]
    assert json.loads(got[0][21])[0] == {"pool": "current", "engine": "http://e0", "version": 3, "num_tokens": 2,
                                         "finish_reason": "stop", "aborted_retries": 0}
    assert json.loads(got[0][22]) == {"invalid_turns": 0, "score": "nan"}
    tokens = read_tokens(conn, got[0][0])
    assert tokens["input_ids"] == a.input_ids and tokens["loss_mask"] == a.loss_mask and tokens["versions"] == a.versions
    assert tokens["logprobs"] == [0.0, 0.0, -1.5, -2.0, 0.0, -3.0]
    assert tokens["learner_logprobs"] == [None, None, -1.4, -2.0, None, pytest.approx(math.log(2.0) - 3.0, abs=1e-6)]
    # ratio = exp(learner - rollout): exp(0.1), exp(0), exp(log 2) on the loss tokens, null elsewhere
    assert tokens["ratios"] == [None, None, pytest.approx(math.exp(0.1), abs=1e-6), 1.0, None,
                                pytest.approx(2.0, abs=1e-6)]
    assert tokens["advantages"] == [None, None, pytest.approx(0.7), pytest.approx(0.7), None, pytest.approx(0.7)]
    # the documented per-token query: json_each over the arrays, the mean ratio of a step
    mean_ratio = conn.execute(
        "SELECT avg(r.value) FROM trajectories t JOIN tokens k ON k.trajectory_id = t.id, json_each(k.ratios) r "
        "WHERE t.step = 1 AND r.value IS NOT NULL").fetchone()[0]
    assert mean_ratio == pytest.approx((math.exp(0.1) + 1 + 2 + 3) / 6, abs=1e-6)
    assert conn.execute("SELECT step, trajectories, metrics FROM steps").fetchall() == [(1, 2, '{"reward": 0.5}')]
    conn.close()


def test_learner_logprobs_of_a_forked_trajectory_follow_its_sequences(tmp_path):
    """Train samples are numbered per sequence: a trajectory cut in two takes two learner entries."""
    forked = traj("g1", 0, ids=[1, 2, 3, 4, 5, 6], mask=[0, 1, 1, 0, 0, 1], sequence_lengths=[3, 3])
    plain = traj("g1", 1)
    learner = {0: [-1.0, -1.5], 1: [-3.0], 2: [-1.5, -2.0, -3.0]}
    with TrajectoryStore(tmp_path / FILENAME, run="r") as store:
        store.add_step(1, [forked, plain], learner_logprobs=learner)
        store.flush()
        conn = sqlite3.connect(store.path)
        ids = [r[0] for r in conn.execute("SELECT id FROM trajectories ORDER BY sample")]
        assert read_tokens(conn, ids[0])["learner_logprobs"] == [None, -1.0, -1.5, None, None, -3.0]
        assert read_tokens(conn, ids[1])["learner_logprobs"] == [None, None, -1.5, -2.0, None, -3.0]
        assert read_tokens(conn, ids[0])["sequence_lengths"] == [3, 3]
        conn.close()


def test_without_learner_logprobs_the_learner_columns_are_null(tmp_path):
    with TrajectoryStore(tmp_path / FILENAME, run="r") as store:
        store.add_step(1, [traj("g", 0)])
    got = rows(tmp_path / FILENAME, "SELECT learner_logprobs, ratios, advantages FROM tokens")
    assert got == [(None, None, None)]
    assert rows(tmp_path / FILENAME, "SELECT advantage FROM trajectories") == [(None,)]


def test_only_the_last_max_steps_steps_are_kept(tmp_path):
    path = tmp_path / FILENAME
    with TrajectoryStore(path, run="r", max_steps=3) as store:
        for step in range(1, 8):
            store.add_step(step, [traj(f"g{step}", 0), traj(f"g{step}", 1)])
    assert rows(path, "SELECT DISTINCT step FROM trajectories ORDER BY step") == [(5,), (6,), (7,)]
    assert rows(path, "SELECT count(*) FROM tokens") == [(6,)]  # the tokens went with their trajectories
    assert rows(path, "SELECT count(*) FROM steps") == [(7,)]  # the per-step summary is small: all kept


def test_the_file_stops_growing_once_the_bound_is_reached(tmp_path):
    """Deleted steps free pages that later steps reuse: 20 steps take the room of the first few."""
    path = tmp_path / FILENAME
    sizes = []
    for first, last in ((1, 4), (5, 12), (13, 20)):
        with TrajectoryStore(path, run="r", max_steps=2) as store:
            for step in range(first, last + 1):
                store.add_step(step, [traj(f"g{step}", s, ids=list(range(400)), mask=[0] + [1] * 399)
                                      for s in range(4)])
        sizes.append(path.stat().st_size)
    assert not (tmp_path / f"{FILENAME}-wal").exists() or (tmp_path / f"{FILENAME}-wal").stat().st_size == 0
    assert sizes[2] <= sizes[0] * 1.1, sizes
    assert rows(path, "SELECT DISTINCT step FROM trajectories ORDER BY step") == [(19,), (20,)]


def test_close_flushes_everything_queued(tmp_path):
    path = tmp_path / FILENAME
    store = TrajectoryStore(path, run="r", max_steps=None, queue_steps=64)
    for step in range(1, 41):
        store.add_step(step, [traj(f"g{step}", 0)])
    store.close()
    store.close()  # twice is harmless
    assert rows(path, "SELECT count(*), min(step), max(step) FROM trajectories") == [(40, 1, 40)]
    with pytest.raises(RuntimeError, match="closed"):
        store.add_step(41, [traj("g", 0)])


def test_a_reader_sees_committed_steps_while_the_writer_is_open(tmp_path):
    path = tmp_path / FILENAME
    with TrajectoryStore(path, run="r") as store:
        store.add_step(1, [traj("g", 0)])
        store.flush()
        assert rows(path, "SELECT count(*) FROM trajectories") == [(1,)]
        assert rows(path, "PRAGMA journal_mode") == [("wal",)]
        store.add_step(2, [traj("g2", 0)])


def test_truncate_after_drops_the_steps_a_resume_trains_again(tmp_path):
    path = tmp_path / FILENAME
    with TrajectoryStore(path, run="r") as store:
        for step in range(1, 6):
            store.add_step(step, [traj(f"g{step}", 0)])
        store.add_episode(traj("v", 0), kind="validation", step=5)
        store.truncate_after(3)
        store.add_step(4, [traj("g4b", 0)])
    assert rows(path, "SELECT step, group_id, kind FROM trajectories ORDER BY step") == [
        (1, "g1", "train"), (2, "g2", "train"), (3, "g3", "train"), (4, "g4b", "train")]
    assert rows(path, "SELECT step FROM steps ORDER BY step") == [(1,), (2,), (3,), (4,)]


def test_episodes_with_and_without_tokens(tmp_path):
    path = tmp_path / FILENAME
    with TrajectoryStore(path, run="ev") as store:
        store.add_episode(traj("eval/calc-test/7", 0), kind="eval", model="default")
        store.add_episode(result={"status": "completed", "reward": 1.0, "turns": 2, "messages": MESSAGES,
                                  "error": None},
                          kind="eval", task="calc-test", index=8, sample=1, model="openai", uid="u", group_id="grp")
    got = rows(path, "SELECT kind, step, task, task_index, model, status, reward, num_tokens, json_array_length(tool_calls) "
                     "FROM trajectories ORDER BY id")
    assert got == [("eval", None, "calc-train", 7, "default", "completed", 1.0, 6, 2),
                   ("eval", None, "calc-test", 8, "openai", "completed", 1.0, None, 2)]
    assert rows(path, "SELECT count(*) FROM tokens") == [(1,)]


def test_a_writer_error_is_reported_and_does_not_reach_the_loop(tmp_path, caplog):
    path = tmp_path / FILENAME
    store = TrajectoryStore(path, run="r")
    store.add_step(1, [traj("g", 0)], learner_logprobs={0: [-1.0]})  # 1 value for 3 loss tokens
    store.flush()
    assert isinstance(store.error, ValueError) and "3 loss tokens" in str(store.error)
    store.add_step(2, [traj("g2", 0)])  # ignored once broken, and the loop is not stopped
    store.close()
    assert "stops writing" in caplog.text
    assert rows(path, "SELECT count(*) FROM trajectories") == [(0,)]


def test_a_validation_round_is_stored_at_its_step_and_pruned_with_it(tmp_path):
    path = tmp_path / FILENAME
    with TrajectoryStore(path, run="r", max_steps=2) as store:
        store.add_step(1, [traj("g1", 0)])
        store.add_episodes([traj("v", 0), traj("v", 1)], kind="validation", step=1)
        assert rows_after_flush(store, "SELECT kind, step, count(*) FROM trajectories GROUP BY kind") == [
            ("train", 1, 1), ("validation", 1, 2)]
        store.add_step(2, [traj("g2", 0)])
        store.add_step(3, [traj("g3", 0)])
    assert rows(path, "SELECT kind, step FROM trajectories ORDER BY step") == [("train", 2), ("train", 3)]


def rows_after_flush(store, sql):
    store.flush()
    return rows(store.path, sql)
