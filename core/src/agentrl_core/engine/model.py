"""The engine's model: the Hugging Face weights run by a lean forward with a slot KV cache.

``transformers`` generate keeps one cache per call; continuous batching needs requests of
different lengths to share every forward pass and to join and leave at any step. So the
engine keeps the HF module (its weights, norms, projections, rotary embedding: exactly
what the learner trains and what weight updates overwrite) and runs its own attention:

* the KV cache is ``[layers, slots, kv_heads, capacity, head_dim]``; a request owns one
  slot; ``capacity`` grows by doubling up to ``max_context`` as requests get longer;
* :meth:`EngineModel.extend` runs one forward over a batch of slots, each with its own
  start position and number of new tokens (a prefill is an extend from 0, a decoding step
  an extend by one token, and one forward may mix both), and returns the logits of each
  row's last new token; the new tokens of all rows go through the matmuls as one flat
  batch, without padding;
* attention masks every key past the query's position, so stale cache entries beyond a
  slot's length are never read.

The result equals the plain ``transformers`` forward pass within float rounding (tested
to 1e-4 in log-probs, fp32 on CPU). Supported architectures: Qwen2 (Qwen2.5), Llama and
Qwen3 (the same block with q/k norms); anything else is refused with a clear error.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from agentrl_core.engine.lora import Adapter, AdapterGroups

log = logging.getLogger(__name__)

# The attention kernels the engine lets scaled_dot_product_attention choose from: all but
# cuDNN's. cuDNN builds a graph per shape, and a decoding step's key length grows by one at
# every step: on an H200 a step of the small tiny model took 60 ms with it and 7 ms without
# (benchmarks/gpu/check.py's engine_throughput, 2026-12-04).
ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

SUPPORTED_MODEL_TYPES = ("qwen2", "llama", "qwen3")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class UnsupportedModelError(ValueError):
    pass


def load_hf_model(path: str | Path, *, dtype: str = "auto", device: str = "cpu") -> Any:
    """``AutoModelForCausalLM.from_pretrained`` in eval mode; ``auto`` keeps the checkpoint's dtype."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"the hf engine runs {', '.join(SUPPORTED_MODEL_TYPES)} models; {path} is a {config.model_type!r} model "
            "(use the sglang driver for other architectures)"
        )
    if any(t != "full_attention" for t in (getattr(config, "layer_types", None) or [])):
        raise UnsupportedModelError(f"{path} uses sliding-window attention, which the hf engine does not implement")
    kwargs: dict[str, Any] = {"dtype": "auto" if dtype == "auto" else DTYPES[dtype]}
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model


