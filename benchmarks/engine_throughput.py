"""Tokens/s of the hf engine under concurrent streams, against plain ``transformers`` generate.

For each model size (``agentrl model init --size tiny|small``, fp32, CPU):

* ``hf_sequential``: one request at a time with ``model.generate`` (the floor);
* ``hf_static_batch``: one ``model.generate`` over 32 equal prompts (the ceiling: no
  arrivals, no varied lengths, no HTTP, no log-probs);
* ``engine_static_batch``: the same 32 equal requests sent at once to the engine;
* ``engine_streams_N`` (N = 1, 8, 32, 64): N closed-loop streams with staggered starts
  and varied prompt and completion lengths, each request with ``return_logprob``,
  through HTTP to an ``agentrl engine serve`` process (the hf driver). ``tokens_per_s``
  is the steady rate while all N streams are active (from the engine's token counter);
  ``tokens_per_s_overall`` includes the ramp-up and the tail where streams run out.

With ``--engines hf vllm`` (in an environment with ``agentrl-engine-vllm`` and vLLM: see
plugins/agentrl-engine-vllm/README.md) the same static batch and streams also run against a
vLLM server behind the vllm driver (fp32, eager; column ``vllm`` of each size), before the hf
engine's measurements; e.g. ``--sizes tiny --rounds 1 --streams 1 32 --engines hf vllm --out
benchmarks/results/engine_throughput_vllm.json``.

Targets (issue 4): at 32 streams >= 5x ``hf_sequential`` and >= 70 % of ``hf_static_batch``.
The CPU is shared with other work and its load drifts, so the four measurements the targets
use run in alternating rounds (``--rounds``, the engine idle while transformers runs) and the
targets use their medians; every round and the load average are in the JSON. Every run uses
the same number of torch threads.

    python benchmarks/engine_throughput.py [--quick] [--sizes tiny small] [--threads 1] [--rounds 3]
        [--engines hf vllm]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
import torch

from agentrl_core.config import EngineConfig, HFEngineOptions
from agentrl_core.rollout.engine_client import EngineClient, EnginePool
from agentrl_core.rollout.hf_driver import HFDriver
from agentrl_core.tinymodel import init_model

RESULTS = Path(__file__).parent / "results" / "engine_throughput.json"


def load() -> float:
    return round(os.getloadavg()[0], 2)


def hf_generate(model, prompts: torch.Tensor, new_tokens: int) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                       pad_token_id=0)
    return time.perf_counter() - start


def make_requests(rng: random.Random, vocab: int, count: int, prompt: int, new: int, varied: bool):
    out = []
    for _ in range(count):
        p = rng.randint(prompt // 2, prompt * 3 // 2) if varied else prompt
        g = rng.randint(new // 2, new * 3 // 2) if varied else new
        out.append(([rng.randrange(vocab) for _ in range(p)], g))
    return out


async def run_streams(url: str, streams: list[list[tuple[list[int], int]]], stagger: float) -> dict:
    """Closed-loop streams; throughput overall and in the steady window while every stream is active.

    The window opens when the last stream has started and closes when the first stream has
    sent its last request's answer; the engine's own token counter is read at both ends.
    """
    tokens = 0
    latencies = []
    started = anyio.Event()
    first_done = anyio.Event()
    pending_start = len(streams)
    async with EnginePool("bench", [url]) as pool:
        engine = pool.engines[pool.urls[0]]

        async def stream(i: int, requests) -> None:
            nonlocal tokens, pending_start
            await anyio.sleep(i * stagger)  # staggered arrivals (workload shape, not synchronization)
            pending_start -= 1
            if pending_start == 0:
                started.set()
            for ids, new in requests:
                t0 = time.perf_counter()
                result = await pool.generate(f"s{i}", ids, {"max_new_tokens": new, "temperature": 1.0,
                                                            "ignore_eos": True})
                latencies.append(time.perf_counter() - t0)
                tokens += len(result.output_ids)
            first_done.set()

        async def window(box: dict) -> None:
            await started.wait()
            box["t0"], box["n0"] = time.perf_counter(), (await engine.server_info())["generated_tokens"]
            await first_done.wait()
            box["t1"], box["n1"] = time.perf_counter(), (await engine.server_info())["generated_tokens"]

        box: dict = {}
        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            tg.start_soon(window, box)
            for i, requests in enumerate(streams):
                tg.start_soon(stream, i, requests)
        wall = time.perf_counter() - start
    latencies.sort()
    steady = (box["n1"] - box["n0"]) / max(box["t1"] - box["t0"], 1e-9)
    return {"tokens": tokens, "seconds": round(wall, 3), "tokens_per_s_overall": round(tokens / wall, 1),
            "tokens_per_s": round(steady, 1), "steady_window_s": round(box["t1"] - box["t0"], 3),
            "p50_latency_s": round(latencies[len(latencies) // 2], 3), "requests": len(latencies)}


async def server_stats(url: str) -> dict:
    async with EngineClient(url) as client:
        return await client.server_info()


def bench_size(size: str, args: argparse.Namespace, workdir: Path) -> dict:
    from transformers import AutoModelForCausalLM

    model_dir = init_model(workdir / size, size, seed=0)
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    prompt, new = args.prompt_tokens, args.new_tokens[size]
    rng = random.Random(0)
    out: dict = {"model": {"size": size, "parameters": sum(p.numel() for p in model.parameters()),
                           "prompt_tokens": prompt, "new_tokens": new}}

    sequential = make_requests(rng, vocab, 2 if args.quick else 4, prompt, new, varied=False)
    batch = torch.tensor([ids for ids, _ in make_requests(rng, vocab, 32, prompt, new, varied=False)])
    hf_generate(model, batch[:2], 4)  # warm-up

    def measure(fn) -> dict:
        before = load()
        result = fn()
        return {**result, "load_before": before, "load_after": load()}

    def hf_sequential() -> dict:
        seconds = sum(hf_generate(model, torch.tensor([ids]), g) for ids, g in sequential)
        return {"tokens_per_s": round(len(sequential) * new / seconds, 1), "requests": len(sequential)}

    def hf_static() -> dict:
        return {"tokens_per_s": round(32 * new / hf_generate(model, batch, new), 1), "batch": 32}

    config = EngineConfig(device="cpu", hf=HFEngineOptions(max_running_requests=64, threads=args.threads,
                                                           dtype="float32"))
    rounds: dict[str, list[dict]] = {"hf_sequential": [], "hf_static_batch": [], "engine_static_batch": [],
                                     "engine_streams_32": []}
    def engine_static(url: str) -> dict:
        static = anyio.run(run_streams, url, [[(row.tolist(), new)] for row in batch], 0.0)
        static["tokens_per_s"] = static.pop("tokens_per_s_overall")  # like hf_static_batch: prefill included
        static.pop("steady_window_s")
        return static

    def engine_streams(url: str, n: int) -> dict:
        streams = [make_requests(rng, vocab, args.requests_per_stream, prompt, new, varied=True)
                   for _ in range(n)]
        stats0 = anyio.run(server_stats, url)
        result = anyio.run(run_streams, url, streams, args.stagger)
        stats1 = anyio.run(server_stats, url)
        if "decode_steps" not in stats1:  # vLLM does not report its steps
            return result
        steps = stats1["decode_steps"] - stats0["decode_steps"]
        generated = stats1["generated_tokens"] - stats0["generated_tokens"]
        return {**result, "mean_batch": round(generated / max(steps, 1), 1)}

    if "vllm" in args.engines:
        out["vllm"] = bench_vllm(model_dir, workdir / f"logs-vllm-{size}", args, engine_static, engine_streams,
                                 measure)
    if "hf" not in args.engines:
        return out
    with HFDriver(config, log_dir=str(workdir / f"logs-{size}")) as driver:
        [url] = driver.launch("bench", str(model_dir), ["cpu"])
        anyio.run(run_streams, url, [[(batch[0].tolist(), 4)]], 0.0)  # warm-up

        for r in range(args.rounds):
            rounds["hf_sequential"].append(measure(hf_sequential))
            rounds["hf_static_batch"].append(measure(hf_static))
            rounds["engine_static_batch"].append(measure(lambda: engine_static(url)))
            rounds["engine_streams_32"].append(measure(lambda: engine_streams(url, 32)))
            print(f"  {size} round {r + 1}: " + ", ".join(
                f"{k} {v[-1]['tokens_per_s']}" for k, v in rounds.items()), flush=True)
        for n in args.streams:
            if n != 32:
                out[f"engine_streams_{n}"] = measure(lambda n=n: engine_streams(url, n))
                print(f"  {size} streams={n}: {out[f'engine_streams_{n}']['tokens_per_s']} tok/s", flush=True)
    for name, results in rounds.items():
        out[name] = {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in results), "rounds": results}
    seq, ceiling = out["hf_sequential"]["tokens_per_s"], out["hf_static_batch"]["tokens_per_s"]
    at32 = out["engine_streams_32"]["tokens_per_s"]
    out["targets"] = {
        "streams32_vs_sequential": round(at32 / seq, 2),
        "streams32_vs_static_batch": round(at32 / ceiling, 3),
        "engine_static_vs_hf_static": round(out["engine_static_batch"]["tokens_per_s"] / ceiling, 3),
        "goal": "streams32_vs_sequential >= 5 and streams32_vs_static_batch >= 0.7 (medians of the rounds)",
    }
    return out


def bench_vllm(model_dir: Path, log_dir: Path, args: argparse.Namespace, engine_static, engine_streams,
               measure) -> dict:
    """The same engine measurements against a vLLM server (agentrl-engine-vllm), fp32, eager.

    vLLM's CPU backend binds its compute threads itself (VLLM_CPU_OMP_THREADS_BIND=auto: one
    core of the two here, the other left to its front end), so ``--threads`` does not apply.
    """
    from agentrl_engine_vllm.driver import VLLMDriver

    config = EngineConfig(driver="vllm", device="cpu", options={"vllm": {"dtype": "float32", "max_num_seqs": 64,
                                                                        "max_model_len": 1024}})
    out: dict = {}
    with VLLMDriver(engine=config, log_dir=str(log_dir)) as driver:
        start = time.perf_counter()
        [url] = driver.launch("bench", str(model_dir), [])
        out["startup_s"] = round(time.perf_counter() - start, 1)
        anyio.run(run_streams, url, [[([1, 2, 3, 4], 4)]], 0.0)  # warm-up
        out["engine_static_batch"] = measure(lambda: engine_static(url))
        for n in args.streams:
            out[f"engine_streams_{n}"] = measure(lambda n=n: engine_streams(url, n))
            print(f"  vllm streams={n}: {out[f'engine_streams_{n}']['tokens_per_s']} tok/s", flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny only, fewer and shorter requests")
    parser.add_argument("--sizes", nargs="+", default=None, choices=["tiny", "small"])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of every run (1: on a shared machine OpenMP spinning distorts more)")
    parser.add_argument("--streams", nargs="+", type=int, default=[1, 8, 32, 64])
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 3, quick 2)")
    parser.add_argument("--engines", nargs="+", default=["hf"], choices=["hf", "vllm"],
                        help="vllm needs agentrl-engine-vllm and vLLM installed (plugins/agentrl-engine-vllm)")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    args.sizes = args.sizes or (["tiny"] if args.quick else ["tiny", "small"])
    args.prompt_tokens = 64
    args.new_tokens = {"tiny": 64, "small": 32} if args.quick else {"tiny": 128, "small": 64}
    args.requests_per_stream = 3
    args.rounds = args.rounds or (2 if args.quick else 3)
    args.stagger = 0.02
    results = {
        "benchmark": "engine_throughput",
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "cpus": os.cpu_count(),
                    "torch": torch.__version__, "threads": args.threads, "load_at_start": load()},
        "parameters": {"quick": args.quick, "streams": args.streams, "requests_per_stream": args.requests_per_stream,
                       "rounds": args.rounds,
                       "stagger_s": args.stagger, "prompt_tokens": "uniform [P/2, 3P/2] per request",
                       "new_tokens": "uniform [G/2, 3G/2] per request (streams); G (static)",
                       "dtype": "float32", "temperature": 1.0, "engines": args.engines},
        "sizes": {},
    }
    with tempfile.TemporaryDirectory(prefix="engine-bench-") as tmp:
        for size in args.sizes:
            print(f"benchmarking {size} ...", flush=True)
            results["sizes"][size] = bench_size(size, args, Path(tmp))
            t = results["sizes"][size].get("targets")
            if t is None:
                continue
            print(f"  {size}: 32 streams = {t['streams32_vs_sequential']}x sequential, "
                  f"{t['streams32_vs_static_batch']} of the static batch", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
