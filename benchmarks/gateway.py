"""Gateway benchmark: added latency per call and calls/s at 64 concurrent sessions, vs the engine directly.

    python benchmarks/gateway.py [--quick] [--out benchmarks/results/gateway.json]

Starts a real hf engine (``agentrl engine serve``, tiny model) and a real gateway
(``agentrl gateway``) as their own processes, and drives both from this process with the
``openai`` SDK (``AsyncOpenAI``): S concurrent sessions of T turns each (tools in every
request, the conversation growing by the reply and a user turn), once straight to the
engine's own ``/v1/chat/completions`` and once through a gateway session, alternating the
two arms R times so load drift on the shared machine hits both. Measured:

1. client-side latency per call (p50, p99) and calls/s of each arm; the difference is the
   latency the gateway adds (an extra HTTP hop, capture, its own tokenization); and the CPU
   time the engine and the gateway processes spend per call in each arm (``/proc``), which
   the load of a shared machine does not change;
2. the gateway's own time per call (its handler time minus the engine's), p50/p99 and by
   turn number: flat if capture only tokenizes the new messages;
3. how planning a call scales with the conversation's length: the gateway's append path
   (render only the new messages) against rendering the whole conversation every call.

The load average before and after each arm is recorded; numbers drift with it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "gateway.json"
TOOLS = [{"type": "function", "function": {"name": "add", "description": "add two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]


def load() -> float:
    return round(os.getloadavg()[0], 2)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc): what a call costs whatever the load."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def run_arm(arm: str, *, engine_url: str, gateway_url: str, sessions: int, turns: int, max_tokens: int) -> dict:
    import httpx
    import openai

    latencies: list[float] = []
    ids: list[str] = []
    async with httpx.AsyncClient(timeout=60) as http:
        if arm == "gateway":
            opened = [(await http.post(gateway_url + "/sessions", json={"task": "bench"})).json()
                      for _ in range(sessions)]
            ids = [s["id"] for s in opened]
            bases = [s["base_url"] for s in opened]
        else:
            bases = [engine_url + "/v1"] * sessions

    async def play(i: int, base: str) -> None:
        async with openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, timeout=600) as client:
            messages = [{"role": "system", "content": "You add numbers."},
                        {"role": "user", "content": f"Session {i}: what is {i} + 1?"}]
            for turn in range(turns):
                t0 = time.perf_counter()
                response = await client.chat.completions.create(
                    model="tiny", messages=messages, tools=TOOLS, max_tokens=max_tokens, temperature=1.0,
                    seed=1000 * i + turn)
                latencies.append(time.perf_counter() - t0)
                message = response.choices[0].message.model_dump(exclude_none=True)
                messages = [*messages, message]
                if message.get("tool_calls"):
                    messages += [{"role": "tool", "tool_call_id": c["id"], "content": "7"}
                                 for c in message["tool_calls"]]
                else:
                    messages.append({"role": "user", "content": f"turn {turn}: go on"})

    load_before = load()
    start = time.perf_counter()
    await asyncio.gather(*(play(i, base) for i, base in enumerate(bases)))
    wall = time.perf_counter() - start
    out = {"arm": arm, "calls": len(latencies), "seconds": round(wall, 3), "calls_per_s": round(len(latencies) / wall, 2),
           "latency_ms_p50": round(1000 * pct(latencies, 0.5), 2), "latency_ms_p99": round(1000 * pct(latencies, 0.99), 2),
           "latency_ms_mean": round(1000 * statistics.fmean(latencies), 2), "load_before": load_before,
           "load_after": load()}
    if arm == "gateway":
        async with httpx.AsyncClient(timeout=60) as http:
            records = [(await http.post(f"{gateway_url}/sessions/{sid}/close")).json() for sid in ids]
        own = [t["gateway_ms"] for r in records for t in r["turns"]]
        by_turn = {k: round(statistics.fmean(r["turns"][k]["gateway_ms"] for r in records if len(r["turns"]) > k), 3)
                   for k in range(turns)}
        counts: dict[str, int] = {}
        for r in records:
            for kind, n in r["counts"].items():
                counts[kind] = counts.get(kind, 0) + n
        out.update(gateway_ms_p50=round(pct(own, 0.5), 3), gateway_ms_p99=round(pct(own, 0.99), 3),
                   gateway_ms_by_turn=by_turn, capture=counts)
    return out


def planning_cost(model_dir: Path, lengths: list[int], repeats: int) -> list[dict]:
    """Seconds to plan one more call after n turns: the append path vs a full render of the conversation."""
    from transformers import AutoTokenizer

    from agentrl_core.gateway.capture import Conversation, Renderer, Sampled, commit, plan_chat

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    renderer = Renderer(tokenizer)
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rows = []
    for n in lengths:
        conv = Conversation()
        messages = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "What is 1 + 1?"}]
        for turn in range(n):
            text = f"The answer to step {turn} is {turn + 2}."
            plan = plan_chat(conv, renderer, messages, TOOLS, {})
            sampled = tokenizer.encode(text, add_special_tokens=False) + [eot]
            reply = {"role": "assistant", "content": text}
            commit(conv, plan, Sampled(sampled, [0.0] * len(sampled), [0] * len(sampled), True), reply=reply,
                   reasoning=None, close_turn_id=eot)
            messages = [*messages, reply, {"role": "user", "content": f"next {turn}"}]
        encoder, _ = renderer.encoder(plan.key, TOOLS, {})
        t0 = time.perf_counter()
        for _ in range(repeats):
            plan = plan_chat(conv, renderer, messages, TOOLS, {})
        append = (time.perf_counter() - t0) / repeats
        t0 = time.perf_counter()
        for _ in range(repeats):
            encoder.encode(messages, add_generation_prompt=True)
        full = (time.perf_counter() - t0) / repeats
        rows.append({"turns": n, "tokens": len(plan.prompt_ids), "plan_kind": plan.kind,
                     "append_path_ms": round(1000 * append, 3), "full_render_ms": round(1000 * full, 3)})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 sessions x 3 turns, one round (a smoke test)")
    parser.add_argument("--sessions", type=int, default=None)
    parser.add_argument("--turns", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None, help="alternating engine/gateway rounds (default 3)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    sessions = args.sessions or (16 if args.quick else 64)
    turns = args.turns or (3 if args.quick else 5)
    rounds = args.rounds or (1 if args.quick else 3)

    from agentrl_core.processes import ServiceProcess, agentrl_command
    from agentrl_core.tinymodel import init_model

    results: dict = {
        "benchmark": "gateway",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "cpus": os.cpu_count(),
                    "load_at_start": load()},
        "parameters": {"quick": args.quick, "sessions": sessions, "turns": turns, "rounds": rounds,
                       "max_tokens": args.max_tokens, "model": "tiny (agentrl model init)", "engine": "hf, 1 process",
                       "client": "openai.AsyncOpenAI, one per session, in this process"},
    }
    with tempfile.TemporaryDirectory(prefix="gateway-bench-") as tmp:
        tmp_path = Path(tmp)
        data = tmp_path / "no_data"
        data.mkdir()
        model = init_model(tmp_path / "tiny", "tiny", seed=0, data_dir=data)
        engine = ServiceProcess("engine", agentrl_command("engine", "serve", "--model", str(model), "--max-running-requests",
                                                         str(max(64, sessions)), "--threads", "1"),
                                log_path=tmp_path / "engine.log")
        engine_url = engine.start(timeout=300)
        gateway = ServiceProcess("gateway", agentrl_command(
            "gateway", "--model", str(model), "--engine", engine_url, "--set", f"rollout.max_new_tokens={args.max_tokens}",
            "--set", "rollout.temperature=1.0", "--set", "rollout.max_total_len=4096"), log_path=tmp_path / "gateway.log")
        try:
            gateway_url = gateway.start(timeout=300)
            arms = []
            for r in range(rounds):
                for arm in ("engine", "gateway") if r % 2 == 0 else ("gateway", "engine"):
                    cpu0 = {name: cpu_seconds(p.proc.pid) for name, p in (("engine", engine), ("gateway", gateway))}
                    result = asyncio.run(run_arm(arm, engine_url=engine_url, gateway_url=gateway_url, sessions=sessions,
                                                 turns=turns, max_tokens=args.max_tokens))
                    for name, p in (("engine", engine), ("gateway", gateway)):
                        used = cpu_seconds(p.proc.pid) - cpu0[name]
                        result[f"{name}_cpu_ms_per_call"] = round(1000 * used / result["calls"], 2)
                    result["round"] = r
                    arms.append(result)
                    print(f"round {r} {arm:8s}: {result['calls_per_s']:7.1f} calls/s, p50 {result['latency_ms_p50']:.1f} "
                          f"ms, p99 {result['latency_ms_p99']:.1f} ms, CPU per call: engine "
                          f"{result['engine_cpu_ms_per_call']} ms, gateway {result['gateway_cpu_ms_per_call']} ms "
                          f"(load {result['load_before']})", flush=True)
        finally:
            gateway.stop()
            engine.stop()
        results["arms"] = arms
        summary = {}
        for arm in ("engine", "gateway"):
            mine = [a for a in arms if a["arm"] == arm]
            summary[arm] = {k: round(statistics.median(a[k] for a in mine), 2)
                            for k in ("calls_per_s", "latency_ms_p50", "latency_ms_p99", "engine_cpu_ms_per_call",
                                      "gateway_cpu_ms_per_call")}
        g = [a for a in arms if a["arm"] == "gateway"]
        summary["added_latency_ms_p50"] = round(summary["gateway"]["latency_ms_p50"] - summary["engine"]["latency_ms_p50"], 2)
        summary["added_latency_ms_p99"] = round(summary["gateway"]["latency_ms_p99"] - summary["engine"]["latency_ms_p99"], 2)
        summary["calls_per_s_ratio"] = round(summary["gateway"]["calls_per_s"] / summary["engine"]["calls_per_s"], 3)
        summary["gateway_own_ms_p50"] = round(statistics.median(a["gateway_ms_p50"] for a in g), 3)
        summary["gateway_own_ms_p99"] = round(statistics.median(a["gateway_ms_p99"] for a in g), 3)
        results["summary"] = summary
        results["planning"] = planning_cost(model, [4, 16, 64] if not args.quick else [4, 16], 20 if not args.quick else 5)
    results["machine"]["load_at_end"] = load()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results["summary"], indent=2))
    for row in results["planning"]:
        print(f"plan after {row['turns']:3d} turns ({row['tokens']} tokens): append path {row['append_path_ms']} ms, "
              f"full render {row['full_render_ms']} ms")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
