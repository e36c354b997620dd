"""Advantage estimators and normalizers against hand-computed values (docs/architecture.md section 6)."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl_core.registry import Registry
from agentrl_core.train.advantages import (
    apply_normalizers,
    build_advantage_fns,
    compute_advantages,
    grpo_advantages,
    masked_whiten,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)
from agentrl_core.types import AdvantageBatch, Trajectory

GROUPS = ["a", "a", "a", "b", "c", "c"]
REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.5, 1.0, 1.0])
MASK = torch.tensor(
    [
        [0, 1, 1, 0],
        [0, 1, 0, 0],
        [0, 0, 1, 1],
        [1, 1, 0, 0],
        [0, 1, 1, 1],
        [0, 0, 0, 1],
    ],
    dtype=torch.float32,
)


def test_grpo_hand_computed():
    adv = grpo_advantages(REWARDS, GROUPS, MASK)
    # group a: mean 1/3, unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = 1/sqrt(3)
    hi = (2 / 3) / (1 / math.sqrt(3) + 1e-6)  # 1.1546985
    lo = (-1 / 3) / (1 / math.sqrt(3) + 1e-6)  # -0.5773493
    assert hi == pytest.approx(1.1546985, abs=1e-6)
    expected = torch.tensor(
        [
            [0, hi, hi, 0],
            [0, lo, 0, 0],
            [0, 0, lo, lo],
            [0.5 / (1 + 1e-6)] * 2 + [0, 0],  # group of one: mean 0, std 1
            [0, 0, 0, 0],  # equal rewards: zero advantage
            [0, 0, 0, 0],
        ]
    )
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-6)


def test_rloo_hand_computed():
    adv = rloo_advantages(REWARDS, GROUPS, MASK)
    # r minus the mean of the other members: 1 - 0 = 1; 0 - (1 + 0)/2 = -0.5
    expected = torch.tensor(
        [
            [0, 1.0, 1.0, 0],
            [0, -0.5, 0, 0],
            [0, 0, -0.5, -0.5],
            [0.5, 0.5, 0, 0],  # group of one keeps r
            [0, 0, 0, 0],
            [0, 0, 0, 0],
        ]
    )
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-6)


def test_reinforce_pp_baseline_hand_computed():
    rewards = torch.tensor([1.0, 0.0, 2.0])
    groups = ["g", "g", "solo"]
    mask = torch.tensor([[1, 1, 0], [0, 1, 0], [1, 0, 0]], dtype=torch.float32)
    adv = reinforce_pp_baseline_advantages(rewards, groups, mask)
    # token scores 0.5, 0.5, -0.5, 2.0: mean 0.625, unbiased var 3.1875 / 3 = 1.0625
    std = math.sqrt(1.0625)
    expected = torch.tensor(
        [[-0.125 / std, -0.125 / std, 0], [0, -1.125 / std, 0], [1.375 / std, 0, 0]], dtype=torch.float32
    )
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-6)
    assert expected[1, 1].item() == pytest.approx(-1.091410, abs=1e-6)


def test_masked_whiten_needs_two_tokens():
    values = torch.tensor([[3.0, 0.0]])
    assert torch.equal(masked_whiten(values, torch.tensor([[1.0, 0.0]])), values)


def test_estimators_reject_mismatched_lengths():
    with pytest.raises(ValueError, match="must be equal"):
        grpo_advantages(torch.tensor([1.0, 0.0]), ["a"], torch.ones(2, 3))


@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce_pp_baseline"])
def test_registry_builds_estimators(name):
    estimator = Registry().build("advantage_estimator", name)
    adv = estimator(REWARDS, GROUPS, MASK)
    assert adv.shape == MASK.shape
    assert torch.all(adv[MASK == 0] == 0)


def _traj(uid, group, task, reward, mask):
    n = len(mask)
    return Trajectory(
        group_id=group, uid=uid, task=task, split="train", index=0, input_ids=list(range(n)), loss_mask=mask,
        rollout_logprobs=[0.0] * n, versions=[0] * n, turns=[], reward=reward, training_reward=reward,
        status="completed", failure="none",
    )


def test_normalizers_run_in_order_with_mask_reapplied():
    trajs = [
        _traj("0", "g", "db", 1.0, [0, 1, 1]),
        _traj("1", "g", "db", 0.0, [1, 0]),
    ]
    calls = []

    def add_one(batch: AdvantageBatch) -> AdvantageBatch:  # writes into masked-out tokens on purpose
        calls.append("add_one")
        return AdvantageBatch(batch.advantages + 1, batch.loss_mask, batch.data_source, batch.group_id)

    def double(batch: AdvantageBatch) -> AdvantageBatch:
        calls.append("double")
        assert torch.all(batch.advantages[batch.loss_mask == 0] == 0)  # mask re-applied before the next one
        return AdvantageBatch(batch.advantages * 2, batch.loss_mask, batch.data_source, batch.group_id)

    out = compute_advantages(trajs, rloo_advantages, [add_one, double])
    assert calls == ["add_one", "double"]
    # rloo: +1 and -1 on the loss tokens; +1 then x2 -> 4 and 0; the +1 written into
    # masked-out and padded positions is removed again; row 1 is padded to length 3
    expected = torch.tensor([[0, 4.0, 4.0], [0.0, 0, 0]])
    torch.testing.assert_close(out.advantages, expected)
    assert out.data_source == ["db", "db"] and out.group_id == ["g", "g"]


def test_apply_normalizers_rejects_wrong_return_type():
    batch = AdvantageBatch(torch.zeros(1, 2), torch.ones(1, 2), ["t"], ["g"])
    with pytest.raises(TypeError, match="must return an AdvantageBatch"):
        apply_normalizers(batch, [lambda b: b.advantages])


def test_infra_failure_never_scored():
    bad = Trajectory(
        group_id="g", uid="x", task="db", split="train", index=0, input_ids=[1], loss_mask=[1],
        rollout_logprobs=[0.0], versions=[0], turns=[], reward=0.0, training_reward=None,
        status="task error", failure="infra",
    )
    with pytest.raises(ValueError, match="no training reward"):
        compute_advantages([bad], grpo_advantages)


def test_build_advantage_fns_from_config_through_the_registry():
    from agentrl_core.config import AdvantageConfig
    from agentrl_core.hookspecs import hookimpl
    from agentrl_core.testing import register_plugin
    from agentrl_core.types import AdvantageNormalizerSpec

    class Plugin:
        @hookimpl
        def agentrl_advantage_normalizers(self):
            return [AdvantageNormalizerSpec(name="negate", factory=lambda config: lambda b: AdvantageBatch(
                -b.advantages, b.loss_mask, b.data_source, b.group_id))]

    registry = register_plugin(Plugin(), load_entry_points=False)
    estimator, normalizers = build_advantage_fns(AdvantageConfig(estimator="rloo", normalizers=["negate"]), registry)
    trajs = [_traj("0", "g", "db", 1.0, [0, 1]), _traj("1", "g", "db", 0.0, [0, 1])]
    out = compute_advantages(trajs, estimator, normalizers)
    torch.testing.assert_close(out.advantages, torch.tensor([[0.0, -1.0], [0.0, 1.0]]))


def test_train_samples_cut_rows_to_each_trajectory():
    from agentrl_core.train.batching import train_samples

    trajs = [_traj("0", "g", "db", 1.0, [0, 1, 1]), _traj("1", "g", "db", 0.0, [0, 1])]
    out = compute_advantages(trajs, rloo_advantages)
    samples = train_samples(trajs, out.advantages)
    assert [s.advantages for s in samples] == [[0.0, 1.0, 1.0], [0.0, -1.0]]
    assert samples[1].old_logprobs == [0.0, 0.0] and samples[0].group_id == "g"


def test_grpo_negated_is_the_sign_flipped_control():
    # the learning benchmark's control run: group a of test_grpo_hand_computed, negated
    adv = Registry().build("advantage_estimator", "grpo_negated")(REWARDS, GROUPS, MASK)
    hi = (2 / 3) / (1 / math.sqrt(3) + 1e-6)
    lo = (-1 / 3) / (1 / math.sqrt(3) + 1e-6)
    torch.testing.assert_close(adv[0], torch.tensor([0, -hi, -hi, 0]), rtol=0, atol=1e-6)
    torch.testing.assert_close(adv[2], torch.tensor([0, 0, -lo, -lo]), rtol=0, atol=1e-6)
    torch.testing.assert_close(adv, -grpo_advantages(REWARDS, GROUPS, MASK), rtol=0, atol=0)


def test_reward_scale_multiplies_a_tasks_rewards_before_the_estimator():
    # tasks[].reward_scale: calc's rewards x 0.1, db's unchanged. RLOO, groups of two:
    # calc rewards 0.1, 0 -> 0.1 * 2 - 0.05 * 2 = 0.1 and -0.1; db rewards 1, 0 -> 1 and -1
    trajs = [_traj("0", "g1", "calc", 1.0, [0, 1]), _traj("1", "g1", "calc", 0.0, [1, 1]),
             _traj("2", "g2", "db", 1.0, [0, 1]), _traj("3", "g2", "db", 0.0, [0, 1])]
    out = compute_advantages(trajs, rloo_advantages, reward_scales={"calc": 0.1})
    torch.testing.assert_close(out.advantages, torch.tensor([[0.0, 0.1], [-0.1, -0.1], [0.0, 1.0], [0.0, -1.0]]))
    # GRPO divides by the group's std: the scale cancels (up to GRPO's 1e-6 in the divisor)
    grpo = compute_advantages(trajs, grpo_advantages, reward_scales={"calc": 0.1}).advantages
    torch.testing.assert_close(grpo[0], compute_advantages(trajs, grpo_advantages).advantages[0], rtol=1e-4, atol=1e-4)
    # the trajectories themselves keep the environment's reward
    assert [t.training_reward for t in trajs] == [1.0, 0.0, 1.0, 0.0]
