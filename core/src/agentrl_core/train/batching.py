"""Token-budget micro-batching: balance sequences over ranks, pack them under a budget.

A step batch of variable-length sequences is split in two stages:

1. :func:`balance_across_ranks` gives each rank about the same number of tokens (longest
   sequence first to the least-loaded rank);
2. :func:`pack_micro_batches` fills micro-batches first-fit-decreasing under
   ``max_tokens_per_micro_batch``, counted the way the micro-batch is laid out:

   * ``packed``: the sequences are concatenated into one row (position ids restart at
     every sequence, so attention stays inside each sequence); cost = sum of lengths, no
     padding;
   * ``padded``: one row per sequence, right-padded; cost = rows x longest row.

Every rank must run the same number of micro-batches (FSDP's collectives pair up), so
:func:`plan_micro_batches` splits micro-batches on ranks that have fewer and, if a rank
runs out of sequences, gives it empty micro-batches (the learner runs a one-token dummy
forward with no loss). A sequence longer than the budget gets a micro-batch of its own.

:func:`collate` turns one micro-batch into tensors, with the index arithmetic that maps
every loss token to the logit that predicts it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from attrs import define, frozen

Layout = Literal["packed", "padded"]

__all__ = [
    "TrainSample",
    "MicroBatch",
    "MicroBatchPlan",
    "balance_across_ranks",
    "pack_micro_batches",
    "plan_micro_batches",
    "collate",
    "micro_batch_cost",
    "train_samples",
]


@frozen
class TrainSample:
    """One sequence as the learner trains on it; every list has ``len(input_ids)`` entries.

    ``old_logprobs`` are the rollout log-probs (the behaviour policy), ``advantages`` the
    per-token advantages after estimator and normalizers (zero where ``loss_mask`` is 0).
    Position 0 cannot be a loss token: nothing predicts it.
    """

    input_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    advantages: list[float]
    group_id: str = ""

    def __attrs_post_init__(self) -> None:
        n = len(self.input_ids)
        if n == 0:
            raise ValueError(f"train sample of group {self.group_id!r} is empty")
        for name in ("loss_mask", "old_logprobs", "advantages"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"train sample of group {self.group_id!r}: {name} has {len(getattr(self, name))} entries, input_ids {n}")
        if self.loss_mask[0]:
            raise ValueError(f"train sample of group {self.group_id!r}: the first token cannot be a loss token")

    def __len__(self) -> int:
        return len(self.input_ids)


def train_samples(trajectories: Sequence[Any], advantages: Any) -> list[TrainSample]:
    """One :class:`TrainSample` per token sequence; ``advantages`` is the ``[B, L]`` tensor of
    :func:`~agentrl_core.train.advantages.compute_advantages` (row ``i`` for trajectory ``i``).

    A trajectory is one sequence unless its ``sequence_lengths`` cut it into several (a gateway
    session whose calls forked); each becomes its own sample with its slice of the row.
    """
    if len(trajectories) != advantages.shape[0]:
        raise ValueError(f"{len(trajectories)} trajectories but {advantages.shape[0]} advantage rows")
    samples = []
    for i, t in enumerate(trajectories):
        row = advantages[i, : len(t.input_ids)].tolist()
        for start, end in t.sequences():
            samples.append(TrainSample(list(t.input_ids[start:end]), list(t.loss_mask[start:end]),
                                       list(t.rollout_logprobs[start:end]), row[start:end], t.group_id))
    return samples


def micro_batch_cost(lengths: Sequence[int], layout: Layout) -> int:
    """Tokens the forward pass computes for these sequences in this layout."""
    if not lengths:
        return 0
    return sum(lengths) if layout == "packed" else len(lengths) * max(lengths)


def balance_across_ranks(lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """Indices per rank, longest-first to the rank with the fewest tokens so far."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for i in order:
        r = min(range(world_size), key=lambda k: (load[k], len(ranks[k]), k))
        ranks[r].append(i)
        load[r] += lengths[i]
    return ranks


