"""Served LoRA adapters: PEFT adapter folders loaded next to the base weights, by version.

The learner syncs only its adapter (``model.lora``; core/docs/lora.md): each sync writes a
PEFT folder and loads it on every engine under a new name, ``<name>@v<N>``. The base
weights never change, so a request keeps the adapter it was admitted with until it ends,
and every token it samples carries that adapter's version ``N``; several versions are
loaded at once (the learner unloads the oldest beyond what the staleness bound needs).

The forward adds each adapter's low-rank update to the fused projections of
:class:`~agentrl_core.engine.model.EngineModel`: ``y = W x + scaling * B (A x)``, the
computation of PEFT's ``lora.Linear`` in eval mode. One forward may hold rows of several
adapters (and rows of none): the update is computed per group of rows that share one.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from attrs import frozen

__all__ = ["ADAPTER_MODULES", "Adapter", "AdapterGroups", "load_adapter", "parse_version"]

# the projections of a Qwen2 / Llama / Qwen3 block an adapter may target
ADAPTER_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_KEY = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


def parse_version(name: str) -> int | str:
    """The version of an adapter named ``<name>@v<N>`` (``N`` as an int), else the whole name."""
    _, sep, tail = name.rpartition("@v")
    return int(tail) if sep and tail.isdigit() else name


@frozen
class Adapter:
    """One loaded adapter: per layer, ``{module: (A [r, in], B [out, r] * scaling)}``."""

    name: str
    version: int | str
    path: str
    layers: tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], ...]
    nbytes: int

    def modules(self) -> list[str]:
        return sorted({m for layer in self.layers for m in layer})


def load_adapter(name: str, path: str | Path, *, model: Any) -> Adapter:
    """Read a PEFT LoRA folder (``adapter_config.json`` + ``adapter_model.safetensors``) for ``model``.

    Refused with a clear ``ValueError``: a folder that is not a plain LoRA of this model's
    projections (other modules, DoRA, per-module ranks or alphas, wrong shapes).
    """
    from safetensors.torch import load_file

    folder = Path(path)
    try:
        config = json.loads((folder / "adapter_config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{folder} is not a PEFT adapter folder (adapter_config.json: {exc})") from None
    if config.get("peft_type", "LORA") != "LORA" or config.get("use_dora"):
        raise ValueError(f"{folder}: the hf engine serves plain LoRA adapters, not {config.get('peft_type')}"
                         f"{' with DoRA' if config.get('use_dora') else ''}")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ValueError(f"{folder}: per-module ranks or alphas (rank_pattern, alpha_pattern) are not served")
    rank, alpha = int(config["r"]), float(config["lora_alpha"])
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    weights = folder / "adapter_model.safetensors"
    if not weights.is_file():
        raise ValueError(f"{folder} has no adapter_model.safetensors")
    tensors = load_file(str(weights))
    parts: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.match(key)
        if match is None or match.group(2) not in ADAPTER_MODULES:
            raise ValueError(f"{folder}: tensor {key!r} is not the LoRA of a q/k/v/o/gate/up/down projection; the hf "
                             "engine serves adapters on those only")
        parts.setdefault((int(match.group(1)), match.group(2)), {})[match.group(3)] = tensor
    layers: list[dict[str, tuple[torch.Tensor, torch.Tensor]]] = [{} for _ in model.layers]
    nbytes = 0
    for (index, module), ab in sorted(parts.items()):
        if index >= len(layers) or set(ab) != {"A", "B"}:
            raise ValueError(f"{folder}: layer {index} {module} has {sorted(ab)} of lora_A/lora_B "
                             f"(the model has {len(layers)} layers)")
        owner = model.layers[index].self_attn if module.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) \
            else model.layers[index].mlp
        out_features, in_features = getattr(owner, module).weight.shape
        a, b = ab["A"], ab["B"]
        if a.shape != (rank, in_features) or b.shape != (out_features, rank):
            raise ValueError(f"{folder}: layer {index} {module} has lora_A {tuple(a.shape)} and lora_B "
                             f"{tuple(b.shape)}; this model needs ({rank}, {in_features}) and ({out_features}, {rank})")
        a = a.to(device=model.device, dtype=model.dtype)
        b = (b.float() * scaling).to(device=model.device, dtype=model.dtype)
        layers[index][module] = (a, b)
        nbytes += a.numel() * a.element_size() + b.numel() * b.element_size()
    if not parts:
        raise ValueError(f"{folder}: the adapter holds no tensors")
    return Adapter(name=name, version=parse_version(name), path=str(folder), layers=tuple(layers), nbytes=nbytes)


class AdapterGroups:
    """The rows of one forward grouped by adapter, as token indices into the flat batch."""

    def __init__(self, adapters: Sequence[Adapter | None], lengths: Sequence[int], device: torch.device) -> None:
        by_adapter: dict[int, tuple[Adapter, list[int]]] = {}
        offset = 0
        for adapter, n in zip(adapters, lengths, strict=True):
            if adapter is not None:
                by_adapter.setdefault(id(adapter), (adapter, []))[1].extend(range(offset, offset + n))
            offset += n
        self.groups: list[tuple[Adapter, torch.Tensor | None]] = []
        for adapter, rows in by_adapter.values():
            index = None if len(rows) == offset else torch.as_tensor(rows, dtype=torch.long, device=device)
            self.groups.append((adapter, index))

    def __bool__(self) -> bool:
        return bool(self.groups)

    def add(self, out: torch.Tensor, x: torch.Tensor, layer: int, parts: Sequence[tuple[str, int, int]]) -> None:
        """``out[:, lo:hi] += scaling * B (A x)`` for every ``(module, lo, hi)`` an adapter targets."""
        for adapter, index in self.groups:
            loras = adapter.layers[layer]
            xs = x if index is None else x[index]
            for module, lo, hi in parts:
                if module not in loras:
                    continue
                a, b = loras[module]
                delta = (xs @ a.T) @ b.T
                if index is None:
                    out[:, lo:hi] += delta
                else:
                    out[index, lo:hi] += delta
