"""Per-token log-probs (and entropy) of a micro-batch under a causal LM.

Token ``p`` of a sequence is predicted by the logit at position ``p - 1``. Only the
loss tokens need a log-prob, so the LM head runs only at the positions that predict one
(``logits_to_keep``); with a 150k vocabulary that is most of the forward's memory. Logits
are divided by the sampling temperature, for the actor and for the reference alike, so the
log-probs match the ones the engine returned.
"""

from __future__ import annotations

import torch
from attrs import frozen

from agentrl_core.train.batching import MicroBatch

__all__ = ["TokenLogprobs", "token_logprobs", "logprobs_from_logits", "entropy_from_logits"]


@frozen
class TokenLogprobs:
    """``logprobs`` and ``entropy`` are ``[B, L]`` (zero off the loss tokens).

    ``anchor`` is a zero that depends on the model's output: adding it to the loss keeps
    every parameter in the autograd graph even for a micro-batch without loss tokens, so
    FSDP's gradient collectives run on every rank.
    """

    logprobs: torch.Tensor
    entropy: torch.Tensor | None
    anchor: torch.Tensor


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)[labels]`` along the last dimension, in float32."""
    logits = logits.float()
    return logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` along the last dimension, in float32."""
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)


def token_logprobs(
    model: torch.nn.Module,
    mb: MicroBatch,
    temperature: float = 1.0,
    *,
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> TokenLogprobs:
    """Forward ``mb`` through ``model`` and return the loss tokens' log-probs as ``[B, L]``.

    ``with_entropy`` adds the per-token entropy; it is detached (a metric only, no extra
    autograd memory) unless ``entropy_grad`` (an entropy term in the loss).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if mb.target_col.numel():
        cols, slot = torch.unique(mb.target_col, return_inverse=True)
    else:
        cols, slot = torch.zeros(1, dtype=torch.long, device=mb.input_ids.device), mb.target_col
    varlen = {}
    if mb.cu_seqlens is not None:  # flash-attention's varlen arguments (packed_attention reads them too)
        varlen = dict(cu_seq_lens_q=mb.cu_seqlens, cu_seq_lens_k=mb.cu_seqlens,
                      max_length_q=mb.max_seqlen, max_length_k=mb.max_seqlen)
    out = model(
        input_ids=mb.input_ids,
        position_ids=mb.position_ids,
        attention_mask=mb.attention_mask,
        use_cache=False,
        logits_to_keep=cols,
        **varlen,
    )
    kept = out.logits  # [rows, len(cols), V]
    logits = kept[mb.target_row, slot].float() / temperature  # [N, V]
    shape = (mb.num_sequences, mb.loss_mask.shape[-1])
    index = (mb.target_seq, mb.target_pos)
    logp = torch.zeros(shape, dtype=torch.float32, device=logits.device).index_put(
        index, logprobs_from_logits(logits, mb.target_ids)
    )
    entropy = None
    if with_entropy:
        entropy = torch.zeros(shape, dtype=torch.float32, device=logits.device).index_put(
            index, entropy_from_logits(logits if entropy_grad else logits.detach())
        )
    return TokenLogprobs(logp, entropy, kept.sum() * 0.0)