def pack_micro_batches(indices: Sequence[int], lengths: Sequence[int], max_tokens: int, layout: Layout = "packed") -> list[list[int]]:
    """First-fit decreasing of ``indices`` into micro-batches costing at most ``max_tokens``."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens_per_micro_batch must be >= 1, got {max_tokens}")
    if layout not in ("packed", "padded"):
        raise ValueError(f"unknown micro-batch layout {layout!r}; use 'packed' or 'padded'")
    bins: list[list[int]] = []
    for i in sorted(indices, key=lambda i: (-lengths[i], i)):
        for b in bins:
            if micro_batch_cost([lengths[j] for j in b] + [lengths[i]], layout) <= max_tokens:
                b.append(i)
                break
        else:
            bins.append([i])
    return bins


@frozen
class MicroBatchPlan:
    """``micro_batches[rank][k]`` lists the sample indices of rank's k-th micro-batch."""

    micro_batches: list[list[list[int]]]
    layout: Layout
    real_tokens: int
    computed_tokens: int
    max_rank_tokens: int

    @property
    def padding_waste(self) -> float:
        """Share of computed token slots that are padding (0 for ``packed``)."""
        return 1.0 - self.real_tokens / self.computed_tokens if self.computed_tokens else 0.0

    @property
    def num_micro_batches(self) -> int:
        return len(self.micro_batches[0]) if self.micro_batches else 0

    @property
    def rank_imbalance(self) -> float:
        """Most real tokens on one rank over the mean (1.0 = perfectly balanced)."""
        world = len(self.micro_batches)
        return self.max_rank_tokens * world / self.real_tokens if self.real_tokens else 1.0


def _split_largest(bins: list[list[int]], lengths: Sequence[int]) -> bool:
    splittable = [b for b in bins if len(b) > 1]
    if not splittable:
        return False
    b = max(splittable, key=lambda b: sum(lengths[i] for i in b))
    bins.remove(b)
    half_a, half_b, load_a, load_b = [], [], 0, 0
    for i in sorted(b, key=lambda i: (-lengths[i], i)):
        if load_a <= load_b:
            half_a.append(i)
            load_a += lengths[i]
        else:
            half_b.append(i)
            load_b += lengths[i]
    bins.extend([half_a, half_b])
    return True


def plan_micro_batches(
    lengths: Sequence[int], max_tokens: int, world_size: int = 1, layout: Layout = "packed"
) -> MicroBatchPlan:
    """Balance over ranks, pack under the budget, and give every rank the same count."""
    per_rank = [pack_micro_batches(idx, lengths, max_tokens, layout) for idx in balance_across_ranks(lengths, world_size)]
    target = max((len(b) for b in per_rank), default=0)
    for bins in per_rank:
        while len(bins) < target and _split_largest(bins, lengths):
            pass
        bins.sort(key=lambda b: (-sum(lengths[i] for i in b), b))
        bins.extend([] for _ in range(target - len(bins)))
    computed = sum(micro_batch_cost([lengths[i] for i in mb], layout) for bins in per_rank for mb in bins)
    max_rank = max((sum(lengths[i] for mb in bins for i in mb) for bins in per_rank), default=0)
    return MicroBatchPlan(per_rank, layout, int(sum(lengths)), int(computed), int(max_rank))


