"""Sampling what a training run's processes do, for the throughput benchmark's idle-time breakdown.

:class:`RunMonitor` polls, from outside the run, every ``interval`` seconds:

* each engine's ``GET /get_server_info``: cumulative forward (decode + prefill) seconds,
  running and waiting requests, paused (weight update), generated tokens. SGLang 0.5.x
  reports none of these there (core/docs/engine.md section 5): its running and waiting
  requests come from ``GET /get_load`` and its forward seconds are the sampled time with a
  request running (each interval counted by the state at its start);
* the controller's ``GET /api/list_sessions``: trajectories in flight (open sessions);
* the CPU seconds of the run's process tree by role (engine, learner, task workers,
  controller, the driver running the agent loops, Ray; from ``/proc``: Ray workers and
  engines are descendants of the ``agentrl train`` process) and the machine's load average.

:func:`engine_breakdown` turns the samples into seconds per engine state between two times,
attributing each interval by what the learner was doing (phases from ``metrics.jsonl``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


ROLES = (  # (role, substring of the command line), first match wins
    ("engine", "engine serve"),
    ("learner", "LearnerRank"),
    ("env_workers", "cli.main worker"),
    ("controller", "cli.main controller"),
    ("driver_agent_loops", "cli.main train"),
    ("engine_host", "EngineHost"),
)


def _role(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "other"
    for role, needle in ROLES:
        if needle in cmdline:
            return role
    return "ray_and_other"


def tree_cpu_by_role(root_pid: int) -> dict[str, float]:
    """User + system CPU seconds of ``root_pid`` and its live descendants, summed by role."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) "
        pid = int(entry)
        parents[pid] = int(fields[1])
        cpu[pid] = (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[str, float] = {}
    stack = [root_pid]
    while stack:
        pid = stack.pop()
        if pid in cpu:
            role = _role(pid)
            out[role] = out.get(role, 0.0) + cpu[pid]
        stack.extend(children.get(pid, []))
    return out


def tree_cpu_seconds(root_pid: int) -> float:
    """User + system CPU seconds of ``root_pid`` and all its live descendants."""
    return sum(tree_cpu_by_role(root_pid).values())


class RunMonitor:
    """Background sampler of one run (see module docstring). ``start()`` / ``stop()``."""

    def __init__(self, root_pid: int, *, interval: float = 0.25, token: str | None = None) -> None:
        self.root_pid = root_pid
        self.token = token  # the run's AGENTRL_TOKEN: its engines and controller answer 401 without it
        self.interval = interval
        self.engines: dict[str, list[str]] = {}
        self.controller: str | None = None
        self.samples: list[dict[str, Any]] = []
        self._busy: dict[str, tuple[float, bool, float]] = {}  # per engine: last sample, running then, seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="run-monitor", daemon=True)

    def attach(self, controller: str, engines: dict[str, list[str]]) -> None:
        """Start polling these endpoints too (known once the run finished its set-up)."""
        self.controller = controller.rstrip("/")
        if not self.controller.endswith("/api"):
            self.controller += "/api"
        self.engines = engines

    def start(self) -> RunMonitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _sampled_busy(self, key: str, now: float, running: bool) -> float:
        """Seconds with a request running, summed over the samples (an engine without forward time)."""
        last, was_running, total = self._busy.get(key, (now, False, 0.0))
        total += (now - last) if was_running else 0.0
        self._busy[key] = (now, running, total)
        return total

    def _loop(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        with httpx.Client(timeout=2.0, trust_env=False, headers=headers) as http:
            while not self._stop.is_set():
                t0 = time.time()
                sample: dict[str, Any] = {"t": t0, "load1": os.getloadavg()[0]}
                if len(self.samples) % 4 == 0:  # reading /proc costs CPU too: once a second
                    sample["cpu_by_role"] = tree_cpu_by_role(self.root_pid)
                for pool, urls in list(self.engines.items()):
                    for i, url in enumerate(urls):
                        try:
                            reply = http.get(f"{url}/get_server_info")
                            reply.raise_for_status()  # a 401 (no run token) is no sample, not zeros
                            info = reply.json()
                        except (httpx.HTTPError, ValueError):
                            continue
                        key = f"engine/{pool}/{i}"
                        if "forward_seconds" not in info and "internal_states" in info:  # SGLang
                            try:
                                loads = http.get(f"{url}/get_load").raise_for_status().json()
                                waiting = sum(int(x["num_waiting_reqs"]) for x in loads)
                                running = sum(int(x["num_reqs"]) for x in loads) - waiting
                            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                                continue
                            info = {**info, "running": running, "waiting": waiting,
                                    "forward_seconds": self._sampled_busy(key, t0, running > 0)}
                        sample[key] = {
                            "forward_s": float(info.get("forward_seconds", 0.0)),
                            "sampling_s": float(info.get("sampling_seconds", 0.0)),  # the hf engine's
                            "running": int(info.get("running", 0)), "waiting": int(info.get("waiting", 0)),
                            "paused": bool(info.get("paused", False)),
                            "generated": int(info.get("generated_tokens", 0)),
                            "version": _version(info.get("weight_version")),
                        }
                if self.controller:
                    try:
                        sample["sessions"] = len(http.get(f"{self.controller}/list_sessions").json())
                    except (httpx.HTTPError, ValueError, TypeError):
                        pass
                self.samples.append(sample)
                self._stop.wait(max(0.0, self.interval - (time.time() - t0)))


def _version(value: Any) -> int:
    """An engine's weight version as an int; -1 when absent or not numeric (SGLang sends strings, "default" at start)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def learner_phases(steps: Sequence[dict[str, Any]]) -> list[tuple[float, float, str]]:
    """(start, end, phase) of every logged step: rollout wait, advantages, train, weight sync."""
    out = []
    for m in steps:
        end = float(m["time"])
        start = end - float(m.get("time/step_s", 0.0))
        t = start
        for phase, key in (("wait_rollout", "time/wait_rollout_s"), ("advantages", "time/advantages_s"),
                           ("train", "time/train_s"), ("weight_sync", "time/sync_s")):
            d = float(m.get(key, 0.0))
            out.append((t, t + d, phase))
            t += d
    return out


def _phase_at(phases: Sequence[tuple[float, float, str]], t: float) -> str:
    for start, end, phase in phases:
        if start <= t < end:
            return phase
    return "other"


def engine_breakdown(samples: Sequence[dict[str, Any]], key: str, t_from: float, t_to: float,
                     phases: Sequence[tuple[float, float, str]]) -> dict[str, Any]:
    """Seconds of one engine between ``t_from`` and ``t_to`` by state.

    ``forward`` and ``sampling`` are the engine's own accounting of its forward passes and of
    drawing tokens from their logits (together: busy; engines that do not report sampling
    count it in ``forward`` or not at all); the rest of each interval is idle, attributed by the
    engine's state at the interval's start: ``paused`` (weight update),
    ``no_requests`` (every trajectory in flight is in an environment call, being tokenized or
    parsed, or none is admitted), or ``requests_not_forwarding`` (requests present but no
    forward pass: scheduling, sampling, HTTP, and the cores taken by other processes). Idle
    ``no_requests`` time is split further by whether any trajectory was in flight
    (``no_trajectory``: none admitted, e.g. the buffer is full or sync mode is training) and
    by the learner's phase at that moment. ``busy_by_learner_phase``: the engine's busy share
    while the learner waited for rollout, trained, synced weights (sync mode's generation
    phase is ``wait_rollout``).
    """
    seconds: dict[str, float] = {}
    by_phase: dict[str, dict[str, float]] = {}
    running_time = 0.0
    span = 0.0
    pairs = []
    prev = None
    for s in samples:
        if key not in s:
            continue
        if prev is not None and t_from <= prev["t"] and s["t"] <= t_to:
            pairs.append((prev, s))
        prev = s
    # An engine adds a forward pass's seconds to its counter when the pass ends, so a pass longer
    # than the polling interval (a long prefill, e.g. re-prefilling interrupted turns) shows as
    # idle intervals followed by one with more busy seconds than wall seconds. The excess is the
    # same pass's earlier part: it is credited backwards to the intervals before.
    credited: list[tuple[float, float]] = []
    carry_f = carry_s = 0.0
    for prev, s in reversed(pairs):
        dt = s["t"] - prev["t"]
        e0, e1 = prev[key], s[key]
        fwd = max(0.0, e1["forward_s"] - e0["forward_s"]) + carry_f
        smp = max(0.0, e1.get("sampling_s", 0.0) - e0.get("sampling_s", 0.0)) + carry_s
        f = min(dt, fwd)
        m = min(dt - f, smp)
        carry_f, carry_s = fwd - f, smp - m
        credited.append((f, m))
    credited.reverse()
    for (prev, s), (fwd, smp) in zip(pairs, credited, strict=True):
        dt = s["t"] - prev["t"]
        e0, e1 = prev[key], s[key]
        idle = dt - fwd - smp
        span += dt
        running_time += dt * e0["running"]
        seconds["forward"] = seconds.get("forward", 0.0) + fwd
        if smp:
            seconds["sampling"] = seconds.get("sampling", 0.0) + smp
        phase = by_phase.setdefault(_phase_at(phases, prev["t"] + dt / 2), {"span_s": 0.0, "forward_s": 0.0})
        phase["span_s"] += dt
        phase["forward_s"] += fwd + smp
        if e0["paused"] or e1["paused"]:
            state = "paused_weight_sync"
        elif e0["running"] + e0["waiting"] == 0:
            in_flight = prev.get("sessions")
            why = ("no_trajectory" if in_flight == 0 else "trajectories_in_env_or_agent_loop" if in_flight
                   else "unknown")
            state = f"no_requests/{why}/learner_{_phase_at(phases, prev['t'] + dt / 2)}"
        else:
            state = "requests_not_forwarding"
        seconds[state] = seconds.get(state, 0.0) + idle
    return {"span_s": span, "seconds": {k: round(v, 3) for k, v in sorted(seconds.items())},
            "fractions": {k: round(v / span, 4) for k, v in sorted(seconds.items())} if span else {},
            "mean_running_requests": round(running_time / span, 2) if span else 0.0,
            "busy_by_learner_phase": {p: {"span_s": round(v["span_s"], 2), "busy": round(v["forward_s"] / v["span_s"], 4)}
                                      for p, v in sorted(by_phase.items()) if v["span_s"] > 0}}
