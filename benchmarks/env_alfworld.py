"""ALFWorld environment benchmark: latency, throughput, full oracle runs, memory over 300 episodes.

    python benchmarks/env_alfworld.py            # full: every bundled game of every split
    python benchmarks/env_alfworld.py --quick    # 20 games per split, short runs

Writes benchmarks/results/env_alfworld.json (or --out). Sections:

* ``latency``: reset (load + first observation) and step latency seen by a session, oracle play;
* ``throughput``: oracle episodes per minute with 1 and 2 concurrent sessions;
* ``oracle``: per split, games won / bundled games, the misses with their causes;
* ``memory_with_replacement``: RSS of this process (the task worker) and of its game processes
  every 10 episodes across all the oracle runs (thousands of consecutive episodes in one
  environment, default ``max_episodes_per_process: 50``);
* ``memory_without_replacement``: the same over ``--memory-episodes`` episodes on one game
  process that is never replaced, which shows the engine's own growth.

The machine is shared: the JSON records the load average before and after.

    python benchmarks/env_alfworld.py --replay [--transcripts DIR] [--variants ...]

replays conversations instead (``agentrl_env_alfworld.transcripts``) and writes
benchmarks/results/env_alfworld_replay.json:

* always, a self-check: oracle episodes on std games with mistakes and word-for-word repeated
  turns, written through a client that keeps only new messages (as the third-party AgentBench
  logs were), then replayed: with the lost turns restored every one must agree; replaying only
  the recorded turns shows how often a lossy log misleads;
* with ``--transcripts``, a folder of AgentBench-FC run logs (``<model>/alfworld-std/runs.jsonl``,
  not part of this repository): each recorded episode replayed per variant
  ``<termination>-<naive|restore>`` (default: agentrl-naive, upstream-naive, upstream-restore),
  with agreement counts per model.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import anyio
from agentrl_env_alfworld.config import AlfworldConfig
from agentrl_env_alfworld.env import AlfworldEnvironment
from agentrl_env_alfworld.oracle import miss_cause, play_oracle
from agentrl_env_alfworld.transcripts import Transcript, message_key, read_runs, replay, summarize

from agentrl_core.env import play_episode

ROOT = Path(__file__).resolve().parent


def rss_mb(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "n": len(values),
        "mean_ms": round(1000 * statistics.fmean(values), 1),
        "p50_ms": round(1000 * at(0.5), 1),
        "p90_ms": round(1000 * at(0.9), 1),
        "p99_ms": round(1000 * at(0.99), 1),
        "max_ms": round(1000 * ordered[-1], 1),
    }


def spread(indices: list[int], n: int | None) -> list[int]:
    if n is None or n >= len(indices):
        return list(indices)
    step = len(indices) / n
    return [indices[int(i * step)] for i in range(n)]


async def latency(env: AlfworldEnvironment, indices: list[int]) -> dict:
    resets, steps = [], []
    for index in indices:
        agent = env.oracle("std", index)
        session = await env.open("std", index)
        try:
            began = time.perf_counter()
            step = await session.start()
            resets.append(time.perf_counter() - began)
            messages = list(step.messages)
            while not step.finish:
                action = agent.act(messages)
                messages.append(action)
                began = time.perf_counter()
                step = await session.step(action)
                steps.append(time.perf_counter() - began)
                messages.extend(step.messages)
        finally:
            await session.close()
    return {"reset": percentiles(resets), "step": percentiles(steps)}


async def throughput(env: AlfworldEnvironment, indices: list[int], concurrency: int) -> dict:
    began = time.perf_counter()
    episodes = await play_oracle(env, "std", indices, concurrency=concurrency)
    elapsed = time.perf_counter() - began
    return {
        "concurrency": concurrency,
        "episodes": len(episodes),
        "seconds": round(elapsed, 1),
        "episodes_per_minute": round(60 * len(episodes) / elapsed, 1),
    }


class MemoryLog:
    """RSS of this process and of the game processes, every ``every`` finished episodes."""

    def __init__(self, env: AlfworldEnvironment, every: int = 10) -> None:
        self.env, self.every, self.count, self.samples = env, every, 0, []

    def __call__(self, index: int = 0, episode: object = None) -> None:
        self.count += 1
        if self.count == 1 or self.count % self.every == 0:
            children = [c for c in (p.rss_kb() / 1024 for p in self.env.pool.processes) if c > 0]
            self.samples.append({
                "episodes": self.count,
                "worker_rss_mb": round(rss_mb(), 1),
                "game_processes_rss_mb": round(sum(children), 1),
                "largest_game_process_mb": round(max(children, default=0.0), 1),
                "game_processes": len(children),
            })

    def growth(self, key: str) -> dict:
        """Mean of the last fifth of the samples minus the mean of the first fifth (sample 1 left out)."""
        body = self.samples[1:] or self.samples
        k = max(1, len(body) // 5)
        first = statistics.fmean(s[key] for s in body[:k])
        last = statistics.fmean(s[key] for s in body[-k:])
        return {"first_mb": round(first, 1), "last_mb": round(last, 1), "growth_mb": round(last - first, 1),
                "max_mb": round(max(s[key] for s in self.samples), 1)}

    def report(self, **extra) -> dict:
        return {"episodes": self.count, **extra, "processes_started": self.env.pool.started,
                "worker": self.growth("worker_rss_mb"), "game_processes": self.growth("game_processes_rss_mb"),
                "largest_game_process": self.growth("largest_game_process_mb"), "samples": self.samples}


async def oracle_split(env: AlfworldEnvironment, split: str, n: int | None, concurrency: int, log: MemoryLog) -> dict:
    indices = spread(list(env.index_sets()[split]), n)
    began = time.perf_counter()
    episodes = await play_oracle(env, split, indices, concurrency=concurrency, on_episode=log)
    elapsed = time.perf_counter() - began
    misses = [
        {"index": i, "game": env.game(split, i).path, "cause": miss_cause(e)}
        for i, e in zip(indices, episodes, strict=True)
        if isinstance(e, Exception) or e.reward != 1.0
    ]
    wins = len(indices) - len(misses)
    steps = [e.metrics.get("actions", 0) for e in episodes if not isinstance(e, Exception)]
    print(f"  oracle {split}: {wins}/{len(indices)} won in {elapsed:.0f}s", flush=True)
    return {
        "games": len(indices),
        "bundled": len(env.index_sets()[split]),
        "upstream": len(env.library.upstream.get(split, [])) or None,
        "won": wins,
        "win_rate": round(wins / len(indices), 4),
        "mean_actions": round(statistics.fmean(steps), 2) if steps else None,
        "seconds": round(elapsed, 1),
        "episodes_per_minute": round(60 * len(indices) / elapsed, 1),
        "misses": misses,
    }


async def memory_without_replacement(cache_dir: str | None, episodes: int) -> dict:
    """Consecutive episodes on one game process that is never replaced: the engine's own growth."""
    env = AlfworldEnvironment(AlfworldConfig(concurrency=1, max_episodes_per_process=0, game_cache_dir=cache_dir))
    log = MemoryLog(env)
    indices = list(env.index_sets()["train"])
    try:
        for n in range(episodes):
            index = indices[n % len(indices)]
            await play_episode(env, "train", index, env.oracle("train", index))
            log()
    finally:
        await env.aclose()
    return log.report(max_episodes_per_process=0, concurrency=1)


