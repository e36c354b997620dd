"""GPU checks of placement and of SGLang weight sync, called by ``check.py``.

* ``placement``: a local Ray over this machine's devices places a learner rank and an engine
  the way ``agentrl train`` does (``RayPools``): in async mode (two or more GPUs, or CPU
  cores) they must see disjoint devices, colocated (one GPU) the same one. The learner rank
  is a probe with the real constructor (the FSDP learner is ``fsdp_step``'s check); the
  engine is a real hf engine started by the real driver in the real host actor.
* ``sglang_weight_sync(tp)``: SGLang with tensor parallelism ``tp`` on GPUs ``1..tp``, a CUDA
  FSDP learner on GPU 0 after one training step, the collective transport over NCCL with
  ``ranks_per_engine = tp`` and weights sent in bf16; then the server's log-probs at
  temperature 0.8 must match a ``transformers`` forward of the learner's new weights at that
  temperature (``SGLANG_RETURN_ORIGINAL_LOGPROB`` is pinned off by the driver). Needs
  ``sglang`` importable and ``tp + 1`` GPUs; otherwise the step reports it was skipped.

Every hook returns a JSON-able dict with ``ok`` (None when skipped).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import torch


class ProbeRank:
    """Stands in for a learner rank: the real constructor's arguments; reports the device Ray gave it."""

    def __init__(self, rank, world_size, master, devices, kind, model_path, config):
        from agentrl_core.launch.ray_pools import _pin

        _pin(kind, devices)  # what the real rank does first
        self.report_ = {"devices": [str(d) for d in devices], "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                        "cpus": sorted(os.sched_getaffinity(0))}
        if kind == "cuda":
            self.report_["gpu_uuid"] = str(torch.cuda.get_device_properties(0).uuid)

    def ready(self):
        return 0

    def report(self):
        return self.report_

    def shutdown(self):
        pass


def _process_view(pid: int) -> dict[str, Any]:
    environ = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)
    return {"cuda_visible": environ.get("CUDA_VISIBLE_DEVICES"), "cpus": sorted(os.sched_getaffinity(pid))}


def placement(device: str, workdir: Path, model_dir: Path) -> dict[str, Any]:
    import ray

    from agentrl_core.config import config_from_dict
    from agentrl_core.launch.placement import available_devices, plan_placement
    from agentrl_core.launch.ray_pools import RayPools
    from agentrl_core.types import PoolSpec

    kind = "cuda" if device.startswith("cuda") else "cpu"
    devices = available_devices(kind)
    mode = "async" if len(devices) >= 2 else "sync"
    plan = plan_placement(devices[:2] if kind == "cpu" else devices, [PoolSpec("current", 1.0, 1)], kind=kind,
                          mode=mode, rollout_ratio=0.5, learner_ranks=1)
    config = config_from_dict({"model": {"path": str(model_dir)}, "engine": {"device": kind},
                               "train": {"device": kind, "mode": mode}}, validate_plugins=False)
    here = str(Path(__file__).parent)
    ray.init(num_cpus=max(4, len(devices)), num_gpus=len(devices) if kind == "cuda" else 0, include_dashboard=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}})
    try:
        pools = RayPools(plan, config, model_path=str(model_dir), run_dir=workdir / "placement", learner_cls=ProbeRank)
        try:
            learner = ray.get(pools.ranks[0].report.remote())
            [host] = pools.hosts["current"]
            pids = ray.get(host.__ray_call__.remote(lambda self: [p.pid for _, p, _ in self.driver.procs.processes]))
            engine = _process_view(pids[0])
        finally:
            pools.shutdown()
    finally:
        ray.shutdown()
    if kind == "cuda":
        learner_gpus = set((learner["cuda_visible"] or "").split(","))
        engine_gpus = set((engine["cuda_visible"] or "").split(","))
        ok = (learner_gpus.isdisjoint(engine_gpus) if mode == "async" else learner_gpus == engine_gpus)
    else:
        ok = set(learner["cpus"]).isdisjoint(engine["cpus"]) if mode == "async" else True
    return {"ok": ok, "mode": mode, "placement": plan.describe(), "learner": learner, "engine": engine}


def sglang_weight_sync(device: str, workdir: Path, model_dir: Path, tp: int) -> dict[str, Any]:
    if importlib.util.find_spec("sglang") is None:
        return {"ok": None, "status": "skipped", "note": "sglang is not installed"}
    gpus = torch.cuda.device_count() if device.startswith("cuda") else 0
    if gpus < tp + 1:
        return {"ok": None, "status": "skipped", "note": f"needs {tp + 1} GPUs (learner + TP {tp}), found {gpus}"}
    import anyio
    from learner_hooks import _learner, _samples
    from transformers import AutoModelForCausalLM

    from agentrl_core.config import EngineConfig, ModelConfig, SGLangOptions
    from agentrl_core.rollout.engine_client import EngineClient
    from agentrl_core.rollout.sglang_driver import SGLangDriver
    from agentrl_core.train.weight_sync import CollectiveTransport

    learner = _learner(model_dir, "cuda")
    learner.train_step(_samples(learner.config.vocab_size))  # the weights now differ from the files
    driver = SGLangDriver(EngineConfig(driver="sglang", sglang=SGLangOptions(python=sys.executable, tp_size=tp,
                                                                             mem_fraction_static=0.3)),
                          model=ModelConfig(path=str(model_dir), dtype="bfloat16"), max_context=2048,
                          log_dir=str(workdir / f"sglang_tp{tp}"))
    prompt = list(range(5, 45))
    try:
        [url] = driver.launch("check", str(model_dir), [list(range(1, tp + 1))])
        transport = CollectiveTransport(backend="nccl", bucket_mb=64.0, dtype="bfloat16", ranks_per_engine=tp)
        transport.connect("127.0.0.1", [url])
        stats = transport.send(learner.named_full_tensors(), 1)
        transport.close()

        async def probe() -> Any:
            async with EngineClient(url) as client:
                return await client.generate(prompt, {"max_new_tokens": 24, "temperature": 0.8, "ignore_eos": True})

        out = anyio.run(probe)
    finally:
        driver.shutdown()
    expected = {name: t.to(torch.bfloat16).float().cpu() for name, t in learner.named_full_tensors()}
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    reference.load_state_dict(expected, strict=False)
    with torch.no_grad():
        logits = reference(torch.tensor([prompt + out.output_ids])).logits[0, len(prompt) - 1:-1]
    ids = torch.tensor(out.output_ids)[:, None]
    at_08 = torch.log_softmax(logits / 0.8, -1).gather(1, ids)[:, 0]
    at_10 = torch.log_softmax(logits, -1).gather(1, ids)[:, 0]
    got = torch.tensor(out.logprobs)
    diff, diff_t1 = (got - at_08).abs(), (got - at_10).abs()
    return {
        "ok": out.weight_version == 1 and diff.mean().item() < 0.02 and diff.mean().item() < diff_t1.mean().item(),
        "tp_size": tp, "weight_version_after": out.weight_version,
        "mean_abs_logprob_diff_t08": diff.mean().item(), "max_abs_logprob_diff_t08": diff.max().item(),
        "mean_abs_logprob_diff_if_pre_temperature": diff_t1.mean().item(),
        **{k: float(v) for k, v in stats.items()},
    }
