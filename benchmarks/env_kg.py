"""Benchmark of the ``kg`` environment (agentrl-env-kg): store load, tool latency, memory,
and the full-set checks of the generated FB15k-237 questions.

    python benchmarks/env_kg.py [--quick] [--no-virtuoso]

Measures, on the bundled FB15k-237 graph:
* store load: cold (build the persisted Oxigraph store from the shipped files, in a fresh
  process, with its peak memory) and warm (open the built store read-only);
* tool-call latency p50/p99 per tool and for the final answer, replaying every question's
  gold tool sequence (the oracle) through the embedded store and through a private Virtuoso;
* gold answers computed twice for every question (its logical form as one SPARQL query,
  and the replay), agreement with the generator's answers, and the oracle's rewards;
* resident memory of the benchmark process before and after the runs.

Writes ``benchmarks/results/env_kg.json`` (``env_kg_quick.json`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parent


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def latency_summary(samples: dict[str, list[float]]) -> dict:
    out = {}
    everything = [v for vs in samples.values() for v in vs]
    for name, values in sorted({**samples, "all_tool_calls": [v for k, vs in samples.items() if k != "final_answer" for v in vs]}.items()):
        out[name] = {"n": len(values), "p50_ms": round(percentile(values, 50) * 1e3, 3), "p99_ms": round(percentile(values, 99) * 1e3, 3)}
    out["_total_calls"] = len(everything)
    return out


COLD = """
import json, resource, time, sys
t = time.perf_counter()
from agentrl_env_kg.config import KGConfig
from agentrl_env_kg.graphs import open_embedded
store, info = open_embedded(KGConfig(store_path=sys.argv[1]))
print(json.dumps({"seconds": time.perf_counter() - t, "statements": info["statements"],
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


async def replay_all(env, questions, *, check_forms: bool) -> dict:
    from agentrl_env_kg import lisp

    from agentrl_core.env import assistant_tool_call

    backend, _ = await env.backend()
    samples: dict[str, list[float]] = {}
    rewards, form_agree, replay_agree, n = 0, 0, 0, 0
    for split, indices in questions.items():
        for index in indices:
            q = env.question(split, index)
            oracle = env.oracle(split, index)
            session = await env.open(split, index)
            try:
                await session.start()
                for tool, args in oracle.calls:
                    t = time.perf_counter()
                    await session.step(assistant_tool_call(tool, args))
                    samples.setdefault(tool, []).append(time.perf_counter() - t)
                answer_var = session.api.variables[oracle.variables - 1]
                t = time.perf_counter()
                step = await session.step({"role": "assistant", "content": f"Final Answer: #{oracle.variables - 1}"})
                samples.setdefault("final_answer", []).append(time.perf_counter() - t)
                replayed = await session.api.execute(answer_var)
            finally:
                await session.close()
            n += 1
            rewards += step.reward == 1.0
            replay_agree += replayed == set(q.gold)
            if check_forms:
                form_answers = {r[0] for r in await backend.select(lisp.to_sparql(q.s_expression))}
                form_agree += form_answers == set(q.gold) == replayed
    return {
        "questions": n,
        "oracle_reward_1": rewards,
        "replay_equals_gold": replay_agree,
        "logical_form_query_equals_replay_equals_gold": form_agree if check_forms else None,
        "latency": latency_summary(samples),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 questions instead of all 3,700")
    parser.add_argument("--no-virtuoso", action="store_true", help="skip the Virtuoso run")
    args = parser.parse_args()

    from agentrl_env_kg.config import KGConfig
    from agentrl_env_kg.env import KGEnvironment
    from agentrl_env_kg.graphs import open_embedded

    result: dict = {
        "benchmark": "env_kg",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "loadavg_at_start": os.getloadavg()},
        "parameters": {"quick": args.quick},
    }
    work = Path(tempfile.mkdtemp(prefix="env-kg-bench-"))
    store_path = work / "store"

    # Cold: a fresh process builds the store from the shipped files.
    cold = json.loads(subprocess.run([sys.executable, "-c", COLD, str(store_path)], capture_output=True, text=True,
                                     check=True).stdout)
    # Warm: open the persisted store (median of 5 opens).
    rss_before = rss_mb()
    warm_times = []
    for _ in range(5):
        t = time.perf_counter()
        handle, _ = open_embedded(KGConfig(store_path=str(store_path)))
        warm_times.append(time.perf_counter() - t)
        del handle
    result["store_load"] = {
        "cold_build_seconds": round(cold["seconds"], 2),
        "cold_build_peak_rss_mb": round(cold["peak_rss_mb"], 1),
        "statements": cold["statements"],
        "warm_open_seconds_median": round(sorted(warm_times)[2], 4),
        "store_disk_mb": round(sum(p.stat().st_size for p in store_path.rglob("*") if p.is_file()) / 2**20, 1),
    }
    print("store load", result["store_load"], flush=True)

    env = KGEnvironment(KGConfig(store_path=str(store_path)))
    sets = env.index_sets()
    if args.quick:
        questions = {split: list(idx)[: {"fb-train": 120, "fb-dev": 30, "fb-test": 50}[split]] for split, idx in sets.items()}
    else:
        questions = {split: list(idx) for split, idx in sets.items()}
    result["parameters"]["questions"] = {k: len(v) for k, v in questions.items()}

    async def embedded_run():
        out = await replay_all(env, questions, check_forms=True)
        await env.aclose()
        return out

    t = time.perf_counter()
    result["embedded"] = anyio.run(embedded_run)
    result["embedded"]["seconds"] = round(time.perf_counter() - t, 1)
    result["memory"] = {"rss_mb_before_runs": round(rss_before, 1), "rss_mb_after_embedded_run": round(rss_mb(), 1)}
    print("embedded", {k: v for k, v in result["embedded"].items() if k != "latency"}, flush=True)

    if not args.no_virtuoso:
        from agentrl_env_kg.virtuoso import VirtuosoServer

        nt = work / "graph.nt"
        from agentrl_env_kg.fb15k237 import Graph

        Graph().write_ntriples(nt)
        with VirtuosoServer(work / "virtuoso") as server:
            t = time.perf_counter()
            load_seconds = server.load([nt])
            remote = KGEnvironment(KGConfig(backend="sparql", endpoint=server.endpoint))

            async def remote_run():
                out = await replay_all(remote, questions, check_forms=True)
                await remote.aclose()
                return out

            t = time.perf_counter()
            result["virtuoso"] = anyio.run(remote_run)
            result["virtuoso"]["seconds"] = round(time.perf_counter() - t, 1)
            result["virtuoso"]["bulk_load_seconds"] = round(load_seconds, 1)
        print("virtuoso", {k: v for k, v in result["virtuoso"].items() if k != "latency"}, flush=True)

    result["memory"]["rss_mb_end"] = round(rss_mb(), 1)
    result["memory"]["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    result["machine"]["loadavg_at_end"] = os.getloadavg()
    out = ROOT / "results" / ("env_kg_quick.json" if args.quick else "env_kg.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["embedded"]["latency"]["all_tool_calls"]), "->", out)


if __name__ == "__main__":
    main()
