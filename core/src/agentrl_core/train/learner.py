"""The FSDP2 learner: actor + frozen reference, AdamW, one optimizer step per batch.

Written the torchtitan way: ``fully_shard`` on every decoder layer, then on the root, over
a one-dimensional device mesh; no wrapper classes around torch. On CUDA the parameters
are kept in fp32 (the optimizer's master copy) and computed in bf16 with fp32 gradient
reduction (``MixedPrecisionPolicy``); on CPU everything is fp32 over gloo.

Every rank of the learner calls the same methods with the same arguments: each
:meth:`Learner.train_step` gets the whole step batch and trains its own share of it
(:mod:`agentrl_core.train.batching` decides which, identically on every rank). The loss of
each micro-batch is its contribution to the batch mean (:mod:`agentrl_core.train.losses`),
multiplied by the world size because FSDP averages gradients over ranks, so the gradient
is exactly the gradient of the whole batch's loss, whatever the split.

A single-process learner is a world of one: :func:`init_distributed` makes it.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from agentrl_core.config import LoraConfig, LossConfig, OptimConfig, TrainConfig
from agentrl_core.http.ports import free_port
from agentrl_core.train.batching import Layout, MicroBatchPlan, TrainSample, collate, plan_micro_batches
from agentrl_core.train.logprobs import token_logprobs
from agentrl_core.train.losses import batch_denominators, ppo_dual_clip
from agentrl_core.train.packed_attention import attention_implementation

log = logging.getLogger(__name__)

__all__ = ["Learner", "init_distributed", "resolve_device", "load_causal_lm", "load_sharded_causal_lm", "compute_dtype",
           "shard_model",
           "named_full_tensors"]


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` is this rank's CUDA device when there is one, else the CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("train.device is 'cuda' but torch sees no CUDA device; use 'cpu' or 'auto'")
        index = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device(device)


def init_distributed(device: str = "auto", timeout_s: float = 1800.0) -> tuple[int, int, torch.device]:
    """Join (or create) the default process group; returns ``(rank, world_size, device)``.

    Under ``torchrun`` (``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` set) this joins that group;
    otherwise it makes a world of one on a free local port. The backend is NCCL on CUDA and
    gloo on CPU.
    """
    dev = resolve_device(device)
    if not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        timeout = timedelta(seconds=timeout_s)
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend, timeout=timeout)
        else:
            store = dist.TCPStore("127.0.0.1", free_port(), 1, is_master=True, timeout=timeout)
            dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout)
    return dist.get_rank(), dist.get_world_size(), dev


def load_causal_lm(path: str | os.PathLike, dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa",
                   trust_remote_code: bool = False) -> torch.nn.Module:
    """A Hugging Face causal LM from ``path`` on the CPU, in ``dtype``.

    ``attn_implementation``: ``sdpa``, ``flash_attention_2`` or ``agentrl_packed``
    (:mod:`agentrl_core.train.packed_attention`, per-sequence SDPA for packed rows).
    """
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation=attn_implementation,
                                                trust_remote_code=trust_remote_code)


def load_sharded_causal_lm(path: str | os.PathLike, dtype: torch.dtype, attn_implementation: str,
                           trust_remote_code: bool, mesh: DeviceMesh, device: torch.device,
                           mp_policy: MixedPrecisionPolicy | None = None,
                           prepare: Callable[[torch.nn.Module], None] | None = None) -> torch.nn.Module:
    """The model of ``path`` sharded over ``mesh`` (:func:`shard_model`) on ``device``, read from
    disk by rank 0 only.

    Rank 0 loads the full model on the CPU; the other ranks build it on the meta device (no
    memory), shard it, allocate their shards and receive them from rank 0
    (``set_model_state_dict(broadcast_from_rank0=True)``), then the buffers the state dict
    lacks (rotary frequencies). So a rank's host memory holds its shard, not the whole model,
    and only rank 0's grows with the model. ``prepare`` runs on every rank before sharding
    (gradient checkpointing, LoRA adapters)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if mesh.size() == 1:
        model = load_causal_lm(path, dtype, attn_implementation, trust_remote_code)
        if prepare is not None:
            prepare(model)
        return shard_model(model, mesh, mp_policy).to(device)
    from transformers import AutoConfig, AutoModelForCausalLM

    rank0 = dist.get_rank() == 0
    if rank0:
        model = load_causal_lm(path, dtype, attn_implementation, trust_remote_code)
    else:
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_implementation,
                                                     trust_remote_code=trust_remote_code)
    if prepare is not None:
        prepare(model)
    # after prepare: what it adds (LoRA adapters, initialised on rank 0) is sent to the others too
    full = model.state_dict() if rank0 else {}
    shard_model(model, mesh, mp_policy)
    if rank0:
        model.to(device)
    else:
        model.to_empty(device=device)
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    del full
    for buffer in model.buffers():  # not in the state dict (non-persistent): rank 0's computed values
        dist.broadcast(buffer, src=0)
    return model


def compute_dtype(name: str) -> torch.dtype:
    """``model.dtype`` as a torch dtype: the learner's compute (parameter) dtype on CUDA."""
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _decoder_layers(model: torch.nn.Module) -> Sequence[torch.nn.Module]:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(
            f"{type(model).__name__} has no .model.layers: the learner shards decoder-only Hugging Face "
            "models (Qwen2, Llama, Mistral, GLM-4 style)"
        )
    return layers


def shard_model(
    model: torch.nn.Module, mesh: DeviceMesh, mp_policy: MixedPrecisionPolicy | None = None, reshard_after_forward: bool = True
) -> torch.nn.Module:
    """``fully_shard`` each decoder layer, then the root (embeddings, final norm, LM head)."""
    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy
    for layer in _decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def named_full_tensors(model: torch.nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, full tensor)`` of every parameter, gathering FSDP shards one by one.

    Every rank must iterate to the end (the gathers are collectives); rank 0 gets the
    values to send. Tied parameters appear once, under their first name (as in
    ``named_parameters``); the names are Hugging Face's.
    """
    for name, param in model.named_parameters():
        tensor = param.detach()
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        if dtype is not None:
            tensor = tensor.to(dtype)
        yield name, tensor


def _warmup_lambda(warmup_steps: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        return min(1.0, (step + 1) / warmup_steps) if warmup_steps else 1.0

    return factor


class Learner:
    """FSDP2 actor with a frozen reference, trained one optimizer step per batch.

    Args:
        model_path: a Hugging Face directory (the actor and the reference start from it).
        train / optim / loss: the ``train``, ``optim`` and ``loss`` config sections.
        temperature: the rollout sampling temperature (logits are divided by it).
        loss_fn: a PolicyLoss (default :func:`~agentrl_core.train.losses.ppo_dual_clip`).
        layout: ``packed`` (no padding) or ``padded`` micro-batches; default ``train.micro_batch_layout``.
        param_dtype: compute dtype on CUDA (default bf16, ``model.dtype``); the CPU always computes in fp32.
        trust_remote_code: let transformers run the checkpoint's own model code (``model.trust_remote_code``).
        keep_token_logprobs: keep the log-probs of each step's loss tokens for :meth:`take_token_logprobs`
            (the trajectory store's learner log-probs and ratios).
        lora: ``model.lora``; when enabled only LoRA adapters are trained (:mod:`agentrl_core.train.lora`),
            the reference is the same model with the adapters off, and weights leave merged.

    :func:`init_distributed` must have run on every rank first.
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        train: TrainConfig | None = None,
        optim: OptimConfig | None = None,
        loss: LossConfig | None = None,
        temperature: float = 1.0,
        loss_fn: Callable[..., Any] | None = None,
        layout: Layout | None = None,
        param_dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str | None = None,
        trust_remote_code: bool = False,
        keep_token_logprobs: bool = False,
        lora: LoraConfig | None = None,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError("call agentrl_core.train.learner.init_distributed() on every rank before building a Learner")
        self.train_config = train or TrainConfig()
        self.optim_config = optim or OptimConfig()
        self.loss_config = loss or LossConfig()
        self.temperature = float(temperature)
        self.loss_fn = loss_fn or ppo_dual_clip
        self.layout: Layout = layout or getattr(self.train_config, "micro_batch_layout", "packed")
        self.model_path = Path(model_path)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device = torch.device(device) if device is not None else resolve_device(self.train_config.device)
        self.mesh = init_device_mesh(self.device.type, (self.world_size,), mesh_dim_names=("dp",))
        on_gpu = self.device.type == "cuda"
        mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if on_gpu else None

        self.attn_implementation = attention_implementation(self.device, self.layout)
        self.trust_remote_code = trust_remote_code
        self.lora = lora if lora is not None and lora.enabled else None

        def checkpointing(model: torch.nn.Module) -> None:
            if not self.train_config.gradient_checkpointing:
                return
            enable = getattr(model, "activation_checkpointing_enable", None)
            if enable is not None:
                enable()
            else:  # transformers < 5
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

        def prepare(model: torch.nn.Module) -> None:
            if self.lora is not None:
                from agentrl_core.train.lora import apply_lora

                apply_lora(model, self.lora)
            checkpointing(model)

        # rank 0 reads the checkpoint, the others receive their shards: host memory per rank
        # does not hold the whole fp32 model (and reference) on every rank
        self.model = load_sharded_causal_lm(self.model_path, torch.float32, self.attn_implementation,
                                            trust_remote_code, self.mesh, self.device, mp_policy, prepare)
        self.config = self.model.config
        self.pad_token_id = int(self.config.pad_token_id if self.config.pad_token_id is not None else 0)
        self.model.train()

        self.ref_model = None
        # LoRA: the reference is the base model, i.e. this model with its adapters switched off
        self.ref_is_base = bool(self.lora is not None and self.train_config.reference and self.loss_config.kl_coef > 0)
        if self.train_config.reference and self.loss_config.kl_coef > 0 and self.lora is None:
            ref_dtype = param_dtype if on_gpu else torch.float32
            self.ref_model = load_sharded_causal_lm(self.model_path, ref_dtype, self.attn_implementation,
                                                    trust_remote_code, self.mesh, self.device)
            self.ref_model.eval()
            self.ref_model.requires_grad_(False)

        o = self.optim_config
        # the frozen base of a LoRA model has no optimizer state: AdamW's moments are adapter-sized
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        if self.lora is not None and self.rank == 0:
            from agentrl_core.train.lora import trainable_parameter_count

            trained, total = trainable_parameter_count(self.model)
            log.info("LoRA rank %d: %d of %d parameters trained (%.3f %%)", self.lora.rank, trained, total,
                     100.0 * trained / max(total, 1))
        self.optimizer = torch.optim.AdamW(
            self.trainable, lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _warmup_lambda(o.warmup_steps))
        self.step = 0
        self.keep_token_logprobs = keep_token_logprobs
        self._token_logprobs: dict[int, list[float]] = {}

    # -- training -------------------------------------------------------------------

    def plan(self, samples: Sequence[TrainSample]) -> MicroBatchPlan:
        """The micro-batch plan every rank derives for ``samples``."""
        budget = self.train_config.max_tokens_per_micro_batch
        return plan_micro_batches([len(s) for s in samples], budget, self.world_size, self.layout)

    @torch.no_grad()
    def _reference(self, samples: Sequence[TrainSample], micro_batches: list[list[int]]) -> list[torch.Tensor | None]:
        if self.ref_is_base:
            from agentrl_core.train.lora import adapters_disabled

            self.model.eval()
            try:
                with adapters_disabled(self.model):
                    return self._logprobs_of(self.model, samples, micro_batches)
            finally:
                self.model.train()
        if self.ref_model is None:
            return [None] * len(micro_batches)
        return self._logprobs_of(self.ref_model, samples, micro_batches)

    def _logprobs_of(self, model: torch.nn.Module, samples: Sequence[TrainSample],
                     micro_batches: list[list[int]]) -> list[torch.Tensor | None]:
        out: list[torch.Tensor | None] = []
        for idx in micro_batches:
            mb = collate([samples[i] for i in idx], self.layout, self.pad_token_id).to(self.device)
            out.append(token_logprobs(model, mb, self.temperature).logprobs)
        return out

    def train_step(self, samples: Sequence[TrainSample]) -> dict[str, float]:
        """One optimizer step on the whole step batch ``samples`` (identical on every rank).

        Returns metrics already reduced over ranks: the loss terms as exact batch means,
        ``grad_norm`` (before clipping), ``lr``, token counts, padding waste, ``tokens_per_s``
        and stage timings. A non-finite gradient norm skips the update (and says so).
        """
        t0 = time.perf_counter()
        metrics = self.forward_backward(samples)
        metrics.update(self.optimizer_step())
        elapsed = time.perf_counter() - t0
        metrics["time/step_s"] = elapsed
        metrics["tokens_per_s"] = metrics["num_tokens"] / max(elapsed, 1e-9)
        return metrics

    def forward_backward(self, samples: Sequence[TrainSample]) -> dict[str, float]:
        """Reference log-probs, then forward and backward of this rank's micro-batches.

        Leaves the gradient of the whole batch's loss in the (sharded) ``.grad`` of the
        parameters; :meth:`optimizer_step` applies it.
        """
        if not samples:
            raise ValueError("train_step needs at least one sample")
        t0 = time.perf_counter()
        plan = self.plan(samples)
        mine = plan.micro_batches[self.rank]
        num_tokens, num_seqs = batch_denominators([s.loss_mask for s in samples])
        ref = self._reference(samples, mine)
        t_ref = time.perf_counter()

        entropy_grad = self.loss_config.entropy_coef != 0.0
        sums: dict[str, float] = {}
        self._token_logprobs = {}
        self.optimizer.zero_grad(set_to_none=True)
        for k, idx in enumerate(mine):
            mb = collate([samples[i] for i in idx], self.layout, self.pad_token_id).to(self.device)
            out = token_logprobs(self.model, mb, self.temperature, with_entropy=True, entropy_grad=entropy_grad)
            loss, parts = self.loss_fn(
                out.logprobs, mb.old_logprobs, ref[k], mb.advantages, mb.loss_mask, self.loss_config,
                entropy=out.entropy, num_tokens=num_tokens, num_seqs=num_seqs,
            )
            (loss * self.world_size + out.anchor).backward()
            if self.keep_token_logprobs:
                self._keep_logprobs(idx, samples, out.logprobs.detach()[mb.target_seq, mb.target_pos])
            for key, value in parts.items():
                sums[key] = sums.get(key, 0.0) + float(value)
        t_actor = time.perf_counter()

        keys = sorted(sums)
        totals = torch.tensor([sums[k] for k in keys], dtype=torch.float64)
        if self.world_size > 1:
            dist.all_reduce(totals)
        metrics = {k: float(v) for k, v in zip(keys, totals.tolist(), strict=True)}
        metrics.update(
            num_sequences=float(len(samples)),
            num_loss_tokens=float(num_tokens),
            num_tokens=float(plan.real_tokens),
            micro_batches=float(plan.num_micro_batches),
            padding_waste=plan.padding_waste,
            rank_imbalance=plan.rank_imbalance,
        )
        metrics["time/ref_s"] = t_ref - t0
        metrics["time/actor_s"] = t_actor - t_ref
        return metrics

    def _keep_logprobs(self, idx: list[int], samples: Sequence[TrainSample], values: torch.Tensor) -> None:
        """Split a micro-batch's loss-token log-probs (in target order: sample by sample) by sample."""
        counts = [sum(samples[i].loss_mask) for i in idx]
        for i, part in zip(idx, values.float().cpu().split(counts), strict=True):
            self._token_logprobs[i] = part.tolist()

    def take_token_logprobs(self) -> dict[int, list[float]]:
        """This rank's log-probs of the last step's loss tokens, by sample index, under the weights the
        step started from (the ones its ratio used); empty unless ``keep_token_logprobs``."""
        out, self._token_logprobs = self._token_logprobs, {}
        return out

    def optimizer_step(self) -> dict[str, float]:
        """Clip the gradient norm, step AdamW and the LR schedule, clear the gradients."""
        t0 = time.perf_counter()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable, self.optim_config.grad_clip)
        if isinstance(grad_norm, DTensor):
            grad_norm = grad_norm.full_tensor()
        grad_norm = float(grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        finite = math.isfinite(grad_norm)
        if finite:
            self.optimizer.step()
        else:
            log.warning("step %d: gradient norm is %s; the update is skipped", self.step + 1, grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        return {"grad_norm": grad_norm, "lr": lr, "skipped_update": float(not finite),
                "time/optim_s": time.perf_counter() - t0}

    # -- weights out ----------------------------------------------------------------

    def named_full_tensors(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Full parameters, gathered one by one (every rank must iterate; rank 0 sends).

        With LoRA: the base weights with the adapters merged in, under the base model's names."""
        if self.lora is not None:
            from agentrl_core.train.lora import merged_full_tensors

            return merged_full_tensors(self.model, dtype)
        return named_full_tensors(self.model, dtype)

    def full_weight_bytes(self, dtype: torch.dtype | None = None) -> int:
        """The bytes of a full-weight sync in ``dtype`` (the base model's parameters, adapters merged)."""
        total = 0
        for name, param in self.model.named_parameters():
            if ".lora_" not in name:
                total += param.numel() * torch.empty((), dtype=dtype or param.dtype).element_size()
        return total

    def adapter_tensors(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """The LoRA adapter's tensors under PEFT's saved names (every rank must iterate)."""
        if self.lora is None:
            raise ValueError("this learner trains no LoRA adapter (model.lora.enabled is false)")
        from agentrl_core.train.lora import adapter_full_tensors

        return adapter_full_tensors(self.model, dtype)

    def close(self) -> None:
        """Drop the models and optimizer (the process group stays: its owner destroys it)."""
        self.model = self.ref_model = self.optimizer = None  # type: ignore[assignment]