@define
class MicroBatch:
    """Tensors of one micro-batch.

    ``input_ids``/``position_ids`` are ``[rows, T]`` (one row when packed);
    ``attention_mask`` is ``[rows, T]`` for ``padded`` and ``None`` for ``packed`` (the
    model derives the block-diagonal mask from the restarting position ids). Per-sequence
    tensors (``loss_mask``, ``old_logprobs``, ``advantages``) are ``[B, L]``. The loss
    tokens are listed by ``target_seq``/``target_pos`` (where they live in ``[B, L]``),
    ``target_row``/``target_col`` (the logit that predicts them) and ``target_ids``.
    ``cu_seqlens`` (packed only) are the sequence boundaries in the row, ``[0, n1, n1+n2,
    ...]``, for varlen attention (:mod:`agentrl_core.train.packed_attention`).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    target_seq: torch.Tensor
    target_pos: torch.Tensor
    target_row: torch.Tensor
    target_col: torch.Tensor
    target_ids: torch.Tensor
    num_sequences: int
    real_tokens: int
    cu_seqlens: torch.Tensor | None = None
    max_seqlen: int = 0

    @property
    def computed_tokens(self) -> int:
        return int(self.input_ids.numel())

    def to(self, device: torch.device | str) -> MicroBatch:
        for name in ("input_ids", "position_ids", "attention_mask", "loss_mask", "old_logprobs", "advantages",
                     "target_seq", "target_pos", "target_row", "target_col", "target_ids", "cu_seqlens"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.to(device, non_blocking=True))
        return self


def _pad(rows: Sequence[Sequence[float]], width: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=dtype)
    return out


def collate(samples: Sequence[TrainSample], layout: Layout = "packed", pad_token_id: int = 0) -> MicroBatch:
    """Lay out ``samples`` as one micro-batch; an empty list gives a one-token dummy."""
    if not samples:
        one = torch.full((1, 1), pad_token_id, dtype=torch.long)
        empty_long = torch.zeros(0, dtype=torch.long)
        zeros = torch.zeros(0, 1)
        return MicroBatch(one, torch.zeros_like(one), None, zeros, zeros, zeros, empty_long, empty_long,
                          empty_long, empty_long, empty_long, 0, 0)
    lengths = [len(s) for s in samples]
    width = max(lengths)
    seq, pos, row, col = [], [], [], []
    cu_seqlens = None
    if layout == "packed":
        bounds = [0]
        for n in lengths:
            bounds.append(bounds[-1] + n)
        cu_seqlens = torch.tensor(bounds, dtype=torch.int32)
        input_ids = torch.tensor([[t for s in samples for t in s.input_ids]], dtype=torch.long)
        position_ids = torch.tensor([[p for n in lengths for p in range(n)]], dtype=torch.long)
        attention_mask = None
        offset = 0
        for b, s in enumerate(samples):
            for p, m in enumerate(s.loss_mask):
                if m:
                    seq.append(b), pos.append(p), row.append(0), col.append(offset + p - 1)
            offset += len(s)
    elif layout == "padded":
        input_ids = _pad([s.input_ids for s in samples], width, torch.long)
        for b, n in enumerate(lengths):
            input_ids[b, n:] = pad_token_id
        position_ids = torch.arange(width).expand(len(samples), width).clone()
        attention_mask = _pad([[1] * n for n in lengths], width, torch.long)
        for b, s in enumerate(samples):
            for p, m in enumerate(s.loss_mask):
                if m:
                    seq.append(b), pos.append(p), row.append(b), col.append(p - 1)
    else:
        raise ValueError(f"unknown micro-batch layout {layout!r}; use 'packed' or 'padded'")
    target_seq = torch.tensor(seq, dtype=torch.long)
    target_pos = torch.tensor(pos, dtype=torch.long)
    ids = _pad([s.input_ids for s in samples], width, torch.long)
    return MicroBatch(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=attention_mask,
        loss_mask=_pad([s.loss_mask for s in samples], width, torch.float32),
        old_logprobs=_pad([s.old_logprobs for s in samples], width, torch.float32),
        advantages=_pad([s.advantages for s in samples], width, torch.float32),
        target_seq=target_seq,
        target_pos=target_pos,
        target_row=torch.tensor(row, dtype=torch.long),
        target_col=torch.tensor(col, dtype=torch.long),
        target_ids=ids[target_seq, target_pos],
        num_sequences=len(samples),
        real_tokens=sum(lengths),
        cu_seqlens=cu_seqlens,
        max_seqlen=width,
    )