async def main(args: argparse.Namespace, save) -> dict:
    results: dict = {}
    config = AlfworldConfig(concurrency=max(2, args.concurrency), game_cache_dir=args.cache_dir)
    env = AlfworldEnvironment(config)
    try:
        std = list(env.index_sets()["std"])
        print("latency ...", flush=True)
        began = time.perf_counter()  # first episode: unpacks the archive (if needed) and starts a process
        await play_episode(env, "std", std[0], env.oracle("std", std[0]))
        results["cold_start_seconds"] = round(time.perf_counter() - began, 2)
        results["latency"] = await latency(env, spread(std, 10 if args.quick else 30))
        print(f"  reset p50 {results['latency']['reset']['p50_ms']} ms, step p50 {results['latency']['step']['p50_ms']} ms")
        print("throughput ...", flush=True)
        results["throughput"] = [await throughput(env, spread(std, 20 if args.quick else 40), c) for c in (1, 2)]
        for t in results["throughput"]:
            print(f"  concurrency {t['concurrency']}: {t['episodes_per_minute']} episodes/min")
        save(results)
        # The oracle runs double as the memory run: every episode of every split in this one
        # environment (one task worker) with the default process replacement.
        log = MemoryLog(env)
        results["oracle"] = {}
        for split in args.splits:
            limit = 20 if args.quick else args.max_games.get(split)
            results["oracle"][split] = await oracle_split(env, split, limit, args.concurrency, log)
            results["memory_with_replacement"] = log.report(
                max_episodes_per_process=config.max_episodes_per_process, concurrency=args.concurrency,
                splits=list(results["oracle"]))
            save(results)
    finally:
        await env.aclose()
    print("memory without replacement ...", flush=True)
    results["memory_without_replacement"] = await memory_without_replacement(args.cache_dir, args.memory_episodes)
    for key in ("memory_with_replacement", "memory_without_replacement"):
        m = results[key]
        print(f"  {key}: worker {m['worker']['growth_mb']:+} MB, largest game process "
              f"{m['largest_game_process']['growth_mb']:+} MB over {m['episodes']} episodes")
    return results


