"""GPU checks of the learner side, called by ``check.py`` — to be filled by the learner's owner.

Each hook gets the device string and a scratch directory, runs one short check and returns a
JSON-able dict of what it measured (``{"ok": bool, ...}``). ``check.py`` records a hook that
raises ``NotImplementedError`` as "not provided" and keeps going.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def fsdp_step(device: str, workdir: Path, model_dir: Path) -> dict[str, Any]:
    """One FSDP2 step (fully_shard per layer, bf16 params, fp32 reduce) on ``model_dir``."""
    raise NotImplementedError("fill in: one FSDP2 training step on the GPU (learner issue)")


def weight_sync(device: str, workdir: Path, model_dir: Path, engine_url: str) -> dict[str, Any]:
    """Send the learner's weights to the running hf engine at ``engine_url`` (collective transport, nccl).

    The engine side is ready: POST /pause_generation, /init_weights_update_group (backend
    "nccl"), /update_weights_from_distributed per bucket while broadcasting from rank 0,
    /continue_generation (core/docs/engine.md). NCCL needs a second GPU for the engine rank.
    """
    raise NotImplementedError("fill in: collective weight sync over nccl (learner issue)")
