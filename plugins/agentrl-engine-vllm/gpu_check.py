"""The vllm engine on a GPU machine: the checks that cannot run on CPU. NOT RUN YET (no GPU so far).

    python plugins/agentrl-engine-vllm/gpu_check.py [--model DIR] [--out results.json]

Needs CUDA and the GPU build of vLLM (``pip install './plugins/agentrl-engine-vllm[vllm]'``).
On one GPU: a vllm engine on cuda:0 (fp32, CUDA graphs), log-prob parity with a transformers
forward, a disk update checked bit for bit (weights stay torch parameters on GPU, so the
digests read them directly). With two GPUs or more, also the ``vllm_nccl`` transport: the
learner on cuda:1 broadcasts to the engine on cuda:0 through vLLM's NCCL weight transfer,
checked bit for bit (NCCL refuses two ranks on one GPU, so one GPU cannot test it).
Each check prints one line; the JSON has the numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import anyio
import torch

from agentrl_core.config import EngineConfig
from agentrl_core.rollout.engine_client import EngineClient
from agentrl_core.tinymodel import init_model
from agentrl_core.train.weight_sync import DiskTransport


def greedy_and_logprobs(url: str, prompt: list[int], n: int, temperature: float):
    async def main():
        async with EngineClient(url) as client:
            return await client.generate(prompt, {"temperature": temperature, "max_new_tokens": n,
                                                  "ignore_eos": True, "sampling_seed": 1})

    return anyio.run(main)


def parity(model, prompt: list[int], result, temperature: float) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + result.output_ids], device=model.device)).logits[0, len(prompt) - 1:-1]
    ref = torch.log_softmax(logits.float() / (temperature or 1.0), -1).gather(
        -1, torch.tensor(result.output_ids, device=model.device)[:, None])[:, 0].cpu()
    return float((ref - torch.tensor(result.logprobs)).abs().max())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a HF model directory (default: agentrl's tiny model)")
    parser.add_argument("--out", default="vllm_gpu_check.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this script checks the GPU paths of the vllm engine", file=sys.stderr)
        return 2
    from agentrl_engine_vllm.driver import VLLMDriver
    from agentrl_engine_vllm.nccl_transport import VLLMNCCLTransport
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    work = Path(tempfile.mkdtemp(prefix="vllm-gpu-check-"))
    model_dir = Path(args.model) if args.model else init_model(work / "tiny", "tiny", seed=0)
    out: dict = {"gpus": torch.cuda.device_count(), "model": str(model_dir)}
    learner_device = "cuda:1" if torch.cuda.device_count() > 1 else "cuda:0"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(learner_device).eval()
    config = EngineConfig(driver="vllm", device="cuda", options={"vllm": {
        "dtype": "float32", "max_model_len": 2048, "gpu_memory_utilization": 0.3}})
    prompt = [11, 12, 13, 14, 15]
    with VLLMDriver(engine=config, log_dir=str(work / "logs")) as driver:
        start = time.perf_counter()
        [url] = driver.launch("gpu", str(model_dir), [[0]])
        out["startup_s"] = round(time.perf_counter() - start, 1)
        for temperature in (1.0, 0.7, 0.0):
            result = greedy_and_logprobs(url, prompt, 32, temperature)
            out[f"parity_T{temperature}"] = parity(model, prompt, result, temperature)
            print(f"log-prob parity at T={temperature}: max |diff| {out[f'parity_T{temperature}']:.2e}", flush=True)

        generator = torch.Generator().manual_seed(0)
        new = {n: (p.detach().cpu() + 0.02 * torch.randn(p.shape, generator=generator)) for n, p in model.named_parameters()}
        disk = DiskTransport(disk_path=str(work / "sync"), model_dir=str(model_dir))
        disk.connect(None, [url])
        try:
            out["disk"] = disk.send(iter(new.items()), 1)  # the front checks the digests: a difference raises
        finally:
            disk.close()
        model.load_state_dict(new, strict=False)
        result = greedy_and_logprobs(url, prompt, 32, 0.0)
        out["disk_parity"] = parity(model, prompt, result, 0.0)
        print(f"disk update, version {result.weight_version}, bit-exact; parity {out['disk_parity']:.2e}", flush=True)

        if torch.cuda.device_count() > 1:
            torch.cuda.set_device(1)
            nccl = VLLMNCCLTransport(bucket_mb=64, verify=True)
            nccl.connect("127.0.0.1", [url])
            try:
                newer = [(n, p.detach() + 0.02) for n, p in model.named_parameters()]
                out["nccl"] = nccl.send(iter(newer), 2)  # verify=True: raises on any difference
            finally:
                nccl.close()
            model.load_state_dict(dict(newer), strict=False)
            result = greedy_and_logprobs(url, prompt, 32, 0.0)
            out["nccl_parity"] = parity(model, prompt, result, 0.0)
            print(f"vllm_nccl update, version {result.weight_version}, bit-exact; parity {out['nccl_parity']:.2e}",
                  flush=True)
        else:
            print("one GPU: the vllm_nccl transport needs the learner on another GPU; skipped", flush=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
