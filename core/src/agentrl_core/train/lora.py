"""LoRA: low-rank adapters trained in place of the full weights (``model.lora``).

The learner injects PEFT's LoRA layers into the Hugging Face model before sharding it
(:func:`apply_lora`): every targeted ``nn.Linear`` becomes ``base_layer`` (frozen) plus
``lora_A`` / ``lora_B`` (trained), so the optimizer holds adapter-sized state and the model's
forward is unchanged in shape. The reference policy is the same model with the adapters
switched off (:func:`adapters_disabled`): no second copy of the weights.

Weights leave the learner in two forms:

* merged (:func:`merged_full_tensors`): ``W + scaling * B @ A`` under the Hugging Face names,
  for engines that load full weights and for the exported ``final_model``;
* adapter only (:func:`adapter_full_tensors`, :func:`write_adapter`): PEFT's own file layout
  (``adapter_config.json`` + ``adapter_model.safetensors``), which ``peft.PeftModel`` and the
  engines' LoRA loaders read.

Every rank must iterate the generators to the end (FSDP gathers are collectives).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.tensor import DTensor

if TYPE_CHECKING:
    from agentrl_core.config import LoraConfig

__all__ = [
    "ADAPTER_NAME",
    "adapter_full_tensors",
    "adapters_disabled",
    "apply_lora",
    "lora_layers",
    "merged_full_tensors",
    "trainable_parameter_count",
    "write_adapter",
]

ADAPTER_NAME = "default"  # PEFT's adapter name inside the learner's model


def _peft() -> Any:
    try:
        import peft
    except ImportError as e:  # pragma: no cover - the extra is part of the test environments
        raise ImportError("model.lora needs PEFT: pip install 'agentrl-core[lora]'") from e
    return peft


def peft_config(config: LoraConfig) -> Any:
    """PEFT's ``LoraConfig`` for ``model.lora``."""
    peft = _peft()
    targets: Any = list(config.target_modules)
    if targets == ["all-linear"]:
        targets = "all-linear"
    return peft.LoraConfig(r=config.rank, lora_alpha=config.alpha, lora_dropout=config.dropout,
                           target_modules=targets, bias="none", use_rslora=config.rslora,
                           task_type="CAUSAL_LM")


def apply_lora(model: torch.nn.Module, config: LoraConfig) -> torch.nn.Module:
    """Inject LoRA layers into ``model`` in place and freeze everything else; returns ``model``.

    ``lora_B`` starts at zero (PEFT's initialisation), so the adapted model computes exactly
    what the base model does until the first update.
    """
    peft = _peft()
    refusal = (f"model.lora.target_modules {list(config.target_modules)} matched no layer of {type(model).__name__}; "
               "name its linear layers (e.g. q_proj, v_proj) or use [all-linear]")
    try:
        peft.inject_adapter_in_model(peft_config(config), model, adapter_name=ADAPTER_NAME)
    except ValueError as e:
        if "not found" in str(e):
            raise ValueError(refusal) from None
        raise
    if not lora_layers(model):
        raise ValueError(refusal)
    for name, param in model.named_parameters():
        param.requires_grad_(".lora_" in name)
    return model


def lora_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The LoRA-wrapped layers of ``model`` by module name."""
    peft = _peft()
    return {name: m for name, m in model.named_modules() if isinstance(m, peft.tuners.lora.LoraLayer)}


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """Run ``model`` as its base model (the reference policy) inside the block."""
    # PEFT's enable_adapters(False) also sets requires_grad=False on the adapter, which FSDP2 has
    # grouped as trainable; the flag its forward reads is switched alone instead
    layers = list(lora_layers(model).values())
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer in layers:
            layer._disable_adapters = False


def trainable_parameter_count(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts (global sizes, not this rank's shards)."""
    trainable = total = 0
    for p in model.parameters():
        n = p.numel()  # a DTensor's numel is its global size
        total += n
        trainable += n if p.requires_grad else 0
    return trainable, total


def _full(param: torch.Tensor) -> torch.Tensor:
    tensor = param.detach()
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _split(name: str, prefixes: dict[str, Any]) -> tuple[str, str] | None:
    """``(layer prefix, rest)`` when parameter ``name`` belongs to a LoRA layer."""
    head, _, _ = name.rpartition(".base_layer.")
    if head and head in prefixes:
        return head, name[len(head) + 1:]
    for marker in (".lora_A.", ".lora_B."):
        head, _, _ = name.partition(marker)
        if head != name and head in prefixes:
            return head, name[len(head) + 1:]
    return None


def merged_full_tensors(model: torch.nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Full parameters under the base model's Hugging Face names, each LoRA layer merged.

    A LoRA layer's ``base_layer.weight`` (W), ``lora_A`` (A, r x in) and ``lora_B`` (B, out x r)
    become one ``weight = W + scaling * B @ A`` (computed in fp32); its bias passes through.
    Gathers parameter by parameter, in ``named_parameters`` order, so every rank must iterate.
    """
    layers = lora_layers(model)
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, param in model.named_parameters():
        split = _split(name, layers)
        if split is None:
            tensor = _full(param)
            yield name, tensor.to(dtype) if dtype is not None else tensor
            continue
        prefix, rest = split
        parts = pending.setdefault(prefix, {})
        parts[rest] = _full(param)
        if rest == "base_layer.bias":
            bias = parts.pop(rest)
            yield f"{prefix}.bias", bias.to(dtype) if dtype is not None else bias
        a, b = f"lora_A.{ADAPTER_NAME}.weight", f"lora_B.{ADAPTER_NAME}.weight"
        if {"base_layer.weight", a, b} <= parts.keys():
            layer = layers[prefix]
            w = parts["base_layer.weight"].float() + layer.scaling[ADAPTER_NAME] * (parts[b].float() @ parts[a].float())
            del pending[prefix]
            yield f"{prefix}.weight", w.to(dtype if dtype is not None else parts["base_layer.weight"].dtype)
    if pending:
        raise RuntimeError(f"LoRA layers without all their parameters: {sorted(pending)}")


def adapter_full_tensors(model: torch.nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """The adapter's tensors alone, under PEFT's saved names (``base_model.model.<layer>.lora_A.weight``).

    Gathers only the adapter's parameters (every rank must iterate).
    """
    for name, param in model.named_parameters():
        if ".lora_" not in name:
            continue
        tensor = _full(param)
        saved = "base_model.model." + name.replace(f".{ADAPTER_NAME}.", ".")
        yield saved, tensor.to(dtype) if dtype is not None else tensor


def adapter_config_dict(config: LoraConfig, base_model: str | os.PathLike) -> dict[str, Any]:
    """``adapter_config.json`` as PEFT writes it (the keys PEFT and the engines' loaders read)."""
    cfg = peft_config(config).to_dict()
    cfg["base_model_name_or_path"] = str(base_model)
    for key, value in list(cfg.items()):
        if isinstance(value, set):  # target_modules, and whatever else PEFT keeps as a set: JSON lists
            cfg[key] = sorted(value)
    return cfg


def write_adapter(named_tensors: Iterator[tuple[str, torch.Tensor]], out_dir: str | os.PathLike,
                  config: LoraConfig, base_model: str | os.PathLike) -> Path:
    """Write a PEFT adapter folder atomically (``out_dir.tmp`` then rename)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in named_tensors}
    save_file(tensors, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
    (tmp / "adapter_config.json").write_text(json.dumps(adapter_config_dict(config, base_model), indent=2,
                                                        default=str) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out
