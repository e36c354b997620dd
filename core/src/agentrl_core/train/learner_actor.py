"""One learner rank's work, called by name: train, sync weights, checkpoint.

:class:`LearnerService` holds the rank's FSDP2 :class:`~agentrl_core.train.learner.Learner`,
its policy loss and (on rank 0) one weight-sync transport per engine pool, and offers the
calls a training job makes on every rank. It knows nothing about Ray: the Ray actor
(:class:`agentrl_core.launch.ray_pools.LearnerRank`) sets up the process (devices,
``torch.distributed``) and subclasses it, and :class:`agentrl_core.launch.ray_pools.LearnerGroup`
calls every rank at once with these same typed methods. In one process (tests, a world of
one) it can be used directly.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl_core.config import Config
from agentrl_core.types import PolicyLossSpec, WeightSyncTransportSpec

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

__all__ = ["LearnerService"]


class LearnerService:
    """The learner of one rank, with its loss and weight-sync transports (``torch.distributed`` already set up)."""

    def __init__(self, rank: int, model_path: str, config: Config, device: torch.device) -> None:
        from agentrl_core.registry import Registry
        from agentrl_core.train.learner import Learner, compute_dtype

        self.rank = rank
        self.config = config
        self.model_path = model_path
        self.device_kind = device.type
        self.registry = Registry()
        loss_fn = self.registry.build(PolicyLossSpec, config.loss.name)
        self.learner = Learner(model_path, train=config.train, optim=config.optim, loss=config.loss,
                               temperature=config.rollout.temperature, loss_fn=loss_fn, device=device,
                               param_dtype=compute_dtype(config.model.dtype),
                               trust_remote_code=config.model.trust_remote_code,
                               keep_token_logprobs=config.logging.trajectory_store, lora=config.model.lora)
        self.transports: dict[str, Any] = {}
        self._adapter_root: str | None = None  # model.lora: where synced adapters are written
        self._own_adapter_root = False

    def default_address(self) -> str:
        """Where engines reach this rank when ``connect`` is not told (the Ray actor: its node's address)."""
        raise ValueError("connect needs the address engines reach learner rank 0 at")

    def connect(self, pools: Mapping[str, list[str]], address: str | None = None,
                ranks_per_engine: Mapping[str, int] | None = None,
                shared_device: Mapping[str, bool] | None = None) -> None:
        """Rank 0 forms one weight-sync transport per pool with that pool's engines (again, after a restart).

        ``address`` is where engines reach this rank (default: :meth:`default_address`);
        ``ranks_per_engine`` the group ranks one engine of each pool takes (SGLang: its tp size);
        ``shared_device`` whether an engine of each pool is on this rank's GPU (the collective
        transport then picks gloo: :func:`~agentrl_core.train.weight_sync.choose_backend`).
        """
        if self.rank != 0:
            return
        from agentrl_core.train.weight_sync import transfer_dtype

        ws = self.config.weight_sync
        dtype = transfer_dtype(ws.dtype, model_dtype=self.config.model.dtype, device_kind=self.device_kind)
        for pool, urls in pools.items():
            old = self.transports.pop(pool, None)
            if old is not None:
                try:
                    old.close()
                except Exception as exc:  # its engine is gone; the group is replaced anyway
                    log.warning("closing the old weight-sync transport of %s: %s", pool, exc)
            if self.learner.lora is not None:
                transport = self._adapter_transport(dtype)
            else:
                transport = self.registry.build(WeightSyncTransportSpec, ws.transport, None, weight_sync=ws,
                                                model_dir=self.model_path, dtype=dtype,
                                                ranks_per_engine=(ranks_per_engine or {}).get(pool, 1),
                                                shared_device=bool((shared_device or {}).get(pool, False)),
                                                pool=f"pool {pool!r}",
                                                partial_rollouts=self.config.rollout.partial_rollouts)
            transport.connect(address or self.default_address(), urls)
            self.transports[pool] = transport

    def _adapter_transport(self, dtype: Any) -> Any:
        """``model.lora``: only the adapter travels, as a PEFT folder the engines load by version
        (:mod:`agentrl_core.train.adapter_sync`), under ``weight_sync.disk_path/adapters`` or a
        folder of this machine's temporary directory (engines on other machines need disk_path)."""
        import tempfile

        from agentrl_core.train.adapter_sync import AdapterTransport, adapter_versions_kept

        ws = self.config.weight_sync
        if self._adapter_root is None:
            if ws.disk_path:
                self._adapter_root = str(Path(ws.disk_path) / "adapters")
            else:
                self._adapter_root = tempfile.mkdtemp(prefix="agentrl-adapters-")
                self._own_adapter_root = True
            log.info("model.lora: weight syncs send the adapter alone, through %s (weight_sync.transport %s is "
                     "not used)", self._adapter_root, ws.transport)
        return AdapterTransport(root=self._adapter_root, lora=self.learner.lora, model_dir=self.model_path,
                                keep=adapter_versions_kept(self.config.rollout.staleness_bound),
                                full_bytes=self.learner.full_weight_bytes(dtype), dtype=dtype,
                                timeout_s=ws.timeout_s)

    def train_step(self, samples: list[Any]) -> dict[str, float]:
        return self.learner.train_step(samples)

    def take_token_logprobs(self) -> dict[int, list[float]]:
        """The loss tokens' log-probs of the last ``train_step`` on this rank, by sample index."""
        return self.learner.take_token_logprobs()

    def sync(self, pools: list[str], version: int) -> dict[str, float]:
        from agentrl_core.train.weight_sync import push_weights

        tensors = self.learner.adapter_tensors if self.learner.lora is not None else self.learner.named_full_tensors
        return push_weights(tensors, self.transports, pools, version, rank=self.rank)

    def save_checkpoint(self, root: str, trainer_state: dict[str, Any], keep: int, hf_model: bool) -> str:
        from agentrl_core.train.checkpoint import save_checkpoint

        return str(save_checkpoint(root, self.learner, trainer_state, keep=keep, hf_model=hf_model))

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        from agentrl_core.train.checkpoint import load_checkpoint

        return load_checkpoint(path, self.learner)

    def save_hf_model(self, out_dir: str) -> str | None:
        from agentrl_core.train.checkpoint import save_hf_model

        path = save_hf_model(self.learner, out_dir)
        return str(path) if path is not None else None

    def shutdown(self) -> None:
        for transport in self.transports.values():
            try:
                transport.close()
            except Exception as exc:  # closing is best effort; the process exits next
                log.warning("closing a weight-sync transport failed: %s", exc)
        self.learner.close()
        if self._own_adapter_root and self._adapter_root:
            shutil.rmtree(self._adapter_root, ignore_errors=True)
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
