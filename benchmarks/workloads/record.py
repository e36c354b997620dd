"""Record the workload of the real environments for the throughput benchmark.

Plays the oracles of the real environment plugins through the Environment/Session API
(the same calls a task worker makes) and records, per episode: the number of turns, the
latency of ``open + start``, of every ``step`` and of ``close``, the length of the prompt,
of every observation and of every oracle action (characters), the final status and reward.
A few kilobytes of real observation text per environment are kept too, so the replay can
produce observations with the real characters-per-token ratio.

    python benchmarks/workloads/record.py                 # db, kg, webshop, alfworld (+ os with --envs)
    python benchmarks/workloads/record.py --episodes 20   # fewer episodes

Writes ``benchmarks/workloads/oracle_workload.json``, which the replay environment
(``agentrl-bench-replay``) reads. Episodes are played one at a time, so the latencies are
those of a single session (the load average of the machine is recorded with them). The
oracle plays with ``--error-rate`` (default 0.25): a policy being trained makes mistakes,
and the oracle's deliberate mistakes add the turns that recover from them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

import anyio

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "oracle_workload.json"

# env -> (training index set, environments.<env> config section); the embedded backends
ENVIRONMENTS: dict[str, tuple[str, dict[str, Any]]] = {
    "db": ("gen-train", {"backend": "sqlite"}),
    "kg": ("fb-train", {"backend": "embedded"}),
    "webshop": ("bundled-train", {}),
    "alfworld": ("train", {}),
    "os": ("train", {"warm_pool": 0, "sweep_on_start": False, "image_tag": "latest"}),  # Docker; leaves others' containers alone
}
TEXT_SAMPLE_CHARS = 6000


def _chars(message: dict[str, Any]) -> int:
    """Characters of a message as a model sees them: content plus tool-call names and arguments."""
    n = len(message.get("content") or "")
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        n += len(fn.get("name", "")) + len(fn.get("arguments", "") if isinstance(fn.get("arguments"), str)
                                            else json.dumps(fn.get("arguments")))
    return n


async def record_episode(env: Any, split: str, index: Any, seed: int, error_rate: float) -> dict[str, Any]:
    agent = env.oracle(split, index, error_rate=error_rate, seed=seed)
    t0 = time.perf_counter()
    session = await env.open(split, index)
    messages: list[dict[str, Any]] = []
    steps: list[float] = []
    obs_chars: list[int] = []
    action_chars: list[int] = []
    texts: list[str] = []
    try:
        step = await session.start()
        start_s = time.perf_counter() - t0
        messages.extend(step.messages)
        prompt_chars = sum(_chars(m) for m in step.messages)
        while not step.finish:
            if len(steps) >= 100:
                raise RuntimeError(f"{env.name}/{split}/{index}: the oracle did not finish within 100 steps")
            action = agent.act(list(messages))
            messages.append(action)
            action_chars.append(_chars(action))
            t = time.perf_counter()
            step = await session.step(action)
            steps.append(time.perf_counter() - t)
            messages.extend(step.messages)
            obs_chars.append(sum(_chars(m) for m in step.messages))
            texts.extend(str(m.get("content") or "") for m in step.messages)
    finally:
        t = time.perf_counter()
        await session.close()
        close_s = time.perf_counter() - t
    return {
        "index": index, "seed": seed, "turns": len(steps), "start_s": round(start_s, 6),
        "step_s": [round(s, 6) for s in steps], "close_s": round(close_s, 6),
        "prompt_chars": prompt_chars, "obs_chars": obs_chars, "action_chars": action_chars,
        "status": step.status.value, "reward": float(step.reward), "_texts": texts,
    }


async def record_env(name: str, episodes: int, error_rate: float, seed: int) -> dict[str, Any]:
    from agentrl_core.config import config_from_dict
    from agentrl_core.registry import Registry

    split, section = ENVIRONMENTS[name]
    registry = Registry()
    config = config_from_dict({"environments": {name: section}}, registry=registry)
    env = registry.build("environment", name, config.environment_config(name))
    try:
        indices = list(env.index_sets()[split])
        chosen = random.Random(f"{seed}/{name}").sample(indices, min(episodes, len(indices)))
        # one untimed episode first: lazy loading (indices, catalogs, images) is set-up, not step latency
        await record_episode(env, split, chosen[0], seed, error_rate)
        out = []
        t0 = time.perf_counter()
        for i, index in enumerate(chosen):
            ep_seed = random.Random(f"{seed}/{name}/{index}/{i}").randrange(2**31)
            out.append(await record_episode(env, split, index, ep_seed, error_rate))
        elapsed = time.perf_counter() - t0
    finally:
        await env.aclose()
    sample, total = [], 0
    for ep in out:
        for text in ep.pop("_texts"):
            if total < TEXT_SAMPLE_CHARS and text:
                sample.append(text[:1500])
                total += len(sample[-1])
    turns = sorted(ep["turns"] for ep in out)
    print(f"{name}/{split}: {len(out)} episodes in {elapsed:.1f} s; turns median {turns[len(turns) // 2]}, "
          f"max {turns[-1]}; success {sum(ep['reward'] >= 1 for ep in out) / len(out):.0%}", flush=True)
    return {"split": split, "config": section, "tools": env.tools, "episodes": out, "text_sample": sample,
            "record_seconds": round(elapsed, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", default="db,kg,webshop,alfworld", help="comma-separated (os needs Docker)")
    parser.add_argument("--episodes", type=int, default=60, help="episodes per environment")
    parser.add_argument("--error-rate", type=float, default=0.25, help="oracle mistake probability per step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args()
    names = [n.strip() for n in args.envs.split(",") if n.strip()]
    unknown = sorted(set(names) - set(ENVIRONMENTS))
    if unknown:
        parser.error(f"unknown environments {unknown}; choose from {sorted(ENVIRONMENTS)}")
    load_before = os.getloadavg()
    envs = {name: anyio.run(record_env, name, args.episodes, args.error_rate, args.seed) for name in names}
    result = {
        "about": "per-episode turn counts and environment latencies of oracle runs of the real environments "
                 "(benchmarks/workloads/record.py); replayed by agentrl-bench-replay",
        "parameters": {"episodes": args.episodes, "error_rate": args.error_rate, "seed": args.seed},
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "cpus": os.cpu_count(),
                    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "load_before": [round(x, 2) for x in load_before],
                    "load_after": [round(x, 2) for x in os.getloadavg()]},
        "environments": envs,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
