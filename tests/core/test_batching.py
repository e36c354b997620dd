"""Token-budget micro-batching: rank balance, budget, equal micro-batch counts, index maps."""

from __future__ import annotations

import random

import pytest

from agentrl_core.train.batching import (
    TrainSample,
    balance_across_ranks,
    collate,
    micro_batch_cost,
    pack_micro_batches,
    plan_micro_batches,
)


def test_balance_longest_first_to_least_loaded():
    # 9 -> r0 (9), 7 -> r1 (7), 5 -> r1 (12), 4 -> r0 (13), 1 -> r1 (13)
    assert balance_across_ranks([5, 9, 1, 7, 4], 2) == [[1, 4], [3, 0, 2]]


def test_packed_budget_first_fit_decreasing():
    lengths = [6, 5, 4, 3, 2]
    bins = pack_micro_batches(range(5), lengths, 10, "packed")
    assert bins == [[0, 2], [1, 3, 4]]  # 6+4, 5+3+2
    assert all(micro_batch_cost([lengths[i] for i in b], "packed") <= 10 for b in bins)


def test_padded_budget_counts_rows_times_longest():
    lengths = [6, 5, 4, 3, 2]
    bins = pack_micro_batches(range(5), lengths, 12, "padded")
    # [6, 5] costs 2 x 6 = 12; [4, 3, 2] costs 3 x 4 = 12
    assert bins == [[0, 1], [2, 3, 4]]
    assert micro_batch_cost([4, 3, 2], "padded") == 12 and micro_batch_cost([4, 3, 2], "packed") == 9


def test_sequence_over_budget_gets_its_own_micro_batch():
    assert pack_micro_batches([0, 1], [50, 3], 10) == [[0], [1]]


def test_every_rank_gets_the_same_number_of_micro_batches():
    rng = random.Random(0)
    for _ in range(50):
        lengths = [rng.randint(1, 40) for _ in range(rng.randint(1, 12))]
        world = rng.choice([1, 2, 3, 4])
        budget = rng.choice([16, 40, 64, 1000])
        for layout in ("packed", "padded"):
            plan = plan_micro_batches(lengths, budget, world, layout)
            counts = {len(r) for r in plan.micro_batches}
            assert len(counts) == 1, (lengths, world, budget)
            flat = sorted(i for r in plan.micro_batches for mb in r for i in mb)
            assert flat == list(range(len(lengths)))  # every sequence exactly once
            for r in plan.micro_batches:
                for mb in r:
                    cost = micro_batch_cost([lengths[i] for i in mb], layout)
                    assert cost <= budget or len(mb) == 1


def test_plan_splits_micro_batches_to_match_counts_and_pads_with_empty_ones():
    # rank 0 gets the 8 (one micro-batch), rank 1 gets 3 + 3 + 2 (one micro-batch under 10)
    plan = plan_micro_batches([8, 3, 3, 2], 10, world_size=2)
    assert [len(r) for r in plan.micro_batches] == [1, 1]
    plan = plan_micro_batches([10, 10, 1, 1], 10, world_size=2)  # r0: [10],[1]; r1: [10],[1]
    assert [len(r) for r in plan.micro_batches] == [2, 2]
    plan = plan_micro_batches([9, 9, 9], 9, world_size=2)  # r0 has two, r1 one: no split possible
    assert plan.micro_batches[1][-1] == []
    plan = plan_micro_batches([4], 100, world_size=2)  # fewer sequences than ranks
    assert plan.micro_batches == [[[0]], [[]]]


def test_padding_waste_and_imbalance():
    packed = plan_micro_batches([6, 2], 100, 1, "packed")
    padded = plan_micro_batches([6, 2], 100, 1, "padded")
    assert packed.padding_waste == 0.0
    assert padded.padding_waste == pytest.approx(1 - 8 / 12)
    assert plan_micro_batches([6, 2], 100, 2).rank_imbalance == pytest.approx(6 * 2 / 8)


def _sample(ids, mask):
    return TrainSample(ids, mask, [-0.5 * m for m in mask], [float(m) for m in mask], "g")


def test_collate_packed_maps_each_loss_token_to_the_logit_before_it():
    a = _sample([10, 11, 12], [0, 1, 1])
    b = _sample([20, 21], [0, 1])
    mb = collate([a, b], "packed")
    assert mb.input_ids.tolist() == [[10, 11, 12, 20, 21]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    assert mb.attention_mask is None
    # token 11 is predicted at flat position 0, 12 at 1, 21 at 3 (not 2: that is 12's logit)
    assert mb.target_col.tolist() == [0, 1, 3]
    assert mb.target_ids.tolist() == [11, 12, 21]
    assert mb.target_seq.tolist() == [0, 0, 1] and mb.target_pos.tolist() == [1, 2, 1]
    assert mb.loss_mask.tolist() == [[0, 1, 1], [0, 1, 0]]
    assert mb.old_logprobs.tolist() == [[0, -0.5, -0.5], [0, -0.5, 0]]


def test_collate_padded_uses_rows_and_attention_mask():
    mb = collate([_sample([10, 11, 12], [0, 1, 1]), _sample([20, 21], [0, 1])], "padded", pad_token_id=99)
    assert mb.input_ids.tolist() == [[10, 11, 12], [20, 21, 99]]
    assert mb.attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert mb.target_row.tolist() == [0, 0, 1] and mb.target_col.tolist() == [0, 1, 0]
    assert mb.computed_tokens == 6 and mb.real_tokens == 5


def test_empty_micro_batch_is_a_one_token_dummy():
    mb = collate([], "packed", pad_token_id=7)
    assert mb.input_ids.tolist() == [[7]] and mb.num_sequences == 0 and mb.target_ids.numel() == 0


def test_first_token_cannot_be_a_loss_token():
    with pytest.raises(ValueError, match="first token"):
        _sample([1, 2], [1, 1])
    with pytest.raises(ValueError, match="loss_mask has 1 entries"):
        TrainSample([1, 2], [0], [0.0, 0.0], [0.0, 0.0])
