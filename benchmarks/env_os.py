"""OS environment benchmark: oracle over std, container-ready latency, throughput, leaks.

    python benchmarks/env_os.py [--quick] [--rebuild] [--out PATH]

Needs agentrl-env-os installed and the Docker engine with the task images
(``plugins/agentrl-env-os/tests/ci_setup.sh`` as root prepares both). Measured:

1. image build: with ``--rebuild`` a complete set is built from scratch (debootstrap included)
   under a separate name prefix, each step timed, and removed again; the images in use are
   recorded either way;
2. the oracle over the full ``std`` set (``--quick``: 30 tasks) at concurrency 8: reward-1
   rate, every miss with its cause, episodes per minute, and the container-ready latency
   (container created and started or taken from the warm pool) of every episode;
3. container-ready latency of sequential episodes, without and with the warm pool;
4. episodes per minute at concurrency 8 for long episodes (7 shell commands, then an answer);
5. leaks through the real control plane: ``agentrl controller`` and two ``agentrl worker``
   processes, 200 episodes (``--quick``: 40) at concurrency 8 with random cancels (after
   start, during a running command, abandoned starts), one worker killed with SIGKILL
   halfway and replaced; then ``docker ps -a`` must show none of this environment's
   containers (before and after the graceful shutdown).

The machine is shared: the load average before and after each phase is recorded.

    python benchmarks/env_os.py --fidelity [--transcripts DIR] [--models a,b] [--distros ubuntu,debian]
                                [--replay-only] [--indices 18-36]

measures instead how close the containers come to upstream's (``agentrl_env_os.fidelity``), for
the images of each distribution (``ubuntu``, the default, and ``debian``, the earlier one; missing
images are built): image probes; every std task's example script (upstream's own check command)
after the task's init scripts, compared across the images and with the values upstream's runs
printed; and, given a folder of AgentBench-FC run logs (``<model>/os-std/runs.jsonl``, not part of
this repository), the recorded bash commands replayed with each output compared with upstream's.
Output: ``benchmarks/results/env_os_fidelity.json``.
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
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import anyio
from agentrl_env_os.config import OSConfig
from agentrl_env_os.docker_backend import LABEL_MANAGED, LABEL_PID
from agentrl_env_os.env import OSEnvironment
from agentrl_env_os.images import IMAGE_NAMES, ImageBuilder, image_ref
from agentrl_env_os.pool import POOL_PREFIX

from agentrl_core.env import assistant_tool_call, play_episode

ROOT = Path(__file__).resolve().parent.parent
SIZE_MATCH_DEFECT = (
    "debian images only: the checker size-match.py parses `du -sh /home` ('8.0K' for the empty /home) with "
    "int('8.0') and fails; the ubuntu images have /home/ubuntu as upstream's, du prints '24K' and the answer passes"
)
KNOWN_CAUSES = {
    ("dev", 8): SIZE_MATCH_DEFECT,
    ("train", 390): SIZE_MATCH_DEFECT,
    ("std", 22): "sandbox limit: the init script `echo 123321>/var/tmp.log` redirects file descriptor 123321, but this "
        "machine caps open files at 20000 (no CAP_SYS_RESOURCE, so dockerd cannot raise it); upstream hosts allow "
        "1048576. tests/ci_setup.sh raises the limit where the kernel permits; environments.os.open_files sets it "
        "per container where the host allows.",
}
QUICK_SUBSET = [0, 5, 7, 9, 11, 12, 13, 14, 16, 17, 18, 19, 21, 23, 29, 30, 31, 33, 35, 37, 38, 39, 42, 44, 47,
                49, 52, 55, 56, 60]


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def summary(values: list[float]) -> dict:
    return {"n": len(values), "p50": round(pct(values, 0.5), 3), "p90": round(pct(values, 0.9), 3),
            "max": round(max(values), 3) if values else None,
            "mean": round(statistics.fmean(values), 3) if values else None}


# -- 1. images -------------------------------------------------------------------------------


def images(rebuild: bool) -> dict:
    env = OSEnvironment(OSConfig())
    api = env.backend.api
    api.timeout = 3600
    out: dict = {"load_before": load()}
    if rebuild:
        # A from-scratch build under a separate prefix: the images in use stay untouched.
        prefix = "agentrl-os-buildbench"
        builder = ImageBuilder(api, prefix=prefix, say=lambda s: print("  " + s, flush=True))
        try:
            builder.build(IMAGE_NAMES, force=True)
            out["build_seconds"] = {k: round(v, 1) for k, v in builder.timings.items()}
            out["build_dir"] = builder.workdir
        finally:
            for name in ["ubuntu", "packages", "default", "base"]:
                for ref in (builder.ref(name), f"{prefix}/{name}:latest"):
                    try:
                        api.remove_image(ref, force=True)
                    except Exception:
                        pass
    out["images"] = {}
    for name in IMAGE_NAMES:
        info = api.inspect_image(image_ref(name))
        out["images"][name] = {"ref": image_ref(name), "size_mb": round(info["Size"] / 1e6)}
    out["load_after"] = load()
    return out


# -- 2. oracle over std ------------------------------------------------------------------------


async def oracle_run(indices: list[int], concurrency: int, split: str = "std") -> dict:
    env = OSEnvironment(OSConfig(concurrency=concurrency))
    results: dict[int, dict] = {}
    limiter = anyio.CapacityLimiter(concurrency)

    async def one(index: int) -> None:
        async with limiter:
            t0 = time.monotonic()
            try:
                episode = await play_episode(env, split, index, env.oracle(split, index))
                results[index] = {"reward": episode.reward, "status": episode.status.value,
                                  "verdict": episode.metrics.get("verdict"), "seconds": round(time.monotonic() - t0, 2),
                                  "container_ready_s": episode.metrics.get("container_ready_s")}
                if episode.reward != 1.0:
                    results[index]["last_messages"] = episode.messages[-2:]
            except Exception as exc:  # an infrastructure failure (the worker would report task error)
                results[index] = {"reward": 0.0, "status": "task error", "error": f"{type(exc).__name__}: {exc}"[:400],
                                  "seconds": round(time.monotonic() - t0, 2)}

    load_before = load()
    t0 = time.monotonic()
    try:
        async with anyio.create_task_group() as tg:
            for index in indices:
                tg.start_soon(one, index)
    finally:
        await env.aclose()
    wall = time.monotonic() - t0
    solved = sum(1 for r in results.values() if r["reward"] == 1.0)
    misses = []
    for index, r in sorted(results.items()):
        if r["reward"] != 1.0:
            task = env.task(split, index)
            misses.append({"index": index, "file": f"{task.source}#{task.index_in_file}", "status": r["status"],
                           "detail": r.get("error") or r.get("verdict"),
                           "cause": KNOWN_CAUSES.get((split, index), "unexplained"),
                           "last_messages": r.get("last_messages")})
    ready = [r["container_ready_s"] for r in results.values() if r.get("container_ready_s") is not None]
    return {
        "tasks": len(indices), "solved": solved, "success_rate": round(solved / len(indices), 4),
        "concurrency": concurrency, "wall_seconds": round(wall, 1),
        "episodes_per_minute": round(len(indices) / wall * 60, 1),
        "container_ready_s": summary(ready), "episode_seconds": summary([r["seconds"] for r in results.values()]),
        "misses": misses, "load_before": load_before, "load_after": load(),
    }


# -- 3. sequential latency ---------------------------------------------------------------------


async def sequential_latency(n: int, warm_pool: int) -> dict:
    env = OSEnvironment(OSConfig(warm_pool=warm_pool))
    ready, start, close = [], [], []
    warm = 0
    load_before = load()
    try:
        for _ in range(n):
            session = await env.open("std", 12)
            t0 = time.monotonic()
            try:
                step = await session.start()
                start.append(time.monotonic() - t0)
                ready.append(step.metrics["container_ready_s"])
                warm += int(step.metrics["warm_container"])
            finally:
                t1 = time.monotonic()
                await session.close()
                close.append(time.monotonic() - t1)
    finally:
        await env.aclose()
    return {"warm_pool": warm_pool, "from_warm_pool": warm,
            "container_ready_s": summary(ready), "start_s": summary(start), "close_s": summary(close),
            "note": "container ready = container created and started (or taken from the warm pool and renamed); "
                    "the agent's shell opens after the init scripts, as upstream's; start_s adds the init "
                    "scripts (none for this task), the shell and the prompt",
            "load_before": load_before, "load_after": load()}


# -- 4. long episodes --------------------------------------------------------------------------


async def long_episodes(n: int, concurrency: int) -> dict:
    env = OSEnvironment(OSConfig(concurrency=concurrency))
    limiter = anyio.CapacityLimiter(concurrency)
    commands = ["ls -la /root", "ps aux | wc -l", "df -h / | tail -1", "find /etc -name '*.conf' | wc -l",
                "cat /etc/os-release | head -3", "du -sh /usr/lib 2>/dev/null", "getent group | wc -l"]
    rewards = []

    async def one(i: int) -> None:
        async with limiter:
            session = await env.open("std", 13)  # "How many groups?"
            try:
                await session.start()
                for script in commands:
                    await session.step(assistant_tool_call("bash_action", {"script": script}))
                step = await session.step(assistant_tool_call("answer_action", {"answer": "0"}))
                rewards.append(step.reward)
            finally:
                await session.close()

    load_before = load()
    t0 = time.monotonic()
    try:
        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
    finally:
        await env.aclose()
    wall = time.monotonic() - t0
    return {"episodes": n, "turns_per_episode": len(commands) + 1, "concurrency": concurrency,
            "wall_seconds": round(wall, 1), "episodes_per_minute": round(n / wall * 60, 1),
            "commands_per_second": round(n * len(commands) / wall, 1),
            "load_before": load_before, "load_after": load()}


# -- 5. leaks through the control plane --------------------------------------------------------


class Proc:
    """A subprocess whose first line matching ``ready`` is awaited (with a deadline)."""

    def __init__(self, args: list[str], ready: str, timeout: float = 60.0) -> None:
        self.popen = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        found = threading.Event()

        def pump() -> None:
            for line in self.popen.stdout:
                self.lines.append(line.rstrip())
                if ready in line:
                    found.set()

        threading.Thread(target=pump, daemon=True).start()
        if not found.wait(timeout):
            self.popen.kill()
            raise RuntimeError(f"{args[3]} did not start: {self.lines[-10:]}")

    def url(self) -> str:
        for line in self.lines:
            for word in line.split():
                if word.startswith("http://"):
                    return word.rstrip(",")
        raise RuntimeError(f"no URL in {self.lines}")


def our_containers(api, pid: int | None = None, *, idle_pool: bool = True) -> list:
    """This environment's containers (of one worker pid); ``idle_pool=False`` leaves out warm-pool ones."""
    labels = [f"{LABEL_MANAGED}=1"] + ([f"{LABEL_PID}={pid}"] if pid else [])
    found = api.containers(all=True, filters={"label": labels})
    if idle_pool:
        return found
    return [c for c in found if not any(n.lstrip("/").startswith(POOL_PREFIX) for n in c.get("Names") or [])]


