"""Checkpoints that survive SIGKILL: model, optimizer, step, RNG and the trainer's state.

Layout of ``<root>/step_00000040/``::

    dcp/                  model + optimizer, sharded (torch.distributed.checkpoint, one file per rank)
    learner.pt            step and LR-scheduler state
    rng_rank<r>.pt        Python, torch (CPU and CUDA) and numpy RNG states of each rank
    trainer_state.json    what the pipeline passes: the task-stream cursor, the ids of groups
                          issued but not yet trained, counters, ...
    hf/                   a Hugging Face model directory, when asked for

Every rank writes into ``<root>/.step_00000040.tmp`` and rank 0 renames it to its final
name once all ranks are done (``os.replace``, atomic); a process killed at any moment
leaves either the previous checkpoints or the new one, never half of one, and stray
``.tmp`` directories are removed by the next save. The last ``keep`` checkpoints are kept.

Call :func:`save_checkpoint` and :func:`load_checkpoint` on every rank of the learner.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

__all__ = ["save_checkpoint", "load_checkpoint", "latest_checkpoint", "list_checkpoints", "save_hf_model"]

_NAME = re.compile(r"^step_(\d{8,})$")


def list_checkpoints(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root`` as ``(step, path)``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        m = _NAME.match(path.name)
        if m and path.is_dir() and (path / "trainer_state.json").is_file():
            found.append((int(m.group(1)), path))
    return sorted(found)


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint under ``root`` (``None`` when there is none)."""
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:  # numpy is optional
        pass
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])


def save_hf_model(learner: Any, out_dir: str | os.PathLike) -> Path | None:
    """Write the learner's current weights as a Hugging Face directory (all ranks call).

    Config, tokenizer and chat template are copied from the model the learner started
    from. Returns the path on rank 0, ``None`` elsewhere.
    With LoRA (``learner.lora``) the weights are the base with the adapter merged in, and the
    adapter alone is written too, in PEFT's layout, to ``<out_dir>/adapter``.
    """
    from agentrl_core.train.weight_sync import drain, write_hf_checkpoint

    tensors = learner.named_full_tensors()
    if _rank() != 0:
        drain(tensors)
        if getattr(learner, "lora", None) is not None:
            drain(learner.adapter_tensors())
        return None
    out = write_hf_checkpoint(tensors, out_dir, learner.model_path)
    if getattr(learner, "lora", None) is not None:
        from agentrl_core.train.lora import write_adapter

        write_adapter(learner.adapter_tensors(), out / "adapter", learner.lora, learner.model_path)
    return out


def _state_dict_options(learner: Any) -> Any:
    """LoRA checkpoints hold the adapter and its optimizer state alone (the base is ``model.path``).

    Loading then sets the adapter only (``strict=False``: the frozen base is absent on purpose;
    ``dcp.load`` still fails on any adapter key the checkpoint lacks)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    lora = getattr(learner, "lora", None) is not None
    return StateDictOptions(ignore_frozen_params=lora, strict=not lora)


def save_checkpoint(
    root: str | os.PathLike,
    learner: Any,
    trainer_state: dict[str, Any] | None = None,
    *,
    keep: int = 3,
    hf_model: bool = False,
) -> Path:
    """Save ``learner`` (a :class:`~agentrl_core.train.learner.Learner`) at its current step.

    ``trainer_state`` must be JSON-serializable (e.g. ``{"task_stream":
    stream.state_dict(), ...}``). Returns the final directory.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    root = Path(root)
    step = int(learner.step)
    final = root / f"step_{step:08d}"
    tmp = root / f".step_{step:08d}.tmp"
    rank = _rank()
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stray in root.glob(".step_*.tmp"):
            shutil.rmtree(stray, ignore_errors=True)
        tmp.mkdir()
    _barrier()

    model_sd, optim_sd = get_state_dict(learner.model, learner.optimizer, options=_state_dict_options(learner))
    dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=dcp.FileSystemWriter(str(tmp / "dcp"), sync_files=True))
    rng_path = tmp / f"rng_rank{rank}.pt"
    torch.save(_rng_state(), rng_path)
    _fsync_file(rng_path)
    if hf_model:
        save_hf_model(learner, tmp / "hf")
    if rank == 0:
        torch.save({"step": step, "scheduler": learner.scheduler.state_dict()}, tmp / "learner.pt")
        _fsync_file(tmp / "learner.pt")
        state_path = tmp / "trainer_state.json"
        state_path.write_text(json.dumps({"step": step, **(trainer_state or {})}))
        _fsync_file(state_path)
    _barrier()
    if rank == 0:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
        for _, old in list_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        log.info("checkpoint %s saved", final)
    _barrier()
    return final


def load_checkpoint(path: str | os.PathLike, learner: Any) -> dict[str, Any]:
    """Restore ``learner`` from ``path`` (on every rank); returns the trainer state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = Path(path)
    if not (path / "trainer_state.json").is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no trainer_state.json); use latest_checkpoint()")
    options = _state_dict_options(learner)
    model_sd, optim_sd = get_state_dict(learner.model, learner.optimizer, options=options)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(path / "dcp")))
    set_state_dict(learner.model, learner.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=options)
    meta = torch.load(path / "learner.pt", weights_only=False)
    learner.step = int(meta["step"])
    learner.scheduler.load_state_dict(meta["scheduler"])
    rng = path / f"rng_rank{_rank()}.pt"
    if rng.is_file():  # absent when resuming on more ranks than saved: those start fresh
        _set_rng_state(torch.load(rng, weights_only=False))
    trainer_state = json.loads((path / "trainer_state.json").read_text())
    _barrier()
    log.info("resumed from %s at step %d", path, learner.step)
    return trainer_state
