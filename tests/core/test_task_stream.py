"""Task stream: weights, per-epoch reshuffle with fresh ids, checkpoint and re-issue."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from agentrl_core.config import TaskConfig
from agentrl_core.errors import ConfigError
from agentrl_core.train.task_stream import StreamTask, TaskStream


def stream(seed=0, n=4):
    return TaskStream([StreamTask("db-train", "db", "train", range(5))], n_samples=n, seed=seed)


def test_each_epoch_is_a_new_permutation_with_fresh_ids():
    s = stream()
    first, second, third = s.take(5), s.take(5), s.take(5)
    for epoch, groups in enumerate((first, second, third)):
        assert sorted(g.index for g in groups) == [0, 1, 2, 3, 4]  # every prompt once per epoch
        assert {g.epoch for g in groups} == {epoch}
    orders = [[g.index for g in e] for e in (first, second, third)]
    assert len({tuple(o) for o in orders}) == 3  # upstream's itertools.cycle replayed epoch 0
    ids = [g.group_id for g in first + second + third]
    assert len(set(ids)) == 15
    assert first[0].group_id == f"00000000-db-train-e0-{first[0].index}"
    assert all(g.n_samples == 4 for g in first)


def test_seed_decides_the_order_reproducibly():
    assert [g.index for g in stream(1).take(10)] == [g.index for g in stream(1).take(10)]
    assert [g.index for g in stream(1).take(10)] != [g.index for g in stream(2).take(10)]


def test_tasks_interleave_by_weight_in_every_window():
    s = TaskStream(
        [StreamTask("a", "x", "train", range(7), weight=2.0), StreamTask("b", "y", "train", range(3), weight=1.0)],
        n_samples=1,
    )
    groups = s.take(30)
    assert Counter(g.task for g in groups) == {"a": 20, "b": 10}
    for k in range(0, 30, 3):
        assert Counter(g.task for g in groups[k : k + 3]) == {"a": 2, "b": 1}
    # b's three prompts went round more often: its epochs advance independently
    assert s.epochs() == {"a": pytest.approx(20 / 7), "b": pytest.approx(10 / 3)}


def test_state_round_trip_reissues_outstanding_then_continues_identically():
    a = stream(seed=3)
    issued = a.take(7)
    a.mark_done([g.group_id for g in issued[:2]] + [issued[4].group_id])
    state = json.loads(json.dumps(a.state_dict()))  # survives JSON
    b = stream(seed=3)
    b.load_state_dict(state)
    outstanding = [issued[i] for i in (2, 3, 5, 6)]
    assert b.outstanding == outstanding
    assert b.take(4) == outstanding  # re-issued first, same ids
    assert b.take(6) == a.take(6)  # then exactly what the uninterrupted stream issues


def test_mark_done_rejects_unknown_groups():
    s = stream()
    g = s.next_group()
    s.mark_done(g.group_id)
    with pytest.raises(ValueError, match="already done"):
        s.mark_done(g.group_id)


def test_load_rejects_a_different_config():
    state = stream(seed=0).state_dict()
    with pytest.raises(ValueError, match="same tasks and seed"):
        stream(seed=1).load_state_dict(state)
    other = TaskStream([StreamTask("db-train", "db", "train", range(6))], n_samples=4)
    with pytest.raises(ValueError, match="same tasks and seed"):
        other.load_state_dict(state)


def test_from_config_indices_and_limit():
    task = TaskConfig(env="db", split="std", weight=2.0, limit=3)
    st = StreamTask.from_config(task, ["q0", "q1", "q2", "q3"])
    assert st.name == "db-std" and st.indices == ("q0", "q1", "q2") and st.weight == 2.0
    st = StreamTask.from_config(TaskConfig(env="db", split="std", indices=["q3", "q1"]), ["q0", "q1", "q2", "q3"])
    assert st.indices == ("q3", "q1")
    with pytest.raises(ConfigError, match=r"^task 'db-std': indices nope are not in split 'std' of 'db' \(1 indices\)$"):
        StreamTask.from_config(TaskConfig(env="db", split="std", indices=["nope"]), ["q0"])
    # an int names a string index by position, as environments accept (the same rule as agentrl eval's)
    assert StreamTask.from_config(TaskConfig(env="db", split="std", indices=[2]), ["q0", "q1", "q2"]).indices == (2,)
    with pytest.raises(ValueError, match="no indices"):
        StreamTask("e-s", "e", "s", [])
    with pytest.raises(ValueError, match="unique"):
        TaskStream([StreamTask("a", "e", "s", [1]), StreamTask("a", "e", "s", [2])], n_samples=1)