async def leak_run(episodes: int, concurrency: int, seed: int = 0) -> dict:
    from agentrl_core.controlplane.client import ControllerClient, NoCapacity

    cli = [sys.executable, "-m", "agentrl_core.cli.main"]
    local = OSEnvironment(OSConfig())  # for oracles and Docker queries only
    api = local.backend.api
    before = len(our_containers(api))
    controller = Proc([*cli, "controller", "--port", "0", "--unresponsive-after", "3", "--remove-after", "6",
                       "--idle-session-timeout", "15", "--reconcile-interval", "5"], "listening on")
    url = controller.url()

    def worker() -> Proc:
        return Proc([*cli, "worker", "--env", "os", "--split", "std", "--controller", url, "--concurrency", "6",
                     "--heartbeat-interval", "1"], "listening on")

    workers = [worker(), worker()]
    rng = random.Random(seed)
    stats = {"completed": 0, "cancelled_after_start": 0, "cancelled_mid_command": 0, "abandoned_start": 0,
             "solved": 0, "infra_errors": 0, "task_errors": 0, "retried_full": 0}
    killed: dict = {}
    errors: dict[str, int] = {}
    done = 0
    limiter = anyio.CapacityLimiter(concurrency)

    async with ControllerClient(url, start_timeout=120, interact_timeout=120) as client:
        deadline = time.monotonic() + 30
        while len((await client.list_workers()).get("os-std", {}).get("workers", [])) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers did not register: {await client.list_workers()}")
            await anyio.sleep(0.2)

        async def start(index: int):
            """Start a session; a full task (406) is retried, as a rollout engine does."""
            for _ in range(300):
                try:
                    return await client.start("os-std", index)
                except NoCapacity:
                    stats["retried_full"] += 1
                    await anyio.sleep(0.2)
            raise RuntimeError("no capacity for 60 s")

        async def episode(i: int) -> None:
            nonlocal done
            index = rng.randrange(144)
            mode = rng.choices(["play", "after_start", "mid_command", "abandon"], [0.6, 0.15, 0.15, 0.1])[0]
            async with limiter:
                try:
                    if mode == "abandon":
                        with anyio.move_on_after(rng.uniform(0.05, 0.6)):
                            await start(index)
                        stats["abandoned_start"] += 1  # the controller's idle expiry ends it
                        return
                    started = await start(index)
                    if started.finish:
                        stats["task_errors"] += 1
                        return
                    sid = started.session_id
                    if mode == "after_start":
                        await client.cancel(sid)
                        stats["cancelled_after_start"] += 1
                        return
                    if mode == "mid_command":
                        async with anyio.create_task_group() as tg:
                            async def slow() -> None:
                                try:
                                    await client.interact(sid, [assistant_tool_call("bash_action", {"script": "sleep 20"})])
                                except Exception:
                                    pass
                            tg.start_soon(slow)
                            await anyio.sleep(rng.uniform(0.2, 2.0))
                            await client.cancel(sid)
                        stats["cancelled_mid_command"] += 1
                        return
                    oracle = local.oracle("std", index)
                    messages = list(started.messages)
                    result = started
                    while not result.finish:
                        action = oracle.act(messages)
                        messages.append(action)
                        result = await client.interact(sid, [action])
                        messages.extend(result.messages)
                    if result.status.value == "completed":
                        stats["completed"] += 1
                        stats["solved"] += int(result.reward == 1.0)
                    else:
                        stats["task_errors"] += 1
                    await client.cancel(sid)  # always safe, as the agent loop does
                except Exception as exc:
                    stats["infra_errors"] += 1
                    key = f"{type(exc).__name__}: {str(exc)[:120]}"
                    errors[key] = errors.get(key, 0) + 1
                finally:
                    done += 1

        async def killer() -> None:
            while done < episodes // 2:
                await anyio.sleep(0.1)
            victim = workers[0]
            pid = victim.popen.pid
            killed["pid"] = pid
            killed["containers_at_kill"] = len(our_containers(api, pid))
            victim.popen.send_signal(signal.SIGKILL)
            victim.popen.wait()
            workers.append(worker())  # the replacement sweeps the dead worker's containers on its first session
            deadline = time.monotonic() + 60
            while our_containers(api, pid) and time.monotonic() < deadline:
                await anyio.sleep(0.5)
            killed["containers_left_after_sweep"] = len(our_containers(api, pid))
            killed["sweep_seconds_after_kill"] = round(60 - (deadline - time.monotonic()), 1)

        t0 = time.monotonic()
        load_before = load()
        async with anyio.create_task_group() as tg:
            tg.start_soon(killer)
            for i in range(episodes):
                tg.start_soon(episode, i)
        wall = time.monotonic() - t0
        # Abandoned starts end by the controller's idle expiry (15 s here); wait for it.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            sessions = await client.list_sessions("os-std")
            if not sessions and len(our_containers(api, idle_pool=False)) == before:
                break
            await anyio.sleep(1)
        in_use_before_shutdown = len(our_containers(api, idle_pool=False)) - before
        idle_pool_before_shutdown = len(our_containers(api)) - before - in_use_before_shutdown

    for proc in [*workers[1:], controller]:
        proc.popen.send_signal(signal.SIGTERM)
    for proc in [*workers[1:], controller]:
        try:
            proc.popen.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
    after = our_containers(api)
    await local.aclose()
    return {"episodes": episodes, "concurrency": concurrency, "wall_seconds": round(wall, 1), **stats,
            "errors": errors, "killed_worker": killed, "containers_before_run": before,
            "containers_in_use_before_shutdown": in_use_before_shutdown,
            "idle_warm_pool_containers_before_shutdown": idle_pool_before_shutdown,
            "containers_left_after_shutdown": len(after) - before,
            "docker_ps_a_ours": [c["Names"] for c in after], "load_before": load_before, "load_after": load()}


