"""Task normalization against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch
from agentrl_advnorm_task.normalizer import TaskNormalizer, TaskNormConfig

from agentrl_core.config import load_config
from agentrl_core.plugins import get_plugin_manager
from agentrl_core.registry import Registry
from agentrl_core.types import AdvantageBatch

EPS = 1e-6


def batch(adv, mask, sources):
    return AdvantageBatch(
        advantages=torch.tensor(adv, dtype=torch.float64),
        loss_mask=torch.tensor(mask, dtype=torch.float64),
        data_source=sources,
        group_id=[f"g{i}" for i in range(len(sources))],
    )


def test_entry_point_is_discovered_by_a_fresh_plugin_manager():
    pm = get_plugin_manager(environ={})
    assert pm.records["advnorm_task"].status == "ok"
    registry = Registry(pm)
    normalizer = registry.build("advantage_normalizer", "task", {"keep_zero": True})
    assert isinstance(normalizer, TaskNormalizer) and normalizer.config.keep_zero


def test_enabled_by_config(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("advantage:\n  normalizers: [task]\n  task:\n    keep_zero: true\n")
    config = load_config(path)
    assert config.advantage.options["task"] == TaskNormConfig(keep_zero=True)


def test_two_tasks_with_different_token_counts_and_variances():
    # task a: tokens 1,1,1 (row 0) and -1,-1 (row 1): mean 0.2, unbiased var (3*0.64 + 2*1.44)/4 = 1.2
    # task b: tokens 2,2,2,2 (row 2) and -2 (row 3): mean 1.2, unbiased var (4*0.64 + 10.24)/4 = 3.2
    out = TaskNormalizer()(batch(
        [[1, 1, 1, 9], [-1, -1, 9, 9], [2, 2, 2, 2], [-2, 9, 9, 9]],
        [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]],
        ["a", "a", "b", "b"],
    )).advantages
    sa, sb = math.sqrt(1.2) + EPS, math.sqrt(3.2) + EPS
    expected = [
        [0.8 / sa, 0.8 / sa, 0.8 / sa, 0.0],
        [-1.2 / sa, -1.2 / sa, 0.0, 0.0],
        [0.8 / sb, 0.8 / sb, 0.8 / sb, 0.8 / sb],
        [-3.2 / sb, 0.0, 0.0, 0.0],
    ]
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)
    # after normalization each task's tokens have mean 0 and (almost) unit std
    for rows, m in (([0, 1], [[1, 1, 1, 0], [1, 1, 0, 0]]), ([2, 3], [[1, 1, 1, 1], [1, 0, 0, 0]])):
        values = out[rows][torch.tensor(m) > 0]
        assert abs(values.mean().item()) < 1e-12
        assert values.std().item() == pytest.approx(1.0, abs=1e-5)


def test_task_with_a_single_token_is_unchanged():
    out = TaskNormalizer()(batch([[0.7, 5.0], [1.0, -1.0], [-1.0, 1.0]], [[1, 0], [1, 1], [1, 1]], ["solo", "x", "x"]))
    assert out.advantages[0].tolist() == [0.7, 0.0]  # unchanged, mask re-applied
    # task x: tokens 1,-1,-1,1 -> mean 0, unbiased std sqrt(4/3)
    s = math.sqrt(4 / 3) + EPS
    torch.testing.assert_close(out.advantages[1:], torch.tensor([[1 / s, -1 / s], [-1 / s, 1 / s]], dtype=torch.float64))


def test_task_whose_advantages_are_all_equal_becomes_zero():
    out = TaskNormalizer()(batch([[0.5, 0.5], [0.5, 0.5]], [[1, 1], [1, 0]], ["t", "t"]))
    assert out.advantages.tolist() == [[0.0, 0.0], [0.0, 0.0]]  # (0.5 - 0.5) / (0 + 1e-6)


def test_zero_advantage_groups_shift_unless_keep_zero():
    adv = [[1.0, 1.0], [-1.0, -1.0], [0.0, 0.0]]
    mask = [[1, 1], [1, 1], [1, 1]]
    # upstream behaviour: the zero row takes part: tokens 1,1,-1,-1,0,0 -> mean 0, var 4/5
    out = TaskNormalizer()(batch(adv, mask, ["t", "t", "t"])).advantages
    s = math.sqrt(4 / 5) + EPS
    torch.testing.assert_close(out, torch.tensor([[1 / s, 1 / s], [-1 / s, -1 / s], [0.0, 0.0]], dtype=torch.float64))
    # a shifted case: tokens 1,1,1,1 (row 0) and 0,0 (zero-advantage row 1) -> mean 2/3
    adv2 = [[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]
    mask2 = [[1, 1, 1, 1], [1, 1, 0, 0]]
    shifted = TaskNormalizer()(batch(adv2, mask2, ["t", "t"])).advantages
    var = (4 * (1 / 3) ** 2 + 2 * (2 / 3) ** 2) / 5
    s2 = math.sqrt(var) + EPS
    assert shifted[1, 0].item() == pytest.approx((0 - 2 / 3) / s2, abs=1e-12)  # the zero group moved
    kept = TaskNormalizer(TaskNormConfig(keep_zero=True))(batch(adv2, mask2, ["t", "t"])).advantages
    assert kept[1].tolist() == [0.0, 0.0, 0.0, 0.0]  # left at zero, out of the statistics
    assert kept[0].tolist() == [0.0, 0.0, 0.0, 0.0]  # the only signal row: all equal -> 0


def test_shape_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="do not match"):
        TaskNormalizer()(batch([[1.0, 2.0]], [[1, 1]], ["a", "b"]))


def test_stats_are_reported():
    normalizer = TaskNormalizer()
    normalizer(batch([[1.0, -1.0]], [[1, 1]], ["a"]))
    metrics = normalizer.metrics()
    assert metrics["advnorm/a/tokens"] == 2.0 and metrics["advnorm/a/normalized"] == 1.0
