"""Bit-exact weight checks: sha256 of every tensor, in Hugging Face names, on both sides.

vLLM fuses parameters (``q_proj``/``k_proj``/``v_proj`` -> ``qkv_proj``, ``gate_proj``/``up_proj``
-> ``gate_up_proj``); :func:`hf_layout` cuts them back along the model's
``packed_modules_mapping`` and each fused layer's ``output_sizes``, so the engine's digests
name the same tensors as the learner's. The sender's side is :func:`tensor_digest` of each
tensor it sent, cast to the engine's dtype (vLLM's loader casts the same way); :func:`compare`
lists every difference.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

TIED_ALIASES = {"lm_head.weight": "model.embed_tokens.weight"}  # a tied head is the embedding


def tensor_digest(tensor: Any) -> str:
    import torch

    data = tensor.detach().to("cpu").contiguous().reshape(-1)
    return hashlib.sha256(data.view(torch.uint8).numpy()).hexdigest()


def hf_layout(model: Any, tp_size: int = 1) -> Iterator[tuple[str, Any]]:
    """A vLLM model's parameters as Hugging Face tensors (fused ones cut apart); TP size 1 only."""
    if tp_size != 1:
        raise ValueError("weight digests in Hugging Face names need tensor_parallel_size 1")
    packed = dict(getattr(model, "packed_modules_mapping", None) or {})
    for name, param in model.named_parameters():
        module_name, _, param_name = name.rpartition(".")
        param = _readable(model, module_name, param_name, param)
        parent, _, leaf = module_name.rpartition(".")
        parts = packed.get(leaf)
        if not parts:
            yield name, param
            continue
        sizes = list(getattr(model.get_submodule(module_name), "output_sizes", None) or [])
        if len(sizes) != len(parts) or sum(sizes) != param.shape[0]:
            raise ValueError(f"cannot split the fused parameter {name} {tuple(param.shape)} into {parts} "
                             f"(output sizes {sizes})")
        for part, piece in zip(parts, param.split(sizes, dim=0)):
            yield f"{parent}.{part}.{param_name}" if parent else f"{part}.{param_name}", piece
    head = _tied_head_kernel(model)
    if head is not None:
        yield "lm_head.weight", head


def _tied_head_kernel(model: Any) -> Any:
    """The output head on vLLM's CPU backend multiplies with its own kernel's copy of its
    weight (for a tied head: of the embedding); read that copy back (as in :func:`_readable`)
    so that a stale one is caught."""
    import torch

    head = getattr(model, "lm_head", None)
    kernel = getattr(head, "cpu_linear", None)
    weight = getattr(head, "weight", None)
    if kernel is None or weight is None or weight.ndim != 2 or not weight.numel():
        return None
    rows = getattr(head, "num_embeddings", weight.shape[0])
    with torch.no_grad():
        return kernel(torch.eye(weight.shape[1], dtype=weight.dtype), weight, None).t()[:rows].contiguous()


def _readable(model: Any, module_name: str, param_name: str, param: Any) -> Any:
    """The values of ``param`` in the checkpoint's shape: an embedding without vLLM's vocabulary
    padding; a linear weight that vLLM's CPU backend moved into its GEMM kernel (oneDNN or
    packed, leaving an empty parameter) read back through that kernel.

    ``layer.cpu_linear(I, ...)`` with the identity as input and no bias computes ``I @ W.T``:
    every output element is one weight times 1.0 plus exact zeros, so the result is W bit for
    bit, as the kernel holds it.
    """
    if param_name != "weight":
        return param
    import torch

    module = model.get_submodule(module_name)
    rows = getattr(module, "num_embeddings", None)  # vLLM pads the vocabulary (TP size 1: no added rows)
    if rows is not None and param.ndim == 2 and param.shape[0] > rows:
        return param[:rows]
    if param.numel():
        return param
    kernel = getattr(module, "cpu_linear", None)
    size = getattr(module, "input_size_per_partition", None)
    if kernel is None or size is None:
        return param
    with torch.no_grad():
        return kernel(torch.eye(size, dtype=param.dtype), param, None).t().contiguous()


def engine_digests(model: Any, tp_size: int = 1) -> dict[str, dict[str, str]]:
    """``{hf name: {"sha256": ..., "dtype": "float32"}}`` of a vLLM model."""
    return {name: {"sha256": tensor_digest(t), "dtype": str(t.dtype).removeprefix("torch.")}
            for name, t in hf_layout(model, tp_size)}


def sent_digests(sent: Iterable[tuple[str, Any]], engine: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """Digests of the tensors sent, each cast to the dtype the engine holds it in (None: no such tensor)."""
    import torch

    out: dict[str, str] = {}
    for name, tensor in sent:
        entry = engine.get(name if name in engine else TIED_ALIASES.get(name, name))
        out[name] = tensor_digest(tensor.to(getattr(torch, entry["dtype"]))) if entry else ""
    return out


def compare(sent: Iterable[tuple[str, Any]], engine: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Differences between the tensors sent and the engine's digests; empty when bit-identical."""
    return compare_digests(sent_digests(sent, engine), engine)


def compare_digests(sent: Mapping[str, str], engine: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Every engine tensor must have been sent (a tied ``lm_head.weight`` counts for the
    embedding and is checked against it); a sent tensor the engine does not hold is a
    difference too."""
    problems: list[str] = []
    seen: set[str] = set()
    for name, digest in sent.items():
        target = name if name in engine else TIED_ALIASES.get(name, name)
        entry = engine.get(target)
        if entry is None:
            problems.append(f"{name}: sent, but the engine has no such tensor")
            continue
        seen.add(target)
        if digest != entry["sha256"]:
            problems.append(f"{name}: the engine's {entry['dtype']} values differ from the ones sent")
    for name, entry in engine.items():
        if name in seen:
            continue
        covered_by = TIED_ALIASES.get(name)  # the tied head's kernel copy against the embedding sent
        if covered_by in sent and name not in sent and covered_by in engine:
            if entry["sha256"] != engine[covered_by]["sha256"]:
                problems.append(f"{name}: the output head's kernel still holds old values (the embedding changed)")
            continue
        problems.append(f"{name}: not sent, the engine kept its old values")
    return problems
