"""Short GPU check for a lent device: hf engine on CUDA with log-prob parity, then learner hooks.

    python benchmarks/gpu/check.py [--device cuda] [--size small] [--model DIR] [--out FILE]

1. ``engine``: an hf engine (``EngineServer`` in this process) on the device in fp32 (TF32
   off) serves 16 concurrent requests with varied lengths; every returned log-prob is
   compared with a plain ``transformers`` forward of the same weights on the same device
   (max |diff| reported, must be < 1e-4 ... 1e-3 on GPU kernels). Then tokens/s at 1, 32 and
   64 streams in bf16.
2. ``engine_disk_update``: pause -> update_weights_from_disk (perturbed weights) -> continue;
   new tokens carry version 1 and match the new weights.
3. ``fsdp_step`` and ``weight_sync_tp1`` (``learner_hooks.py``): one FSDP2 step (bf16 params,
   fp32 reduce on CUDA); the collective transport into an hf engine process (NCCL with two
   GPUs, gloo with one; weights in bf16 as ``weight_sync.dtype: auto`` sends them), checked by
   the engine's log-probs under the learner's new weights.
4. ``placement`` (``cluster_hooks.py``): Ray places a learner rank and an hf engine as
   ``agentrl train`` does; disjoint GPUs in async mode (two or more GPUs), the same GPU
   colocated (one GPU); on CPU, disjoint cores.
5. ``colocated_sync`` (``learner_hooks.py``): engine and learner on cuda:0, one sync-mode step
   as ``agentrl train`` runs it: the backend chosen for a shared GPU (gloo), the engine's
   memory released around the learner step and resumed before the sync, GPU memory
   (``torch.cuda.mem_get_info``, ``memory_allocated``) at each point. Skipped on CPU with a note.
6. ``sglang_weight_sync_tp1`` / ``_tp2``: SGLang with TP 1 and 2 joins the learner's NCCL group
   with every TP rank, receives bf16 weights, and its log-probs at temperature 0.8 match the
   learner's new weights (needs ``sglang`` and TP + 1 GPUs, else reported as skipped).

Writes ``benchmarks/results/gpu_check.json`` (or ``--out``). Runs on CPU too (``--device cpu``),
which is how it is smoke-tested on machines without a GPU. One run on a one-GPU machine takes
about 3-5 minutes (the SGLang steps are skipped there: they need two and three GPUs).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path

import anyio
import torch

sys.path.insert(0, str(Path(__file__).parent))

import cluster_hooks
import learner_hooks

from agentrl_core.engine.process import BackgroundEngine
from agentrl_core.engine.server import EngineServer
from agentrl_core.rollout.engine_client import EngineClient, EnginePool
from agentrl_core.tinymodel import init_model

RESULTS = Path(__file__).parents[1] / "results" / "gpu_check.json"


def reference_logprobs(model, prompt, output, temperature=1.0):
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output], device=device)).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, -1).gather(1, torch.tensor(output, device=device)[:, None])[:, 0]


async def concurrent(url, jobs):
    results = {}
    async with EnginePool("check", [url]) as pool:
        async def one(i, ids, params):
            results[i] = await pool.generate(f"k{i}", ids, params)

        async with anyio.create_task_group() as tg:
            for i, (ids, params) in enumerate(jobs):
                tg.start_soon(one, i, ids, params)
    return [results[i] for i in range(len(jobs))]


def engine_parity(model_dir: Path, device: str, vocab: int) -> dict:
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rng = random.Random(0)
    jobs = [([rng.randrange(vocab) for _ in range(rng.randint(4, 200))],
             {"max_new_tokens": rng.randint(8, 64), "temperature": 1.0, "ignore_eos": True}) for _ in range(16)]
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    with BackgroundEngine(EngineServer(model_dir, device=device, dtype="float32", max_running_requests=32)) as bg:
        results = anyio.run(concurrent, bg.url, jobs)
    worst = 0.0
    for (ids, _), result in zip(jobs, results, strict=True):
        expected = reference_logprobs(reference, ids, result.output_ids).cpu()
        worst = max(worst, (torch.tensor(result.logprobs) - expected).abs().max().item())
    return {"ok": worst < 1e-3, "max_abs_logprob_diff": worst, "requests": len(jobs),
            "tokens": sum(len(r.output_ids) for r in results)}


def engine_throughput(model_dir: Path, device: str, vocab: int, dtype: str) -> dict:
    rng = random.Random(1)
    out = {}
    with BackgroundEngine(EngineServer(model_dir, device=device, dtype=dtype, max_running_requests=64)) as bg:
        anyio.run(concurrent, bg.url, [([1, 2, 3], {"max_new_tokens": 4})])  # warm-up
        for streams in (1, 32, 64):
            jobs = [([rng.randrange(vocab) for _ in range(rng.randint(32, 96))],
                     {"max_new_tokens": rng.randint(64, 192), "temperature": 1.0, "ignore_eos": True})
                    for _ in range(streams)]
            start = time.perf_counter()
            results = anyio.run(concurrent, bg.url, jobs)
            seconds = time.perf_counter() - start
            out[f"streams_{streams}"] = round(sum(len(r.output_ids) for r in results) / seconds, 1)
    return {"ok": True, "dtype": dtype, "tokens_per_s": out}


def engine_disk_update(model_dir: Path, device: str, workdir: Path) -> dict:
    from transformers import AutoModelForCausalLM

    other = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(3)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    other.save_pretrained(workdir / "perturbed")
    other = other.to(device).eval()

    async def run(url):
        async with EngineClient(url) as client:
            await client.pause_generation()
            await client.update_weights_from_disk(str(workdir / "perturbed"), weight_version=1)
            await client.continue_generation()
            return await client.generate([5, 6, 7, 8], {"max_new_tokens": 16, "ignore_eos": True})

    with BackgroundEngine(EngineServer(model_dir, device=device, dtype="float32")) as bg:
        result = anyio.run(run, bg.url)
    diff = (torch.tensor(result.logprobs) - reference_logprobs(other, [5, 6, 7, 8], result.output_ids).cpu()).abs()
    return {"ok": result.weight_version == 1 and diff.max().item() < 1e-3, "weight_version": result.weight_version,
            "max_abs_logprob_diff": diff.max().item()}


def hook(name, fn, *args) -> dict:
    try:
        return fn(*args)
    except NotImplementedError as exc:
        return {"ok": None, "status": "not provided", "note": str(exc)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", default="small", choices=["tiny", "small"])
    parser.add_argument("--model", default=None, help="a model directory (default: agentrl model init --size)")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--only", nargs="*", default=None, help="run only these steps (default: all)")
    args = parser.parse_args()
    report = {"check": "gpu", "date": dt.datetime.now().isoformat(timespec="seconds"), "device": args.device,
              "machine": {"platform": platform.platform(), "torch": torch.__version__,
                          "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None},
              "steps": {}}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        workdir = Path(tmp)
        model_dir = Path(args.model) if args.model else init_model(workdir / args.size, args.size)
        from transformers import AutoConfig

        vocab = AutoConfig.from_pretrained(model_dir).vocab_size
        steps = {
            "engine_parity": lambda: engine_parity(model_dir, args.device, vocab),
            "engine_throughput": lambda: engine_throughput(
                model_dir, args.device, vocab, "bfloat16" if args.device.startswith("cuda") else "float32"),
            "engine_disk_update": lambda: engine_disk_update(model_dir, args.device, workdir),
            "fsdp_step": lambda: hook("fsdp_step", learner_hooks.fsdp_step, args.device, workdir, model_dir),
            "weight_sync_tp1": lambda: hook("weight_sync", learner_hooks.weight_sync, args.device, workdir, model_dir,
                                            ""),
            "placement": lambda: cluster_hooks.placement(args.device, workdir, model_dir),
            "colocated_sync": lambda: learner_hooks.colocated_sync(args.device, workdir, model_dir),
            "sglang_weight_sync_tp1": lambda: cluster_hooks.sglang_weight_sync(args.device, workdir, model_dir, 1),
            "sglang_weight_sync_tp2": lambda: cluster_hooks.sglang_weight_sync(args.device, workdir, model_dir, 2),
        }
        for name, step in steps.items():
            if args.only and name not in args.only:
                continue
            start = time.perf_counter()
            try:
                result = step()
            except Exception as exc:
                result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
            result["seconds"] = round(time.perf_counter() - start, 2)
            report["steps"][name] = result
            print(f"{name}: {json.dumps({k: v for k, v in result.items() if k != 'trace'})}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0 if all(s.get("ok") is not False for s in report["steps"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
