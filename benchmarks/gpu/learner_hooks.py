"""GPU checks of the learner side, called by ``check.py``.

Each hook gets the device string and a scratch directory, runs one short check and returns a
JSON-able dict of what it measured (``{"ok": bool, ...}``).
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import torch


def _learner(model_dir: Path, device: str):
    from agentrl_core.config import LossConfig, TrainConfig
    from agentrl_core.train.learner import Learner, init_distributed

    init_distributed("cuda" if device.startswith("cuda") else "cpu")
    return Learner(model_dir, train=TrainConfig(device="cuda" if device.startswith("cuda") else "cpu"),
                   loss=LossConfig(kl_coef=1e-4), temperature=0.8)


def _samples(vocab: int, n: int = 8, seed: int = 0):
    from agentrl_core.train.batching import TrainSample

    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.randint(32, 256)
        prompt = rng.randint(8, length // 2)
        ids = [rng.randrange(vocab) for _ in range(length)]
        mask = [0] * prompt + [1] * (length - prompt)
        old = [0.0] * prompt + [-rng.uniform(1.0, 8.0) for _ in range(length - prompt)]
        adv = [0.0] * prompt + [1.0 if i % 2 else -1.0] * (length - prompt)
        out.append(TrainSample(ids, mask, old, adv, f"g{i // 2}"))
    return out


def fsdp_step(device: str, workdir: Path, model_dir: Path) -> dict[str, Any]:
    """One FSDP2 step (fully_shard per layer, bf16 params on CUDA, fp32 reduce) on ``model_dir``."""
    learner = _learner(model_dir, device)
    vocab = learner.config.vocab_size
    samples = _samples(vocab)
    first = learner.train_step(samples)
    second = learner.train_step(samples)
    finite = all(math.isfinite(first[k]) and math.isfinite(second[k]) for k in ("loss", "grad_norm"))
    return {
        "ok": finite and first["grad_norm"] > 0,
        "device": str(learner.device),
        "param_dtype_on_device": str(next(learner.model.parameters()).dtype),
        "loss_first": first["loss"],
        "loss_second": second["loss"],
        "grad_norm": first["grad_norm"],
        "tokens_per_s": second["tokens_per_s"],
        "step_s": second["time/step_s"],
    }


def weight_sync(device: str, workdir: Path, model_dir: Path, engine_url: str) -> dict[str, Any]:
    """Send the learner's weights to an hf engine process (TP 1) with the collective transport.

    The engine runs in its own process (a process cannot be two ranks of one group). NCCL
    cannot put two ranks on one GPU either, so with a single GPU the group uses gloo (the
    tensors travel through host memory); with two or more the engine gets the second GPU and
    the group is NCCL. Afterwards the engine's log-probs must match a transformers forward
    of the learner's new weights.
    """
    import anyio
    from transformers import AutoModelForCausalLM

    from agentrl_core.config import EngineConfig
    from agentrl_core.rollout.engine_client import EngineClient
    from agentrl_core.rollout.hf_driver import HFDriver
    from agentrl_core.train.weight_sync import CollectiveTransport, transfer_dtype

    learner = _learner(model_dir, device)
    learner.train_step(_samples(learner.config.vocab_size))  # the weights now differ from the files
    on_gpu = device.startswith("cuda")
    two_gpus = on_gpu and torch.cuda.device_count() >= 2
    backend = "nccl" if two_gpus else "gloo"
    engine = EngineConfig(device="cuda" if on_gpu else "cpu")
    driver = HFDriver(engine=engine, log_dir=str(workdir / "engine_logs"))
    # what agentrl train sends: weight_sync.dtype auto = model.dtype (bf16) on GPU, fp32 on CPU
    dtype = transfer_dtype("auto", model_dtype="bfloat16", device_kind="cuda" if on_gpu else "cpu")
    try:
        url = driver.launch("sync_check", str(model_dir), [[1]] if two_gpus else [])[0]
        transport = CollectiveTransport(backend=backend, bucket_mb=1.0, dtype=dtype)
        transport.connect("127.0.0.1", [url])
        stats = transport.send(learner.named_full_tensors(), 1)
        transport.close()
        expected = {name: t.to(dtype).float().cpu() for name, t in learner.named_full_tensors()}
        prompt = list(range(5, 45))

        async def probe() -> tuple[Any, Any]:
            async with EngineClient(url) as client:
                info = await client.model_info()
                out = await client.generate(prompt, {"max_new_tokens": 16, "temperature": 1.0, "ignore_eos": True})
                return info.get("weight_version"), out

        reported, out = anyio.run(probe)
    finally:
        driver.shutdown()
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    reference.load_state_dict(expected, strict=False)
    with torch.no_grad():
        logits = reference(torch.tensor([prompt + out.output_ids])).logits[0, len(prompt) - 1:-1]
    ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(out.output_ids)[:, None])[:, 0]
    worst = (torch.tensor(out.logprobs) - ref).abs().max().item()
    return {
        "ok": str(reported) == "1" and worst < (1e-3 if on_gpu else 1e-4),
        "backend": backend,
        "transfer_dtype": str(dtype).removeprefix("torch."),
        "weight_version_after": reported,
        "max_logprob_diff_vs_new_weights": worst,
        **{k: float(v) for k, v in stats.items()},
    }


def colocated_sync(device: str, workdir: Path, model_dir: Path) -> dict[str, Any]:
    """Engine and learner on one GPU (cuda:0), one sync-mode step as ``agentrl train`` runs it.

    The transport is chosen as in production (:func:`choose_backend` with the engine on learner
    rank 0's GPU: gloo); around the learner step the engine releases its memory
    (:class:`EngineMemory`: pause, ``/release_memory_occupation``, train,
    ``/resume_memory_occupation``, sync, continue). Reports the GPU's free memory
    (``torch.cuda.mem_get_info``, both processes) and the learner's ``memory_allocated`` at each
    point; ok when the release freed memory, the sync went over the chosen backend and the
    engine answers with version 1 under logprobs of the learner's new weights.
    """
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return {"ok": None, "status": "skipped",
                "note": "the colocated check needs a GPU (engine and learner share cuda:0); run check.py on a GPU "
                        "machine"}
    import anyio

    from agentrl_core.config import EngineConfig
    from agentrl_core.rollout.engine_client import EnginePool
    from agentrl_core.rollout.hf_driver import HFDriver
    from agentrl_core.train.engine_memory import EngineMemory
    from agentrl_core.train.weight_sync import CollectiveTransport, choose_backend, transfer_dtype

    backend, why = choose_backend("auto", cuda=True, shared_device=True)
    learner = _learner(model_dir, "cuda:0")
    driver = HFDriver(engine=EngineConfig(device="cuda"), log_dir=str(workdir / "colocated_logs"))
    dtype = transfer_dtype("auto", model_dtype="bfloat16", device_kind="cuda")
    mib = 2**20
    points: dict[str, dict[str, float]] = {}

    def measure(name: str) -> None:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info(0)
        points[name] = {"gpu_used_mib": round((total - free) / mib, 1),
                        "learner_allocated_mib": round(torch.cuda.memory_allocated(0) / mib, 1)}

    try:
        url = driver.launch("current", str(model_dir), [[0]])[0]
        transport = CollectiveTransport(backend="auto", shared_device=True, bucket_mb=1.0, dtype=dtype, timeout_s=300)
        transport.connect("127.0.0.1", [url])
        prompt = list(range(5, 45))
        params = {"max_new_tokens": 64, "temperature": 1.0, "ignore_eos": True}

        async def step() -> Any:
            async with EnginePool("current", [url]) as pool:
                await pool.generate("warm", prompt, params)  # the engine's KV cache is in use
                measure("engine_generated")
                memory = EngineMemory({"current": pool})
                released = await memory.release(["current"])
                measure("engine_released")
                train = await anyio.to_thread.run_sync(learner.train_step, _samples(learner.config.vocab_size))
                measure("learner_trained")
                resumed = await memory.resume()
                measure("engine_resumed")
                stats = await anyio.to_thread.run_sync(transport.send, learner.named_full_tensors(), 1)
                await memory.continue_unsynced(["current"])
                out = await pool.generate("after", prompt, params)
                measure("after_sync")
                return released, resumed, stats, train, out

        released, resumed, stats, train, out = anyio.run(step)
        transport.close()
    finally:
        driver.shutdown()
    freed = points["engine_generated"]["gpu_used_mib"] - points["engine_released"]["gpu_used_mib"]
    return {
        "ok": backend == "gloo" and transport.backend == "gloo" and freed > 0 and out.weight_version == 1
        and math.isfinite(train["loss"]),
        "backend": transport.backend, "why": why, "freed_by_release_mib": round(freed, 1),
        "memory": points, **released, **resumed, "sync_seconds": stats["seconds"], "sync_bytes": stats["bytes"],
        "weight_version_after": out.weight_version,
    }
