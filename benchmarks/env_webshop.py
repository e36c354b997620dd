"""WebShop environment benchmark: index build, search latency, oracle success, worker memory.

    python benchmarks/env_webshop.py [--quick] [--out benchmarks/results/env_webshop.json]

Runs in a fresh child process (so its memory is that of one environment worker: catalog,
BM25 index, spaCy model, sessions) with the bundled catalog:

1. catalog load time; BM25 index build time without a cache, then load time from the cache;
2. search latency p50/p99 over the keyword queries of the goals (what the oracle types);
3. the oracle on every bundled goal (``--quick``: 300), 32 sessions at a time through the
   session API: success rate (reward 1), mean reward, episodes per second, failures;
4. peak and final resident memory of that process (target: at most 1 GB; upstream WebShop
   needs about 16 GB for its full catalog);
5. (not with ``--quick``) search at a larger scale, in another fresh process: the bundled
   documents replicated to ``--scale`` (default 100,000) documents, with index build time,
   search latency and memory, to extrapolate towards the real catalog.

The machine is shared: the load average before and after is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _memory_mb() -> dict[str, float]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "VmRSS:")):
                key, value = line.split(":")
                out[{"VmHWM": "peak_rss_mb", "VmRSS": "rss_mb"}[key]] = round(int(value.split()[0]) / 1024, 1)
    return out


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def worker(quick: bool) -> dict:
    """The measured process: one environment, as a task worker holds it."""
    import anyio
    from agentrl_env_webshop.config import WebShopConfig
    from agentrl_env_webshop.env import WebShopEnvironment
    from agentrl_env_webshop.keywords import instruction_keywords
    from agentrl_env_webshop.search import SearchIndex, product_document

    from agentrl_core.env import play_episode

    result: dict = {"memory_at_start": _memory_mb()}
    cache = tempfile.mkdtemp(prefix="webshop-bench-")
    started = time.perf_counter()
    env = WebShopEnvironment(WebShopConfig(index_cache_dir=cache))
    shop = env.shop
    result["catalog"] = {"products": len(shop.products), "goals": len(shop.goals),
                         "load_seconds": round(time.perf_counter() - started, 3)}
    index = shop.index()  # no cache yet: built
    ids, docs = [p["asin"] for p in shop.products], [product_document(p) for p in shop.products]
    again = SearchIndex.build(ids, docs, cache)
    result["index"] = {"build_seconds": round(index.build_seconds, 3), "built_from_scratch": not index.loaded_from_cache,
                       "cache_load_seconds": round(again.build_seconds, 3), "loaded_from_cache": again.loaded_from_cache}

    goals = shop.goals[:300] if quick else shop.goals
    queries = [instruction_keywords(g["instruction_text"]) for g in goals]
    latencies = []
    for query in queries:
        t = time.perf_counter()
        shop.search(query)
        latencies.append((time.perf_counter() - t) * 1000)
    result["search"] = {"queries": len(queries), "p50_ms": round(_percentile(latencies, 0.5), 3),
                        "p99_ms": round(_percentile(latencies, 0.99), 3), "max_ms": round(max(latencies), 3)}

    pairs = [(split, i) for split, indices in env.index_sets().items() for i in indices]
    pairs.sort(key=lambda p: p[1])
    if quick:
        pairs = pairs[:300]
    rewards: dict[tuple[str, int], float] = {}
    failures = []

    async def sweep() -> None:
        limiter = anyio.Semaphore(32)

        async def one(split: str, index: int) -> None:
            async with limiter:
                episode = await play_episode(env, split, index, env.oracle(split, index))
            rewards[(split, index)] = episode.reward
            if episode.reward != 1.0:
                failures.append({"split": split, "index": index, "reward": episode.reward,
                                 "status": episode.status.value})

        async with anyio.create_task_group() as tg:
            for split, index in pairs:
                tg.start_soon(one, split, index)
        await env.aclose()

    t = time.perf_counter()
    anyio.run(sweep)
    seconds = time.perf_counter() - t
    per_split = {}
    for split in env.index_sets():
        values = [r for (s, _), r in rewards.items() if s == split]
        if values:
            per_split[split] = {"episodes": len(values), "success_rate": round(sum(v == 1.0 for v in values) / len(values), 4)}
    result["oracle"] = {
        "episodes": len(rewards),
        "success_rate": round(sum(r == 1.0 for r in rewards.values()) / len(rewards), 4),
        "mean_reward": round(sum(rewards.values()) / len(rewards), 4),
        "seconds": round(seconds, 1),
        "episodes_per_second": round(len(rewards) / seconds, 1),
        "concurrent_sessions": 32,
        "per_split": per_split,
        "failures": failures[:20],
    }
    result["memory"] = {**_memory_mb(), "target_mb": 1024}
    return result


def scale(n_docs: int) -> dict:
    """Index build and search latency over ``n_docs`` documents (the bundled ones, replicated)."""
    from agentrl_env_webshop.config import WebShopConfig
    from agentrl_env_webshop.keywords import instruction_keywords
    from agentrl_env_webshop.search import SearchIndex, product_document
    from agentrl_env_webshop.shop import Shop

    shop = Shop.load(WebShopConfig(index_cache_dir=""))
    base = [product_document(p) for p in shop.products]
    ids = [f"{p['asin']}-{k}" for k in range(n_docs // len(base) + 1) for p in shop.products][:n_docs]
    docs = [base[i % len(base)] for i in range(n_docs)]
    index = SearchIndex.build(ids, docs)
    latencies = []
    for goal in shop.goals[:1000]:
        t = time.perf_counter()
        index.search(instruction_keywords(goal["instruction_text"]))
        latencies.append((time.perf_counter() - t) * 1000)
    return {"documents": n_docs, "build_seconds": round(index.build_seconds, 2),
            "search_p50_ms": round(_percentile(latencies, 0.5), 3), "search_p99_ms": round(_percentile(latencies, 0.99), 3),
            **_memory_mb()}


def _child(*args: str) -> dict:
    child = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=False)
    if child.returncode != 0:
        raise RuntimeError(f"benchmark child {args} failed:\n{child.stderr}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="300 goals instead of all")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "env_webshop.json"))
    parser.add_argument("--scale", type=int, default=100_000, help="documents for the scale measurement (0: skip)")
    parser.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_scale", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._worker:
        print(json.dumps(worker(args.quick)))
        return 0
    if args._scale:
        print(json.dumps(scale(args._scale)))
        return 0
    load_before = os.getloadavg()
    t = time.perf_counter()
    measured = _child("--_worker", *(["--quick"] if args.quick else []))
    if not args.quick and args.scale:
        measured["scale"] = _child("--_scale", str(args.scale))
    report = {
        "benchmark": "env_webshop",
        "quick": args.quick,
        **measured,
        "wall_seconds": round(time.perf_counter() - t, 1),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_avg_before": [round(x, 2) for x in load_before],
                    "load_avg_after": [round(x, 2) for x in os.getloadavg()],
                    "date": datetime.now(timezone.utc).isoformat(timespec="seconds")},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    o, s, m = report["oracle"], report["search"], report["memory"]
    print(f"catalog {report['catalog']['products']} products / {report['catalog']['goals']} goals, "
          f"loaded in {report['catalog']['load_seconds']}s; index built in {report['index']['build_seconds']}s "
          f"(cache load {report['index']['cache_load_seconds']}s)")
    print(f"search p50 {s['p50_ms']} ms, p99 {s['p99_ms']} ms over {s['queries']} queries")
    print(f"oracle: {o['success_rate']:.2%} reward 1 over {o['episodes']} episodes ({o['episodes_per_second']}/s)")
    print(f"memory: peak {m['peak_rss_mb']} MB, final {m['rss_mb']} MB (target {m['target_mb']} MB)")
    if "scale" in report:
        sc = report["scale"]
        print(f"scale: {sc['documents']} documents, index built in {sc['build_seconds']}s, search p50 "
              f"{sc['search_p50_ms']} ms / p99 {sc['search_p99_ms']} ms, peak {sc['peak_rss_mb']} MB")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
