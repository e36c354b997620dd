"""Attention over packed sequences without a ``T x T`` mask: one causal SDPA per sequence.

A packed micro-batch is one row of several sequences. Given only restarting position ids,
transformers builds a block-diagonal ``T x T`` mask and SDPA computes every block, so a
4096-token row of 600-token sequences costs the attention of one 4096-token sequence
(7x the FLOPs) and cannot use the fused causal kernels. With ``cu_seq_lens_q`` (the
flash-attention varlen arguments, which transformers passes down to the attention function)
this implementation runs causal SDPA on each sequence's slice instead: the cost of the
sequences themselves. On CUDA with ``flash-attn`` installed, ``flash_attention_2`` reads the
same arguments natively and is preferred.

Importing this module registers the implementation as ``agentrl_packed``. It is not in
transformers' mask registry, so no mask is built for it; without ``cu_seq_lens_q`` it
treats the row as one causal sequence.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

NAME = "agentrl_packed"

__all__ = ["NAME", "packed_attention_forward", "attention_implementation"]


def packed_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``[B, heads, T, d]`` in, ``[B, T, heads, d]`` out, causal within each packed sequence."""
    if query.shape[0] != 1 and kwargs.get("cu_seq_lens_q") is not None:
        raise ValueError("packed attention expects one row of packed sequences")
    sdpa = dict(dropout_p=dropout if module.training else 0.0, is_causal=True, scale=scaling,
                enable_gqa=getattr(module, "num_key_value_groups", 1) > 1)
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        out = F.scaled_dot_product_attention(query, key, value, **sdpa)
    else:
        bounds = cu.tolist() if isinstance(cu, torch.Tensor) else list(cu)
        sizes = [e - s for s, e in zip(bounds[:-1], bounds[1:], strict=True)]
        if bounds[-1] < query.shape[2]:  # trailing positions outside every sequence
            sizes.append(query.shape[2] - bounds[-1])
        # split, not slicing: the backward of a split is one cat, while every slice's backward
        # would fill a zero tensor of the whole row
        parts = zip(query.split(sizes, dim=2), key.split(sizes, dim=2), value.split(sizes, dim=2), strict=True)
        out = torch.cat([F.scaled_dot_product_attention(q, k, v, **sdpa) for q, k, v in parts], dim=2)
    return out.transpose(1, 2).contiguous(), None


def attention_implementation(device: torch.device, layout: str) -> str:
    """The attention implementation a learner uses for ``layout`` on ``device``."""
    if layout != "packed":
        return "sdpa"
    if device.type == "cuda":
        try:
            import flash_attn  # noqa: F401

            return "flash_attention_2"
        except ImportError:
            pass
    return NAME


AttentionInterface.register(NAME, packed_attention_forward)