# -- replays -------------------------------------------------------------------------------------


async def lossy_log(env: AlfworldEnvironment, index: int, seed: int) -> tuple[Transcript, int]:
    """An oracle episode with mistakes and word-for-word repeats, as a deduplicating client logs it."""
    import random

    rng = random.Random(seed)
    agent = env.oracle("std", index, error_rate=0.25, seed=seed)
    session = await env.open("std", index)
    try:
        step = await session.start()
        conversation = list(step.messages)
        while not step.finish:
            turn = agent.act(conversation)
            turn["tool_calls"][0]["id"] = "call_1"  # as an ollama model: every call id is the same
            turn["content"] = f"Thought {len(conversation)}."
            for _ in range(1 + (rng.random() < 0.25)):  # a quarter of the turns are sent twice
                if step.finish:
                    break
                step = await session.step(turn)
                conversation += [turn, *step.messages]
    finally:
        await session.close()
    kept, seen = [], set()
    for message in conversation:
        if message_key(message) not in seen:
            seen.add(message_key(message))
            kept.append(message)
    transcript = Transcript(model="synthetic", split="std", index=index, status=str(step.status), reward=step.reward,
                            messages=kept[2:], init=kept[1]["content"])
    return transcript, len(conversation) - len(kept)


async def self_check(games: int, max_env_steps: int) -> dict:
    env = AlfworldEnvironment(AlfworldConfig(concurrency=1))
    try:
        indices = spread(list(env.index_sets()["std"]), games)
        logs = [await lossy_log(env, index, seed) for seed, index in enumerate(indices)]
        restored = [await replay(env, t, max_env_steps=max_env_steps) for t, _ in logs]
        naive = [await replay(env, t, restore_lost_turns=False) for t, _ in logs]
    finally:
        await env.aclose()
    return {"games": len(indices), "messages_lost_in_the_logs": sum(n for _, n in logs),
            "logs_that_lost_messages": sum(n > 0 for _, n in logs),
            "restore": summarize(restored), "naive": summarize(naive),
            "disagreements_restored": [{"index": r.transcript.index, "at": r.diverged_at, "expected": r.expected,
                                        "got": r.got} for r in restored if not r.agrees]}


async def replay_variant(transcripts: list[Transcript], variant: str, max_env_steps: int, concurrency: int) -> dict:
    termination, _, how = variant.partition("-")
    env = AlfworldEnvironment(AlfworldConfig(concurrency=concurrency, termination=termination))
    playable = [t for t in transcripts if t.index in set(env.index_sets()[t.split])]
    limiter = anyio.CapacityLimiter(concurrency)
    results = []

    async def one(t: Transcript) -> None:
        async with limiter:
            results.append(await replay(env, t, max_env_steps=max_env_steps, restore_lost_turns=how == "restore"))

    began = time.perf_counter()
    try:
        async with anyio.create_task_group() as tg:
            for t in playable:
                tg.start_soon(one, t)
    finally:
        await env.aclose()
    models = sorted({r.transcript.model for r in results})
    report = {
        "seconds": round(time.perf_counter() - began, 1),
        "recorded_episodes": len(transcripts), "of_bundled_games": len(playable),
        "all": summarize(results),
        "by_model": {m: summarize(r for r in results if r.transcript.model == m) for m in models},
        "disagreements": sorted(
            ({"model": r.transcript.model, "index": r.transcript.index, "upstream": r.transcript.status,
              "ours": r.status, "at": r.diverged_at, "search_exhausted": r.exhausted,
              "expected": (r.expected or "")[:160], "got": (r.got or "")[:160]}
             for r in results if not r.agrees), key=lambda d: (d["model"], d["index"]))[:40],
    }
    a = report["all"]
    print(f"  {variant}: {a['agree']}/{a['episodes']} agree, status {a['status_agrees']}, "
          f"upstream's wins won {a['upstream_won_and_won_here']}/{a['upstream_won']}", flush=True)
    return report


