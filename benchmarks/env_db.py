"""DB environment benchmark: oracle rates, session latency, queries/s, leak test.

    python benchmarks/env_db.py [--quick] [--url mysql://root@127.0.0.1:3306] [--out PATH]

Needs agentrl-env-db installed. Without ``--url`` it starts a private MariaDB
(``agentrl_env_db.server.PrivateMariaDB``: tmpfs datadir, no fsync) and stops it at the end.
Measured, on MariaDB and on the embedded SQLite backend:

1. oracle over the full ``std``, ``dev`` and ``gen-train`` sets: reward-1 rate, and every
   miss with its cause (the last observation and the known reason);
2. session start and close latency, sequential (p50/p90/p99) and with 16 concurrent starts;
3. queries per second: one session in a closed loop, and 16 sessions at once;
4. leaks: 200 sessions (``--quick``: 60) with random cancels, plus a worker process killed
   with SIGKILL while holding sessions; then the sweeper at environment start; the
   server must hold no session database or user afterwards.

The machine is shared: the load average before and after each phase is recorded.

    python benchmarks/env_db.py --replay --transcripts DIR [--backends sqlite,mariadb] [--out PATH]

replays AgentBench-FC run logs instead (``<model>/dbbench-std/runs.jsonl``, not part of this
repository) through each backend with the lost turns restored (``agentrl_env_db.transcripts``),
and once more trusting the log (``without_restoring``), and writes
``benchmarks/results/env_db_replay.json``: per backend and model, the episodes whose every
answer and outcome agree with upstream's, those whose answers agree, status and reward
agreement.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timezone
from pathlib import Path

import anyio
import attrs
from agentrl_env_db.config import DBConfig
from agentrl_env_db.env import DBEnvironment
from agentrl_env_db.mysql_backend import MySQLBackend

from agentrl_core.env import assistant_tool_call, play_episode

ROOT = Path(__file__).resolve().parent.parent
JIU = "`Jiu-Jitsu Championships Results`"
KNOWN_CAUSES = {
    ("std", 225): "upstream data: the stored hash matches neither the table before nor after the gold UPDATE "
                  "(PROVENANCE.md)",
}


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def ms(values: list[float]) -> dict:
    return {"n": len(values), "p50_ms": round(pct(values, 0.5) * 1000, 2), "p90_ms": round(pct(values, 0.9) * 1000, 2),
            "p99_ms": round(pct(values, 0.99) * 1000, 2), "mean_ms": round(statistics.mean(values) * 1000, 2)}


def _sql(query: str, call_id: str = "call_0") -> dict:
    return assistant_tool_call("execute_sql", {"query": query}, call_id=call_id)


async def oracle_rates(config: DBConfig, splits: dict[str, int | None]) -> dict:
    env = DBEnvironment(config)
    out = {}
    try:
        for split, limit in splits.items():
            indices = list(env.index_sets()[split])[:limit]
            started = time.perf_counter()
            misses = []
            for index in indices:
                episode = await play_episode(env, split, index, env.oracle(split, index))
                if episode.reward != 1.0:
                    last_tool = next((m["content"] for m in reversed(episode.messages[:-2]) if m["role"] == "tool"), "")
                    misses.append({"index": index, "type": env.task(split, index).kind, "status": episode.status.value,
                                   "last_observation": last_tool[:300],
                                   "cause": KNOWN_CAUSES.get((split, index), "unexplained")})
            out[split] = {"episodes": len(indices), "solved": len(indices) - len(misses),
                          "rate": round((len(indices) - len(misses)) / max(1, len(indices)), 4),
                          "seconds": round(time.perf_counter() - started, 2), "misses": misses}
    finally:
        await env.aclose()
    return out


async def latency(config: DBConfig, n: int) -> dict:
    env = DBEnvironment(config)
    if config.backend == "mysql":
        await env.backend.ensure_ready()
    starts, closes = [], []
    try:
        for i in range(n):
            session = await env.open("std", i % 300)
            t0 = time.perf_counter()
            await session.start()
            t1 = time.perf_counter()
            await session.close()
            closes.append(time.perf_counter() - t1)
            starts.append(t1 - t0)
        concurrent: list[float] = []

        async def one(i: int) -> None:
            session = await env.open("std", i)
            t0 = time.perf_counter()
            await session.start()
            concurrent.append(time.perf_counter() - t0)
            await session.close()

        wall = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(16 * max(1, n // 100)):
                tg.start_soon(one, i)
        wall = time.perf_counter() - wall
    finally:
        await env.aclose()
    return {"start_sequential": ms(starts), "close_sequential": ms(closes),
            "start_16_concurrent": ms(concurrent), "sessions_per_s_16_concurrent": round(len(concurrent) / wall, 1)}


async def qps(config: DBConfig, seconds: float) -> dict:
    env = DBEnvironment(config)
    out = {}
    try:
        queries = {"point": f"SELECT Notes FROM {JIU} WHERE Method = 'Decision'", "scan": f"SELECT * FROM {JIU}"}
        for name, query in queries.items():
            for width in (1, 16):
                sessions = [await env.open("std", 0) for _ in range(width)]
                for s in sessions:
                    await s.start()
                counts = [0] * width
                deadline = time.perf_counter() + seconds

                async def loop(k, session, query=query, deadline=deadline, counts=counts) -> None:
                    while time.perf_counter() < deadline:
                        await session.handle.execute(query)
                        counts[k] += 1

                started = time.perf_counter()
                async with anyio.create_task_group() as tg:
                    for k, s in enumerate(sessions):
                        tg.start_soon(loop, k, s)
                elapsed = time.perf_counter() - started
                for s in sessions:
                    await s.close()
                out[f"{name}_sessions_{width}"] = round(sum(counts) / elapsed, 1)
    finally:
        await env.aclose()
    return out


WORKER = textwrap.dedent(
    """
    import sys, anyio
    from agentrl_env_db.config import DBConfig
    from agentrl_env_db.env import DBEnvironment

    async def main():
        env = DBEnvironment(DBConfig(backend="mysql", url=sys.argv[1]))
        sessions = [await env.open("std", i) for i in range(int(sys.argv[2]))]
        for s in sessions:
            await s.start()
        async with anyio.create_task_group() as tg:
            # One session is mid-query when the worker dies.
            tg.start_soon(sessions[-1].handle.execute, "SELECT SLEEP(30)")
            print(" ".join(s.handle.name for s in sessions), flush=True)
            await anyio.to_thread.run_sync(sys.stdin.readline)

    anyio.run(main)
    """
)


async def leaks(config: DBConfig, n: int, killed: int) -> dict:
    rng = random.Random(11)
    plans = [rng.choice(["cancel_start", "cancel_query", "cancel_idle", "finish", "close"]) for _ in range(n)]
    outcomes: dict[str, int] = {}

    async def one(env: DBEnvironment, i: int, plan: str) -> None:
        session = await env.open("std", i % 300)
        try:
            with anyio.CancelScope() as scope:
                if plan == "cancel_start":
                    scope.cancel()
                await session.start()
                await session.step(_sql(f"UPDATE {JIU} SET Notes = 'x'"))
                if plan == "cancel_query":
                    with anyio.move_on_after(rng.uniform(0.01, 0.2)):
                        await session.step(_sql("SELECT SLEEP(2)", "call_1"))
                elif plan == "cancel_idle":
                    scope.cancel()
                    await session.step(_sql("SELECT 1", "call_1"))
                elif plan == "finish":
                    await session.step(assistant_tool_call("commit_final_answer", {"answers": []}, call_id="call_1"))
        finally:
            outcomes[plan] = outcomes.get(plan, 0) + 1
            await session.close()

    # A worker that holds sessions (one of them mid-query) and is killed with SIGKILL.
    worker = subprocess.Popen([sys.executable, "-c", WORKER, config.url, str(killed)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    names = (await anyio.to_thread.run_sync(worker.stdout.readline)).split()
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()

    env = DBEnvironment(attrs.evolve(config, sweep=False))  # sweep later, to count what the kill left
    started = time.perf_counter()
    try:
        limiter = anyio.CapacityLimiter(64)

        async def limited(i: int, plan: str) -> None:
            async with limiter:
                await one(env, i, plan)

        async with anyio.create_task_group() as tg:
            for i, plan in enumerate(plans):
                tg.start_soon(limited, i, plan)
        live_after = env.resource_count()
    finally:
        await env.aclose()
    elapsed = time.perf_counter() - started
    probe = MySQLBackend(config)
    before_sweep = await probe.leftovers()
    await probe.aclose()
    fresh = DBEnvironment(config)
    await fresh.backend.ensure_ready()
    swept = fresh.backend.swept
    after = await fresh.backend.leftovers()
    await fresh.aclose()
    return {"sessions": n, "outcomes": outcomes, "seconds": round(elapsed, 2), "killed_worker_sessions": len(names),
            "leftover_before_sweep": {"databases": len(before_sweep[0]), "users": len(before_sweep[1])},
            "killed_worker_names_found": sum(1 for x in names if x in before_sweep[0]),
            "swept": len(swept), "leftover_after_sweep": {"databases": len(after[0]), "users": len(after[1])},
            "env_live_after": live_after}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--url", help="an existing MySQL/MariaDB admin URL (default: start a private MariaDB)")
    p.add_argument("--out")
    p.add_argument("--replay", action="store_true", help="replay run logs instead (see above)")
    p.add_argument("--transcripts", help="with --replay: a folder of AgentBench-FC run logs")
    p.add_argument("--backends", default="sqlite,mariadb", help="with --replay: which backends")
    p.add_argument("--max-env-steps", type=int, default=400, help="with --replay: steps one search may take")
    args = p.parse_args()
    if args.replay:
        return replay_main(args)
    out = Path(args.out or ROOT / "benchmarks" / "results" / ("env_db_quick.json" if args.quick else "env_db.json"))
    server = None
    if args.url is None:
        from agentrl_env_db.server import PrivateMariaDB

        server = PrivateMariaDB()
        server.start()
    url = args.url or server.url
    mysql = DBConfig(backend="mysql", url=url)
    sqlite = DBConfig()
    limits = {"std": 100, "dev": None, "gen-train": 100} if args.quick else {"std": None, "dev": None, "gen-train": None}
    results: dict = {"parameters": {"quick": args.quick, "url": "private MariaDB" if server else "given"},
                     "machine": {"platform": platform.platform(), "python": platform.python_version(),
                                 "cpus": os.cpu_count(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds")},
                     "load": {"start": load()}}
    try:
        results["server"] = anyio.run(_server_version, mysql)
        for name, config in (("mariadb", mysql), ("sqlite", sqlite)):
            print(f"[{name}] oracle ...", flush=True)
            results[f"oracle_{name}"] = anyio.run(oracle_rates, config, limits)
            results["load"][f"after_oracle_{name}"] = load()
            print(f"[{name}] latency ...", flush=True)
            results[f"latency_{name}"] = anyio.run(latency, config, 50 if args.quick else 200)
            print(f"[{name}] queries/s ...", flush=True)
            results[f"qps_{name}"] = anyio.run(qps, config, 1.0 if args.quick else 3.0)
            results["load"][f"after_{name}"] = load()
        print("[mariadb] leak test ...", flush=True)
        results["leaks_mariadb"] = anyio.run(leaks, mysql, 60 if args.quick else 200, 5)
        results["load"]["end"] = load()
    finally:
        if server is not None:
            server.stop()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    _summary(results)
    print(f"wrote {out}")
    return 0


def replay_main(args: argparse.Namespace) -> int:
    from agentrl_env_db.transcripts import read_runs

    if not args.transcripts:
        raise SystemExit("--replay needs --transcripts DIR (a folder of AgentBench-FC run logs)")
    transcripts = [t for t in read_runs(args.transcripts) if t.split == "std"]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    out = Path(args.out or ROOT / "benchmarks" / "results" / "env_db_replay.json")
    report: dict = {"benchmark": "env_db_replay",
                    "parameters": {"transcripts": Path(args.transcripts).name, "max_env_steps": args.max_env_steps,
                                   "episodes": len(transcripts)},
                    "machine": {"platform": platform.platform(), "python": platform.python_version(),
                                "cpus": os.cpu_count(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds")},
                    "load": {"start": load()}, "backends": {}}
    server = None
    try:
        for backend in backends:
            if backend == "sqlite":
                config = DBConfig()
            elif backend == "mariadb":
                if args.url is None and server is None:
                    from agentrl_env_db.server import PrivateMariaDB

                    server = PrivateMariaDB()
                    server.start()
                config = DBConfig(backend="mysql", url=args.url or server.url)
            else:
                raise SystemExit(f"unknown backend {backend!r}; use sqlite and/or mariadb")
            print(f"[{backend}] replaying {len(transcripts)} episodes ...", flush=True)
            t0 = time.monotonic()
            section = anyio.run(replay_backend, config, transcripts, args.max_env_steps, True)
            section["seconds"] = round(time.monotonic() - t0, 1)
            naive = anyio.run(replay_backend, config, transcripts, args.max_env_steps, False)
            section["without_restoring"] = {"all": naive["all"], "models": naive["models"]}
            report["backends"][backend] = section
            report["load"][f"after_{backend}"] = load()
    finally:
        if server is not None:
            server.stop()
    # Per model, the backends next to each other: agree / answers agree / status / reward.
    sections = report["backends"]
    keys = ("agree", "observations_agree", "status_agrees", "reward_agrees")
    models = sorted({m for section in sections.values() for m in section["models"]})
    report["side_by_side"] = {m: {b: [sections[b]["models"][m][k] for k in keys] for b in sections
                                  if m in sections[b]["models"]} for m in models}
    report["side_by_side"]["all"] = {b: [sections[b]["all"][k] for k in keys] for b in sections}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print("model: " + " | ".join(f"{b} agree/answers/status/reward" for b in sections))
    for model, row in report["side_by_side"].items():
        print(f"{model}: " + " | ".join("/".join(map(str, row.get(b, []))) for b in sections))
    for backend, section in report["backends"].items():
        for model, row in section["models"].items():
            naive = section["without_restoring"]["models"][model]
            print(f"{backend} {model}: agree {row['agree']}/{row['episodes']} (without restoring {naive['agree']}), "
                  f"answers agree {row['observations_agree']}, status {row['status_agrees']}, "
                  f"reward {row['reward_agrees']}, lost turns restored {row['lost_turns_restored']}")
    print(f"load average: {report['load']}")
    print(f"wrote {out}")
    return 0


async def replay_backend(config: DBConfig, transcripts: list, max_env_steps: int, restore: bool) -> dict:
    from agentrl_env_db.transcripts import replay, summarize

    env = DBEnvironment(config)
    results = []
    limiter = anyio.CapacityLimiter(8)

    async def one(transcript) -> None:
        async with limiter:
            results.append(await replay(env, transcript, max_env_steps=max_env_steps, restore_lost_turns=restore))

    try:
        async with anyio.create_task_group() as tg:
            for transcript in transcripts:
                tg.start_soon(one, transcript)
    finally:
        await env.aclose()
    results.sort(key=lambda r: (r.transcript.model, r.transcript.index))
    models = sorted({r.transcript.model for r in results})
    causes: dict[tuple[str, str], int] = {}
    for r in results:
        if not r.agrees:
            key = ((r.expected or "")[:70], (r.got or "")[:70])
            causes[key] = causes.get(key, 0) + 1
    top = sorted(causes.items(), key=lambda kv: -kv[1])[:25]
    return {"all": summarize(results),
            "models": {m: summarize(r for r in results if r.transcript.model == m) for m in models},
            "first_differences": [{"episodes": n, "upstream": up, "ours": ours} for (up, ours), n in top],
            "reward_differs": [[r.transcript.model, r.transcript.index, r.transcript.reward, r.reward]
                               for r in results if r.reward != r.transcript.reward],
            "differing_episodes": [[r.transcript.model, r.transcript.index, r.diverged_at] for r in results if not r.agrees]}


async def _server_version(config: DBConfig) -> str:
    backend = MySQLBackend(config)
    try:
        return await backend.admin.run(_version)
    finally:
        await backend.aclose()


async def _version(cur) -> str:
    await cur.execute("SELECT VERSION()")
    return (await cur.fetchone())[0]


def _summary(r: dict) -> None:
    for backend in ("mariadb", "sqlite"):
        rates = ", ".join(f"{s} {v['solved']}/{v['episodes']}" for s, v in r[f"oracle_{backend}"].items())
        lat = r[f"latency_{backend}"]
        print(f"{backend}: oracle {rates}; start p50 {lat['start_sequential']['p50_ms']} ms "
              f"p99 {lat['start_sequential']['p99_ms']} ms; close p50 {lat['close_sequential']['p50_ms']} ms; "
              f"qps {r[f'qps_{backend}']}")
        for split, v in r[f"oracle_{backend}"].items():
            for miss in v["misses"]:
                print(f"  miss {split}/{miss['index']} ({miss['type']}): {miss['cause']}")
    leaks = r["leaks_mariadb"]
    print(f"leaks: {leaks['sessions']} sessions + {leaks['killed_worker_sessions']} in a killed worker; "
          f"swept {leaks['swept']}; left after sweep {leaks['leftover_after_sweep']}")
    print(f"load average: {r['load']}")


if __name__ == "__main__":
    sys.exit(main())