# -- fidelity to upstream's containers ---------------------------------------------------------


def fidelity(distros: list[str], transcripts: str | None, models: list[str] | None, concurrency: int,
             replay_only: bool = False, indices: range | None = None) -> dict:
    from agentrl_env_os import fidelity as fid

    out: dict = {"distros": {}}
    recorded = fid.read_runs(transcripts) if transcripts else []
    if models:
        recorded = [e for e in recorded if e.model in models]
    if indices is not None:
        recorded = [e for e in recorded if e.index in indices]
    examples = {}

    def measure(distro: str, fn) -> object:
        async def main():  # one environment per event loop
            env = OSEnvironment(OSConfig(distro=distro, concurrency=concurrency, warm_pool=0))
            try:
                return await fn(env)
            finally:
                await env.aclose()

        return anyio.run(main)

    for distro in distros:
        api = OSEnvironment(OSConfig(distro=distro)).backend.api
        api.timeout = 3600
        builder = ImageBuilder(api, distro=distro, say=lambda s: print("  " + s, flush=True))
        builder.build(IMAGE_NAMES)
        section: dict = {"images": {n: builder.ref(n) for n in IMAGE_NAMES}, "load_before": load()}
        if not replay_only:
            print(f"{distro}: probes ...", flush=True)
            section["probes"] = measure(distro, fid.probe)
            print(f"{distro}: example scripts of the std tasks ...", flush=True)
            t0 = time.monotonic()
            examples[distro] = measure(distro, lambda env: fid.example_outputs(env, range(144), concurrency=concurrency))
            section["example_seconds"] = round(time.monotonic() - t0, 1)
            section["example_outputs"] = examples[distro]
            section["upstream_observed"] = fid.upstream_agreement(examples[distro])
            print(f"  upstream's printed values: {section['upstream_observed']['same']}/"
                  f"{section['upstream_observed']['of']}", flush=True)
        if recorded:
            print(f"{distro}: replaying {len(recorded)} recorded episodes ...", flush=True)
            t0 = time.monotonic()
            results = measure(distro, lambda env: fid.replay_all(env, recorded, concurrency=concurrency))
            by_model: dict[str, list] = {}
            for r in results:
                by_model.setdefault(r.episode.model, []).append(r)
            section["replay"] = {
                "seconds": round(time.monotonic() - t0, 1),
                # Recorded episodes whose first message is not our task of that index (left out): 0
                # since std follows upstream's file order.
                "prompt_mismatches": len(fid.prompt_mismatches(OSEnvironment(OSConfig(distro=distro)), recorded)),
                "all": fid.summarize(results),
                "by_model": {m: fid.summarize(rs) for m, rs in sorted(by_model.items())},
                # Which episodes differ (the recorded text is third-party data and stays out of the file).
                "differing_episodes": sorted(
                    [r.episode.model, r.episode.index] for r in results if r.first_difference),
            }
            a = section["replay"]["all"]
            print(f"  all outputs the same in {a['all_outputs_same']}/{a['scored']} episodes; "
                  f"commands {a['command_outputs']}", flush=True)
        section["load_after"] = load()
        out["distros"][distro] = section
    if len(examples) == 2:
        out["example_outputs_compared"] = fid.compare_examples(*(examples[d] for d in distros))
    return out