async def replay_runs(folder: str, variants: list[str], max_env_steps: int, concurrency: int) -> dict:
    transcripts = read_runs(folder)
    return {v: await replay_variant(transcripts, v, max_env_steps, concurrency) for v in variants}


def replay_main(args: argparse.Namespace) -> None:
    load_before = os.getloadavg()
    began = time.time()
    report: dict = {"benchmark": "env_alfworld_replay",
                    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "cpus": os.cpu_count()},
                    "parameters": {"self_check_games": args.replay_games, "max_env_steps": args.max_env_steps,
                                   "transcripts": bool(args.transcripts), "variants": args.variants}}
    print(f"self-check on {args.replay_games} std games ...", flush=True)
    report["self_check"] = anyio.run(self_check, args.replay_games, args.max_env_steps)
    c = report["self_check"]
    print(f"  {c['messages_lost_in_the_logs']} messages lost in {c['logs_that_lost_messages']} logs; restored: "
          f"{c['restore']['agree']}/{c['games']} agree, naive: {c['naive']['agree']}/{c['games']}", flush=True)
    if args.transcripts:
        print(f"replaying the run logs in {args.transcripts} ...", flush=True)
        report["transcripts"] = anyio.run(replay_runs, args.transcripts, args.variants, args.max_env_steps,
                                          args.concurrency)
    report["machine"]["load_before"] = [round(x, 2) for x in load_before]
    report["machine"]["load_after"] = [round(x, 2) for x in os.getloadavg()]
    report["wall_seconds"] = round(time.time() - began, 1)
    default = str(ROOT / "results" / "env_alfworld.json")
    out = Path(args.out if args.out != default else ROOT / "results" / "env_alfworld_replay.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="20 games per split, short runs")
    parser.add_argument("--splits", default="std,dev,train,train-extra")
    parser.add_argument("--concurrency", type=int, default=2, help="concurrent oracle episodes (2 cores here)")
    parser.add_argument("--memory-episodes", type=int, default=None, help="episodes of the run without replacement")
    parser.add_argument("--max-games", default="", help="e.g. train=600,train-extra=200: games spread evenly over a split")
    parser.add_argument("--cache-dir", default=None, help="game cache (default: the environment's)")
    parser.add_argument("--out", default=str(ROOT / "results" / "env_alfworld.json"))
    parser.add_argument("--replay", action="store_true", help="replay conversations instead (see above)")
    parser.add_argument("--transcripts", help="with --replay: a folder of AgentBench-FC run logs")
    parser.add_argument("--variants", default="agentrl-naive,upstream-naive,upstream-restore",
                        help="with --transcripts: <agentrl|upstream>-<naive|restore>, comma-separated")
    parser.add_argument("--replay-games", type=int, default=30, help="with --replay: std games of the self-check")
    parser.add_argument("--max-env-steps", type=int, default=2000, help="game steps one replay's search may take")
    args = parser.parse_args()
    if args.replay:
        args.variants = [v for v in args.variants.split(",") if v]
        replay_main(args)
        sys.exit(0)
    args.splits = [s for s in args.splits.split(",") if s]
    args.max_games = {k: int(v) for k, v in (item.split("=") for item in args.max_games.split(",") if item)}
    if args.memory_episodes is None:
        args.memory_episodes = 60 if args.quick else 150
    load_before = os.getloadavg()
    began = time.time()
    out = Path(args.out)

    def save(results: dict, complete: bool = False) -> None:
        report = {
            "benchmark": "env_alfworld",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "cpus": os.cpu_count(),
                        "load_before": [round(x, 2) for x in load_before],
                        "load_after": [round(x, 2) for x in os.getloadavg()],
                        "note": "shared 2-core machine; other engineers' jobs ran at the same time"},
            "parameters": {"quick": args.quick, "splits": args.splits, "concurrency": args.concurrency,
                           "memory_episodes": args.memory_episodes},
            "wall_seconds": round(time.time() - began, 1),
            "complete": complete,
            **results,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")

    save(anyio.run(main, args, save), complete=True)
    print(f"wrote {out}")
