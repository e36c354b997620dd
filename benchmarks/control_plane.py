"""Control-plane load benchmark: sessions held, round trips per second, added latency.

    python benchmarks/control_plane.py [--quick] [--out benchmarks/results/control_plane.json]

Starts a real controller (``agentrl controller``) and task workers (``agentrl worker``)
serving a no-op environment (installed for the run as a throw-away plugin distribution),
and drives them from a separate load-generator process (this file with ``_load``), so
the load generator does not share an interpreter with the servers. Measured:

1. sessions held: N sessions started and kept open at once; resident memory of the
   controller and the workers before and after, per session; one interact on each.
2. interaction round trips per second through controller and worker, closed loop, at
   concurrency 1, 64 and 1024 (each client coroutine owns one session).
3. latency added by the controller: an open-loop 500 requests/s stream, once straight to
   the worker's ``/api/interact`` and once through the controller; p50/p99 of each.

The machine is shared: the load average before and after each phase is recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import resource
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TASK = "bench_noop-std"

NOOP_MODULE = '''
"""A no-op environment for the control-plane benchmark: every step answers at once."""
from agentrl_core import hookimpl
from agentrl_core.types import EnvironmentSpec, Status, Step

class NoopSession:
    async def start(self):
        return Step([{"role": "user", "content": "noop"}])
    async def step(self, message):
        return Step([{"role": "tool", "tool_call_id": "call_0", "content": "ok"}])
    async def close(self):
        pass

class NoopEnvironment:
    name = "bench_noop"
    tools = [{"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}}]
    concurrency = 100000
    def __init__(self, config=None):
        pass
    def index_sets(self):
        return {"std": list(range(100))}
    async def open(self, split, index):
        return NoopSession()
    async def aclose(self):
        pass

@hookimpl
def agentrl_environments():
    yield EnvironmentSpec(name="bench_noop", factory="agentrl_bench_noop:NoopEnvironment")
'''

ASSISTANT = {"role": "assistant", "content": "",
             "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "noop", "arguments": "{}"}}]}


# ---------------------------------------------------------------------------------------
# Orchestration (parent process)


def install_noop_plugin(root: Path) -> dict[str, str]:
    (root / "agentrl_bench_noop.py").write_text(textwrap.dedent(NOOP_MODULE))
    info = root / "agentrl_bench_noop-0.0.1.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: agentrl-bench-noop\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[agentrl]\nbench_noop = agentrl_bench_noop\n")
    path = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": path}


def start_process(args: list[str], env: dict[str, str], marker: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "agentrl_core.cli.main", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if marker not in line:
        proc.kill()
        raise RuntimeError(f"{args[0]} did not start: {line!r}")
    url = next(word for word in line.split() if word.startswith("http://"))
    return proc, url


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_load(url: str, mode: str, **options) -> dict:
    args = [sys.executable, __file__, "_load", "--url", url, "--mode", mode]
    for key, value in options.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"load generator ({mode}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def wait_registered(url: str, workers: int, timeout: float = 30.0) -> list[str]:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        data = httpx.get(f"{url}/list_workers", timeout=5).json()
        found = [w["address"] for w in data.get(TASK, {}).get("workers", {}).values() if w["state"] == "alive"]
        if len(found) >= workers:
            return found
        time.sleep(0.1)
    raise RuntimeError(f"{workers} workers did not register within {timeout} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller and shorter: a smoke run")
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=1, help="task worker processes")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per throughput phase")
    parser.add_argument("--latency-rounds", type=int, default=3, help="alternating direct/controller latency runs")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "control_plane.json"))
    if len(sys.argv) > 1 and sys.argv[1] == "_load":
        return load_main(sys.argv[2:])
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.duration, args.latency_rounds = min(args.sessions, 1000), min(args.duration, 3.0), 1
    results: dict = {
        "benchmark": "control_plane",
        "parameters": {"sessions": args.sessions, "workers": args.workers, "duration_s": args.duration,
                       "latency_rounds": args.latency_rounds,
                       "quick": args.quick, "environment": "no-op (answers every step at once)"},
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "date": datetime.now(timezone.utc).isoformat(timespec="seconds")},
        "load_average": {"before": os.getloadavg()},
    }
    with tempfile.TemporaryDirectory() as tmp:
        env = install_noop_plugin(Path(tmp))
        controller, url = start_process(["controller", "--port", "0"], env, "listening on")
        procs = [controller]
        try:
            for _ in range(args.workers):
                worker, _ = start_process(["worker", "--env", "bench_noop", "--split", "std", "--controller", url,
                                           "--concurrency", str(args.sessions + 2048)], env, "listening on")
                procs.append(worker)
            worker_urls = wait_registered(url, args.workers)
            results["phases"] = run_phases(args, url, worker_urls, controller, procs[1:])
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
    results["load_average"]["after"] = os.getloadavg()
    results["summary"] = summarize(results["phases"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results["summary"], indent=2))
    print(f"wrote {args.out}")
    return 0


def run_phases(args, url: str, worker_urls: list[str], controller, workers) -> dict:
    phases: dict = {}
    # Sessions held first, on fresh processes: freed memory is not returned to the OS, so a
    # later measurement would hide the growth behind what earlier phases already allocated.
    before = {"controller": rss_mib(controller.pid), "workers": sum(rss_mib(w.pid) for w in workers)}
    held = run_load(url, "hold", sessions=args.sessions, concurrency=64,
                    rss_pids=",".join(str(p.pid) for p in [controller, *workers]))
    held["rss_mib_before"] = before
    n = max(held["sessions_held"], 1)
    held["controller_kib_per_session"] = (held["rss_mib_held"][0] - before["controller"]) * 1024 / n
    held["worker_kib_per_session"] = (sum(held["rss_mib_held"][1:]) - before["workers"]) * 1024 / n
    held["load_avg_1m"] = os.getloadavg()[0]
    phases["sessions_held"] = held
    print(f"sessions held: {held['sessions_held']} ({held['controller_kib_per_session']:.2f} KiB per session in the "
          f"controller, {held['worker_kib_per_session']:.2f} KiB in the worker)", flush=True)
    for concurrency in (1, 64, 1024):
        load = os.getloadavg()[0]
        cpu = [cpu_seconds(p.pid) for p in (controller, *workers)]
        run = {**run_load(url, "rt", concurrency=concurrency, duration=args.duration), "load_avg_1m": load}
        used = [cpu_seconds(p.pid) - c for p, c in zip((controller, *workers), cpu, strict=True)]
        # CPU per round trip does not depend on what else runs on the machine: it says where the
        # time goes and what two idle cores could do (2 / total CPU seconds per round trip).
        per_rt = {"controller": used[0], "workers": sum(used[1:]), "load_generator": run.pop("cpu_seconds")}
        total = run["round_trips"] / run["seconds"] * (args.duration + 2.0)  # includes warm-up and set-up
        run["cpu_us_per_round_trip"] = {k: round(v / total * 1e6, 1) for k, v in per_rt.items()}
        run["idle_two_core_estimate_per_s"] = round(2e6 / sum(run["cpu_us_per_round_trip"].values()))
        phases[f"round_trips_c{concurrency}"] = run
        print(f"round trips at concurrency {concurrency}: {run['per_second']:.0f}/s; CPU per round trip "
              f"{run['cpu_us_per_round_trip']} us (load {load:.1f})", flush=True)
    # The machine is shared and its load comes in bursts: alternate direct and controller runs
    # several times and report the median round, with every round kept in the JSON.
    for target in ("worker", "controller"):
        phases[f"latency_500rps_{target}"] = {"rounds": []}
    for _ in range(args.latency_rounds):
        for target in ("worker", "controller"):
            run = {**run_load(url, "latency", target=target, rate=500, duration=args.duration),
                   "load_avg_1m": os.getloadavg()[0]}
            phases[f"latency_500rps_{target}"]["rounds"].append(run)
            print(f"latency at 500 req/s via {target}: p50 {run['p50_ms']} ms, p99 {run['p99_ms']} ms "
                  f"(load {run['load_avg_1m']:.1f})", flush=True)
    for target in ("worker", "controller"):
        rounds = phases[f"latency_500rps_{target}"]["rounds"]
        for key in ("p50_ms", "p90_ms", "p99_ms"):
            phases[f"latency_500rps_{target}"][key] = sorted(r[key] for r in rounds)[len(rounds) // 2]
    return phases


def summarize(phases: dict) -> dict:
    worker, ctl = phases["latency_500rps_worker"], phases["latency_500rps_controller"]
    held = phases["sessions_held"]
    return {
        "sessions_held": held["sessions_held"],
        "controller_kib_per_session": round(held["controller_kib_per_session"], 2),
        "worker_kib_per_session": round(held["worker_kib_per_session"], 2),
        "round_trips_per_s": {c: round(phases[f"round_trips_c{c}"]["per_second"]) for c in (1, 64, 1024)},
        "cpu_us_per_round_trip_c64": phases["round_trips_c64"]["cpu_us_per_round_trip"],
        "idle_two_core_estimate_per_s_c64": phases["round_trips_c64"]["idle_two_core_estimate_per_s"],
        "load_average_1m_during_c64": round(phases["round_trips_c64"]["load_avg_1m"], 1),
        "latency_ms_at_500rps": {"median_of_rounds": len(worker["rounds"]),
                                 "direct_p50": worker["p50_ms"], "direct_p99": worker["p99_ms"],
                                 "controller_p50": ctl["p50_ms"], "controller_p99": ctl["p99_ms"],
                                 "added_p50": round(ctl["p50_ms"] - worker["p50_ms"], 3),
                                 "added_p99": round(ctl["p99_ms"] - worker["p99_ms"], 3)},
    }


# ---------------------------------------------------------------------------------------
# Load generator (child process)


def load_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="control_plane.py _load")
    p.add_argument("--url", required=True)
    p.add_argument("--mode", choices=["rt", "latency", "hold"], required=True)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--rate", type=float, default=500.0)
    p.add_argument("--target", choices=["worker", "controller"], default="controller")
    p.add_argument("--sessions", type=int, default=10_000)
    p.add_argument("--rss-pids", default="")
    args = p.parse_args(argv)
    from agentrl_core.http.server import raise_fd_limit, run_event_loop, tune_gc

    raise_fd_limit()
    tune_gc()  # as the controller and worker commands do
    result = run_event_loop(lambda: {"rt": load_rt, "latency": load_latency, "hold": load_hold}[args.mode](args))
    print(json.dumps(result))
    return 0


class Api:
    """The controller API over the lean pooled client (so the load generator stays cheap)."""

    def __init__(self, url: str) -> None:
        from agentrl_core.http.client import Pool

        self.pool, self.base = Pool.for_url(url, idle_timeout=60.0)
        self.interact_body = json.dumps({"messages": [ASSISTANT]}).encode()

    async def start(self, index: int = 0) -> int:
        response = await self.pool.request_json("POST", f"{self.base}/start_sample", {"name": TASK, "index": index},
                                                timeout=60)
        if response.status != 200:
            raise RuntimeError(f"start failed: {response.status} {response.detail()}")
        return int(response.headers["session_id"])

    async def interact(self, sid: int) -> None:
        response = await self.pool.request("POST", f"{self.base}/interact", self.interact_body,
                                           headers=[("session_id", str(sid))], timeout=60)
        if response.status != 200:
            raise RuntimeError(f"interact failed: {response.status} {response.detail()}")

    async def get(self, path: str):
        return (await self.pool.request("GET", f"{self.base}/{path}", timeout=60)).json()

    async def cancel_all(self) -> None:
        await self.pool.request("POST", f"{self.base}/cancel_all?name={TASK}", timeout=120)


async def start_many(api: Api, n: int, concurrency: int) -> list[int]:
    sids: list[int] = []

    async def one_by_one(k: int) -> None:
        for _ in range(k):
            sids.append(await api.start(len(sids) % 100))

    per = [n // concurrency + (1 if i < n % concurrency else 0) for i in range(concurrency)]
    await asyncio.gather(*(one_by_one(k) for k in per if k))
    return sids


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


async def load_rt(args) -> dict:
    api = Api(args.url)
    sids = await start_many(api, args.concurrency, min(args.concurrency, 64))
    latencies: list[float] = []
    done = 0
    t_start = time.perf_counter() + args.warmup
    t_end = t_start + args.duration

    async def client(sid: int) -> None:
        nonlocal done
        while True:
            t0 = time.perf_counter()
            if t0 >= t_end:
                return
            await api.interact(sid)
            t1 = time.perf_counter()
            if t0 >= t_start:
                done += 1
                latencies.append(t1 - t0)

    await asyncio.gather(*(client(sid) for sid in sids))
    await api.cancel_all()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"concurrency": args.concurrency, "round_trips": done, "seconds": args.duration,
            "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "per_second": done / args.duration, "p50_ms": round(percentile(latencies, 0.5) * 1000, 3),
            "p99_ms": round(percentile(latencies, 0.99) * 1000, 3)}


async def load_latency(args) -> dict:
    """Open loop: requests are due at a fixed rate whatever the latency (no coordinated omission)."""
    from agentrl_core.http.client import Pool

    api = Api(args.url)
    sids = await start_many(api, 256, 32)  # enough idle sessions that the schedule never waits for one
    if args.target == "worker":
        workers = await api.get("list_workers")
        address = next(iter(workers[TASK]["workers"].values()))["address"]
        pool, base = Pool.for_url(address, idle_timeout=60.0)

        async def send(sid: int) -> None:
            body = json.dumps({"session_id": sid, "messages": [ASSISTANT]}).encode()
            response = await pool.request("POST", f"{base}/interact", body, timeout=60)
            if response.status != 200:
                raise RuntimeError(f"worker interact failed: {response.status}")
    else:
        send = api.interact
    free = list(sids)
    latencies: list[float] = []
    interval = 1.0 / args.rate
    n_warm, n_total = int(args.warmup * args.rate), int((args.warmup + args.duration) * args.rate)
    t_zero = time.perf_counter()
    tasks = []

    async def one(i: int, due: float, sid: int) -> None:
        try:
            await send(sid)
        finally:
            free.append(sid)
        if i >= n_warm:
            latencies.append(time.perf_counter() - due)

    for i in range(n_total):
        due = t_zero + i * interval
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if not free:  # every session is busy: open one more (outside the measured window's budget)
            sids.append(await api.start())
            free.append(sids[-1])
        tasks.append(asyncio.ensure_future(one(i, due, free.pop())))
    await asyncio.gather(*tasks)
    await api.cancel_all()
    return {"target": args.target, "rate": args.rate, "requests": len(latencies),
            "p50_ms": round(percentile(latencies, 0.5) * 1000, 3), "p90_ms": round(percentile(latencies, 0.9) * 1000, 3),
            "p99_ms": round(percentile(latencies, 0.99) * 1000, 3), "max_ms": round(max(latencies) * 1000, 3)}


async def load_hold(args) -> dict:
    api = Api(args.url)
    t0 = time.perf_counter()
    sids = await start_many(api, args.sessions, args.concurrency)
    start_s = time.perf_counter() - t0
    pids = [int(p) for p in args.rss_pids.split(",") if p]
    health = await api.get("health")
    rss = [rss_mib(pid) for pid in pids]
    t1 = time.perf_counter()
    queue = list(sids)
    random.shuffle(queue)

    async def drain() -> None:
        while queue:
            await api.interact(queue.pop())

    await asyncio.gather(*(drain() for _ in range(args.concurrency)))
    touch_s = time.perf_counter() - t1
    await api.cancel_all()
    after = await api.get("health")
    return {"sessions_started": len(sids), "sessions_held": health["sessions"], "start_seconds": round(start_s, 2),
            "starts_per_second": round(len(sids) / start_s, 1), "interact_each_seconds": round(touch_s, 2),
            "rss_mib_held": rss, "sessions_after_cancel_all": after["sessions"]}


if __name__ == "__main__":
    sys.exit(main())