# -- main --------------------------------------------------------------------------------------


def index_range(text: str | None) -> range | None:
    if not text:
        return None
    first, _, last = text.partition("-")
    return range(int(first), int(last or first) + 1)


def docker_info() -> dict:
    env = OSEnvironment(OSConfig())
    info = env.backend.api.info()
    return {"server_version": info.get("ServerVersion"), "storage_driver": info.get("Driver"),
            "cgroup": f"v{info.get('CgroupVersion')} {info.get('CgroupDriver')}", "kernel": info.get("KernelVersion")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="30 std tasks, a 40-episode leak run")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the images from scratch and time it")
    parser.add_argument("--out", help="output JSON (default benchmarks/results/env_os[_quick].json)")
    parser.add_argument("--fidelity", action="store_true", help="compare the containers with upstream's instead")
    parser.add_argument("--distros", default="debian,ubuntu", help="with --fidelity: image distributions to measure")
    parser.add_argument("--transcripts", help="with --fidelity: a folder of AgentBench-FC run logs to replay")
    parser.add_argument("--models", help="with --transcripts: only these model folders (comma-separated)")
    parser.add_argument("--replay-only", action="store_true", help="with --transcripts: only the replay (no probes, "
                        "no example scripts)")
    parser.add_argument("--indices", help="with --transcripts: only these upstream std indices, e.g. 18-36")
    args = parser.parse_args()
    if args.fidelity:
        out = Path(args.out or ROOT / "benchmarks" / "results" / "env_os_fidelity.json")
        result = {"benchmark": "env_os_fidelity",
                  "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "docker": docker_info()},
                  "transcripts": bool(args.transcripts), "replay_only": args.replay_only, "indices": args.indices,
                  **fidelity(args.distros.split(","), args.transcripts,
                             args.models.split(",") if args.models else None, concurrency=4,
                             replay_only=args.replay_only, indices=index_range(args.indices))}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out}")
        return 0
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"env_os{'_quick' if args.quick else ''}.json")
    result: dict = {
        "benchmark": "env_os", "quick": args.quick,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "docker": docker_info()},
    }
    print("images ...", flush=True)
    result["images"] = images(args.rebuild)
    indices = QUICK_SUBSET if args.quick else list(range(144))
    print(f"oracle over {len(indices)} std tasks ...", flush=True)
    result["oracle_std"] = anyio.run(oracle_run, indices, 8)
    o = result["oracle_std"]
    print(f"  {o['solved']}/{o['tasks']} = {o['success_rate']:.1%}, {o['episodes_per_minute']} episodes/min, "
          f"ready p50 {o['container_ready_s']['p50']} s", flush=True)
    if not args.quick:
        for split, chosen in (("dev", list(range(26))), ("train", random.Random(1).sample(range(1000), 100))):
            print(f"oracle over {len(chosen)} {split} tasks ...", flush=True)
            run = anyio.run(oracle_run, sorted(chosen), 8, split)
            result[f"oracle_{split}"] = run
            print(f"  {run['solved']}/{run['tasks']} = {run['success_rate']:.1%}", flush=True)
    print("sequential container-ready latency ...", flush=True)
    result["sequential_latency"] = {
        f"warm_pool_{size}": anyio.run(sequential_latency, 10 if args.quick else 30, size) for size in (0, 4)
    }
    for key, value in result["sequential_latency"].items():
        print(f"  {key}: {value['container_ready_s']}", flush=True)
    print("long episodes at concurrency 8 ...", flush=True)
    result["long_episodes"] = anyio.run(long_episodes, 16 if args.quick else 48, 8)
    print(f"  {result['long_episodes']['episodes_per_minute']} episodes/min", flush=True)
    print("leak run through the control plane ...", flush=True)
    result["leaks"] = anyio.run(leak_run, 40 if args.quick else 200, 8)
    leaks = result["leaks"]
    print(f"  in use before shutdown {leaks['containers_in_use_before_shutdown']}, left after "
          f"{leaks['containers_left_after_shutdown']}; killed worker: {leaks['killed_worker']}", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    ok = leaks["containers_left_after_shutdown"] == 0 and leaks["containers_in_use_before_shutdown"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