class EngineModel:
    """The forward pass and KV cache of one engine (used only from the scheduler thread)."""

    def __init__(self, hf_model: Any, *, max_slots: int, max_context: int | None = None,
                 initial_capacity: int = 256) -> None:
        self.hf = hf_model
        config = hf_model.config
        self.config = config
        self.device = next(hf_model.parameters()).device
        self.dtype = next(hf_model.parameters()).dtype
        self.layers = list(hf_model.model.layers)
        self.embed = hf_model.model.embed_tokens
        self.norm = hf_model.model.norm
        self.rotary = hf_model.model.rotary_emb
        self.lm_head = hf_model.lm_head
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.scaling = self.layers[0].self_attn.scaling
        self.has_qk_norm = hasattr(self.layers[0].self_attn, "q_norm")
        self.vocab_size = config.vocab_size
        self.max_context = int(max_context or config.max_position_embeddings)
        self.max_slots = max_slots
        self.capacity = 0
        self.k_cache = self.v_cache = torch.empty(0)
        self.cos_table = self.sin_table = torch.empty(0)
        rope_type = str(getattr(self.rotary, "rope_type", "default"))
        self._static_rope = "dynamic" not in rope_type and rope_type != "longrope"
        self.blocks = [_fuse_block(layer, self.has_qk_norm) for layer in self.layers]
        self._grow(min(initial_capacity, self.max_context))

    # ------------------------------------------------------------------------------
    # KV cache

    def cache_bytes(self, capacity: int | None = None) -> int:
        capacity = self.capacity if capacity is None else capacity
        per = len(self.layers) * self.max_slots * self.num_kv_heads * capacity * self.head_dim
        return 2 * per * torch.finfo(self.dtype).bits // 8

    @torch.inference_mode()  # the cache is an inference tensor wherever it is (re)allocated
    def _grow(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        if needed > self.max_context:
            raise ValueError(f"a sequence of {needed} tokens exceeds the engine's max_context of {self.max_context}")
        capacity = min(self.max_context, max(needed, 2 * self.capacity, 64))
        shape = (len(self.layers), self.max_slots, self.num_kv_heads, capacity, self.head_dim)
        k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        v = torch.zeros(shape, dtype=self.dtype, device=self.device)
        if self.capacity:
            k[..., : self.capacity, :] = self.k_cache
            v[..., : self.capacity, :] = self.v_cache
        self.k_cache, self.v_cache, self.capacity = k, v, capacity
        if self._static_rope:  # cos/sin of every position once: the same numbers the module computes
            positions = torch.arange(capacity, device=self.device)[None, :]
            cos, sin = self.rotary(torch.empty(0, dtype=self.dtype, device=self.device), positions)
            self.cos_table, self.sin_table = cos[0], sin[0]
        log.debug("KV cache grown to %d positions per slot (%.1f MiB)", capacity, self.cache_bytes() / 2**20)

    def release_kv_cache(self) -> int:
        """Free the KV cache (every slot's positions are lost); returns the bytes freed."""
        freed = self.cache_bytes()
        self.k_cache = self.v_cache = torch.empty(0)
        self.cos_table = self.sin_table = torch.empty(0)
        self.capacity = 0
        _empty_device_cache(self.device)
        return freed

    def resume_kv_cache(self, initial_capacity: int = 256) -> None:
        """Allocate the KV cache again (it grows with the requests, as at start)."""
        self._grow(min(initial_capacity, self.max_context))

    def _weight_storages(self) -> list[torch.UntypedStorage]:
        """The distinct storages behind every parameter and fused tensor (views share one)."""
        tensors = [p for p in self.hf.parameters()]
        for block in self.blocks:
            tensors += [t for t in (block.qkv_w, block.qkv_b, block.gate_up_w) if t is not None]
        storages: dict[int, torch.UntypedStorage] = {}
        for t in tensors:
            storage = t.untyped_storage()
            if storage.nbytes():
                storages.setdefault(storage.data_ptr(), storage)
        return list(storages.values())

    def release_weights(self) -> int:
        """Offload the weights to host memory and free them on the device; returns the bytes freed.

        Every storage is emptied in place (``resize_(0)``), so the parameters, the fused views
        and the tied head keep pointing at the same storages, refilled by :meth:`resume_weights`
        with the same values (SGLang's release, by contrast, drops them: its resumed weights
        wait for a weight update). On CPU nothing would be gained: the weights stay.
        """
        if self.device.type == "cpu" or getattr(self, "_offloaded", None):
            return 0
        storages = self._weight_storages()
        if not all(storage.resizable() for storage in storages):  # e.g. memory-mapped from a file
            log.warning("the engine's weights are not in allocator memory and cannot be released; they stay")
            return 0
        offloaded = []
        for storage in storages:
            host = torch.UntypedStorage(storage.nbytes(), device="cpu")
            host.copy_(storage)
            offloaded.append((storage, host))
        for storage, _ in offloaded:
            storage.resize_(0)
        self._offloaded = offloaded
        _empty_device_cache(self.device)
        return sum(host.nbytes() for _, host in offloaded)

    def resume_weights(self) -> None:
        for storage, host in getattr(self, "_offloaded", None) or []:
            storage.resize_(host.nbytes())
            storage.copy_(host)
        self._offloaded = None

    @torch.inference_mode()
    def swap_slots(self, a: int, b: int, length: int) -> None:
        """Exchange the first ``length`` cached positions of slots ``a`` and ``b``."""
        length = min(length, self.capacity)
        for cache in (self.k_cache, self.v_cache):
            held = cache[:, a, :, :length].clone()
            cache[:, a, :, :length] = cache[:, b, :, :length]
            cache[:, b, :, :length] = held

    # ------------------------------------------------------------------------------
    # Forward

    @torch.inference_mode()
    def extend(self, slots: Sequence[int], tokens: Sequence[Sequence[int]], starts: Sequence[int],
               adapters: Sequence[Adapter | None] | None = None) -> torch.Tensor:
        """Append ``tokens[i]`` to slot ``slots[i]`` at position ``starts[i]``; fp32 logits ``[B, V]``.

        ``adapters[i]``: the LoRA adapter row ``i`` runs with (None: the base weights;
        :mod:`agentrl_core.engine.lora`).

        Slot ``slots[i]`` must hold valid keys/values for positions ``[0, starts[i])``.
        The logits are those of each row's last new token. Rows may mix one-token decoding
        steps and multi-token prefills: the new tokens of all rows run as one flat batch
        through every matmul (no padding); attention is batched over the one-token rows and
        done per row for the others.
        """
        dev = self.device
        lengths = [len(t) for t in tokens]
        self._grow(max(s + n for s, n in zip(starts, lengths, strict=True)))
        flat = [t for row in tokens for t in row]
        positions = [s + j for s, n in zip(starts, lengths, strict=True) for j in range(n)]
        row_slots = [slot for slot, n in zip(slots, lengths, strict=True) for _ in range(n)]
        offsets = [0]
        for n in lengths:
            offsets.append(offsets[-1] + n)
        ids = torch.as_tensor(flat, dtype=torch.long, device=dev)
        pos_t = torch.as_tensor(positions, dtype=torch.long, device=dev)
        slot_t = torch.as_tensor(row_slots, dtype=torch.long, device=dev)
        single = [i for i, n in enumerate(lengths) if n == 1]
        multi = [i for i, n in enumerate(lengths) if n > 1]
        if single:  # one-token rows: one batched attention over their slots
            single_tok = torch.as_tensor([offsets[i] for i in single], device=dev)
            single_slots = [slots[i] for i in single]
            single_total = max(starts[i] + 1 for i in single)
            key_pos = torch.arange(single_total, device=dev)
            single_mask = (key_pos[None, :] <= pos_t[single_tok][:, None])[:, None, None, :]  # [b, 1, 1, T]
            block = single_slots == list(range(single_slots[0], single_slots[0] + len(single)))
            single_slot_t = torch.as_tensor(single_slots, device=dev)
        multi_masks = {}
        for i in multi:
            key_pos = torch.arange(starts[i] + lengths[i], device=dev)
            multi_masks[i] = (key_pos[None, :] <= pos_t[offsets[i] : offsets[i + 1]][:, None])[None, None]

        hidden = F.embedding(ids, self.embed.weight)  # [S, H]
        if self._static_rope:
            cos, sin = self.cos_table[pos_t], self.sin_table[pos_t]
        else:
            cos, sin = (c[0] for c in self.rotary(hidden[None], pos_t[None]))
        cos, sin = cos[:, None, :], sin[:, None, :]  # [S, 1, D]
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        gqa = self.num_kv_heads != self.num_heads
        size = len(flat)
        lora = AdapterGroups(adapters, lengths, dev) if adapters else None  # none: the base weights alone
        intermediate = self.blocks[0].down_w.shape[1]
        qkv_parts = (("q_proj", 0, q_size), ("k_proj", q_size, q_size + kv_size),
                     ("v_proj", q_size + kv_size, q_size + 2 * kv_size))
        with sdpa_kernel(ATTENTION_BACKENDS):
            for index, blk in enumerate(self.blocks):
                x = _rms_norm(hidden, blk.ln1, blk.eps)
                qkv = F.linear(x, blk.qkv_w, blk.qkv_b)
                if lora:
                    lora.add(qkv, x, index, qkv_parts)
                q = qkv[:, :q_size].view(size, self.num_heads, self.head_dim)
                k = qkv[:, q_size : q_size + kv_size].view(size, self.num_kv_heads, self.head_dim)
                v = qkv[:, q_size + kv_size :].view(size, self.num_kv_heads, self.head_dim)
                if blk.q_norm is not None:
                    q, k = blk.q_norm(q), blk.k_norm(k)
                q = q * cos + _rotate_half(q) * sin
                k = k * cos + _rotate_half(k) * sin
                k_layer, v_layer = self.k_cache[index], self.v_cache[index]  # [slots, H, T, D]
                # advanced indices (slot, position) around a slice: the value is [S, H, D]
                k_layer[slot_t, :, pos_t] = k
                v_layer[slot_t, :, pos_t] = v
                out = torch.empty(size, self.num_heads, self.head_dim, dtype=q.dtype, device=dev)
                if single:
                    if block:
                        lo = single_slots[0]
                        keys = k_layer[lo : lo + len(single), :, :single_total]
                        values = v_layer[lo : lo + len(single), :, :single_total]
                    else:
                        keys = k_layer[single_slot_t, :, :single_total]
                        values = v_layer[single_slot_t, :, :single_total]
                    attended = F.scaled_dot_product_attention(q[single_tok][:, :, None, :], keys, values,
                                                              attn_mask=single_mask, scale=self.scaling, enable_gqa=gqa)
                    out[single_tok] = attended[:, :, 0, :]
                for i in multi:
                    a, b, total = offsets[i], offsets[i + 1], starts[i] + lengths[i]
                    keys = k_layer[slots[i], :, :total][None]
                    values = v_layer[slots[i], :, :total][None]
                    attended = F.scaled_dot_product_attention(q[a:b].transpose(0, 1)[None], keys, values,
                                                              attn_mask=multi_masks[i], scale=self.scaling,
                                                              enable_gqa=gqa)
                    out[a:b] = attended[0].transpose(0, 1)
                attended_flat = out.view(size, q_size)
                projected = F.linear(attended_flat, blk.o_w, blk.o_b)
                if lora:
                    lora.add(projected, attended_flat, index, (("o_proj", 0, projected.shape[1]),))
                hidden = hidden + projected
                x = _rms_norm(hidden, blk.ln2, blk.eps)
                gate_up = F.linear(x, blk.gate_up_w)
                if lora:
                    lora.add(gate_up, x, index, (("gate_proj", 0, intermediate), ("up_proj", intermediate,
                                                                                   2 * intermediate)))
                gate, up = gate_up.chunk(2, dim=-1)
                x = blk.act(gate) * up
                down = F.linear(x, blk.down_w)
                if lora:
                    lora.add(down, x, index, (("down_proj", 0, down.shape[1]),))
                hidden = hidden + down
        last = torch.as_tensor([offsets[i + 1] - 1 for i in range(len(lengths))], device=dev)
        hidden = _rms_norm(hidden[last], self.norm.weight, self.norm.variance_epsilon)
        return F.linear(hidden, self.lm_head.weight).float()

    # ------------------------------------------------------------------------------
    # Weights

    def parameter_table(self) -> dict[str, torch.Tensor]:
        """Every name a weight update may use -> the parameter it writes (tied names share one)."""
        table = dict(self.hf.named_parameters(remove_duplicate=False))
        if getattr(self.config, "tie_word_embeddings", False):
            table.setdefault("lm_head.weight", self.hf.model.embed_tokens.weight)
        return table

    def required_names(self) -> set[str]:
        """One name per distinct parameter: a full update must write each of them."""
        return {name for name, _ in self.hf.named_parameters()}

    @torch.inference_mode()
    def load_tensors(self, named: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
        """Copy tensors into the parameters of the same name; returns the names written."""
        table = self.parameter_table()
        written = []
        for name, tensor in named:
            param = table[name]
            param.copy_(tensor.to(device=param.device, dtype=param.dtype))
            written.append(name)
        return written


class _Block:
    """One decoder layer's tensors for the functional forward (views of the HF parameters)."""

    __slots__ = ("qkv_w", "qkv_b", "o_w", "o_b", "gate_up_w", "down_w", "ln1", "ln2", "eps", "act", "q_norm",
                 "k_norm")


def _fuse_block(layer: Any, qk_norm: bool) -> _Block:
    """Fuse q/k/v and gate/up into single weights, re-pointing the HF parameters at views of them.

    Parameters keep their names and shapes (weight updates and ``named_parameters`` see no
    difference), the fused tensors share their memory, and one matmul replaces three (two).
    """
    attn, mlp = layer.self_attn, layer.mlp
    if type(mlp.act_fn).__name__ not in ("SiLUActivation", "SiLU"):
        raise UnsupportedModelError(f"the hf engine implements SiLU MLPs, not {type(mlp.act_fn).__name__}")
    block = _Block()
    block.qkv_w = _fuse([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    biases = [attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]
    block.qkv_b = _fuse(biases) if all(b is not None for b in biases) else None
    block.o_w, block.o_b = attn.o_proj.weight, attn.o_proj.bias
    block.gate_up_w = _fuse([mlp.gate_proj.weight, mlp.up_proj.weight])
    block.down_w = mlp.down_proj.weight
    block.ln1, block.ln2 = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
    block.eps = layer.input_layernorm.variance_epsilon
    block.act = F.silu
    block.q_norm = attn.q_norm if qk_norm else None
    block.k_norm = attn.k_norm if qk_norm else None
    return block


def _fuse(params: list[torch.nn.Parameter]) -> torch.Tensor:
    fused = torch.cat([p.detach() for p in params], dim=0)
    offset = 0
    for p in params:
        n = p.shape[0]
        p.data = fused[offset : offset + n]
        offset += n
    return fused


def _empty_device_cache(device: torch.device) -> None:
    """Hand freed blocks back to the driver, so another process on the GPU can use them."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen2RMSNorm / LlamaRMSNorm: fp32 statistics, the weight applied in the input dtype."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
