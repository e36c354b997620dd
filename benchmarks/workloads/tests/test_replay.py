"""Tests of the throughput benchmark's harness: the replay environment and the monitor's accounting.

    /work/venvs/throughput/bin/python -m pytest benchmarks/workloads/tests -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

WORKLOADS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(WORKLOADS))
sys.path.insert(0, str(WORKLOADS.parent))

from agentrl_bench_replay.env import ReplayConfig, ReplayEnvironment, filler_text  # noqa: E402
from monitor import engine_breakdown, learner_phases, tree_cpu_by_role, tree_cpu_seconds  # noqa: E402

from agentrl_core.env.episodes import play_episode  # noqa: E402
from agentrl_core.errors import ConfigError  # noqa: E402
from agentrl_core.types import Status  # noqa: E402

TOOLS_A = [{"type": "function", "function": {"name": "take_action", "description": "act",
                                             "parameters": {"type": "object", "properties": {}}}}]
TOOLS_B = [{"type": "function", "function": {"name": "execute_sql", "description": "sql",
                                             "parameters": {"type": "object", "properties": {}}}}]


def episode(turns: int, step: float, obs: list[int], status: str = "completed", reward: float = 1.0) -> dict:
    return {"turns": turns, "start_s": 0.0, "step_s": [step] * turns, "close_s": 0.0, "prompt_chars": 50,
            "obs_chars": obs, "action_chars": [10] * turns, "status": status, "reward": reward}


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    data = {"environments": {
        "alfworld": {"tools": TOOLS_A, "text_sample": ["You are in the middle of a room."],
                     "episodes": [episode(3, 0.0, [5, 7, 0]), episode(1, 0.05, [4], "task limit reached", 0.0)]},
        "db": {"tools": TOOLS_B, "text_sample": ["[('a', 1)]"], "episodes": [episode(2, 0.0, [3, 3])]},
    }}
    path = tmp_path / "w.json"
    path.write_text(json.dumps(data))
    return path


def test_index_sets_and_tools_follow_the_recording(workload: Path) -> None:
    env = ReplayEnvironment(ReplayConfig(workload=str(workload)))
    assert {k: list(v) for k, v in env.index_sets().items()} == {"alfworld": [0, 1], "db": [0]}
    session = anyio.run(env.open, "db", 0)
    assert session.tools == TOOLS_B


def test_an_episode_has_the_recorded_turns_lengths_status_and_reward(workload: Path) -> None:
    env = ReplayEnvironment(ReplayConfig(workload=str(workload)))
    played = anyio.run(lambda: play_episode(env, "alfworld", 0, env.oracle("alfworld", 0)))
    assert played.status is Status.COMPLETED and played.reward == 1.0
    assistant = [m for m in played.messages if m["role"] == "assistant"]
    observations = [m for m in played.messages if m["role"] == "tool"]
    assert len(assistant) == 3
    assert [len(m["content"]) for m in observations] == [5, 7]  # the last recorded observation is empty
    assert played.messages[0]["content"] == "You are in the middle of a room.\nYou are in the mi"


def test_a_turn_without_a_tool_call_still_counts_and_gets_a_user_observation(workload: Path) -> None:
    env = ReplayEnvironment(ReplayConfig(workload=str(workload)))

    async def play() -> list:
        session = await env.open("db", 0)
        await session.start()
        first = await session.step({"role": "assistant", "content": "no idea"})
        last = await session.step({"role": "assistant", "content": "still none"})
        await session.close()
        return [first, last]

    first, last = anyio.run(play)
    assert first.messages[0]["role"] == "user" and not first.finish
    assert last.status is Status.COMPLETED and last.metrics["invalid_turns"] == 2


def test_step_latency_is_the_recorded_one_times_the_scale(workload: Path) -> None:
    async def timed(scale: float) -> float:
        env = ReplayEnvironment(ReplayConfig(workload=str(workload), latency_scale=scale))
        session = await env.open("alfworld", 1)
        await session.start()
        t0 = time.perf_counter()
        step = await session.step(env.oracle("alfworld", 1).act([]))
        elapsed = time.perf_counter() - t0
        await session.close()
        assert step.status is Status.TASK_LIMIT_REACHED and step.reward == 0.0
        return elapsed

    assert anyio.run(timed, 1.0) >= 0.05
    assert anyio.run(timed, 0.0) < 0.05


def test_filler_text_wraps_to_the_exact_length() -> None:
    assert filler_text("abc", 7, 1) == "bc\nabc\n"
    assert filler_text("abc", 0, 0) == ""


def test_a_malformed_recording_fails_with_one_sentence(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"environments": {"db": {"tools": TOOLS_B, "episodes": [
        {**episode(2, 0.0, [1, 1]), "step_s": [0.1]}]}}}))
    with pytest.raises(ConfigError, match="one step latency and observation per turn"):
        ReplayEnvironment(ReplayConfig(workload=str(bad)))
    with pytest.raises(ConfigError, match="does not exist"):
        ReplayEnvironment(ReplayConfig(workload=str(tmp_path / "missing.json")))


def test_the_entry_point_is_discovered_by_a_fresh_process(tmp_path: Path, workload: Path) -> None:
    from throughput import make_replay_visible

    env = {**os.environ, "PYTHONPATH": make_replay_visible(tmp_path / "dist")}
    out = subprocess.run([sys.executable, "-m", "agentrl_core.cli.main", "plugins", "--json"], env=env,
                         capture_output=True, text=True, check=True).stdout
    record = next(p for p in json.loads(out) if p["name"] == "bench_replay")
    assert record["status"] == "ok" and record["provides"] == {"environment": ["replay"], "agent_loop": ["longtail"]}


def test_engine_breakdown_attributes_idle_time_by_state() -> None:
    def s(t: float, fwd: float, running: int, paused: bool = False, sessions: int = 4) -> dict:
        return {"t": t, "sessions": sessions, "e": {"forward_s": fwd, "running": running, "waiting": 0, "paused": paused}}

    samples = [s(0, 0.0, 2), s(1, 0.5, 0, sessions=3), s(2, 0.5, 0), s(3, 0.5, 1, paused=True), s(4, 0.5, 1)]
    phases = learner_phases([{"time": 4.0, "time/step_s": 4.0, "time/wait_rollout_s": 1.5, "time/train_s": 2.5}])
    out = engine_breakdown(samples, "e", 0.0, 4.0, phases)
    # [0,1]: 0.5 s forward + 0.5 s with requests present; [1,2]: no requests, midpoint 1.5 is where the
    # learner's train phase starts; [2,3] and [3,4]: paused at one end. Running at interval starts: 2, 0, 0, 1
    assert out["seconds"] == {"forward": 0.5, "requests_not_forwarding": 0.5, "paused_weight_sync": 2.0,
                              "no_requests/trajectories_in_env_or_agent_loop/learner_train": 1.0}
    samples[1]["sessions"] = 0
    assert "no_requests/no_trajectory/learner_train" in engine_breakdown(samples, "e", 0.0, 4.0, phases)["seconds"]
    assert out["span_s"] == 4.0 and out["mean_running_requests"] == 0.75


def test_engine_breakdown_counts_sampling_as_busy() -> None:
    """The hf engine times sampling apart from its forward passes: both are busy, the rest idle."""
    samples = [{"t": float(t), "sessions": 1, "e": {"forward_s": f, "sampling_s": m, "running": 1, "waiting": 0,
                                                     "paused": False}}
               for t, f, m in [(0, 0.0, 0.0), (1, 0.7, 0.2), (2, 1.5, 0.3)]]
    phases = learner_phases([{"time": 2.0, "time/step_s": 2.0, "time/wait_rollout_s": 2.0, "time/train_s": 0.0}])
    out = engine_breakdown(samples, "e", 0.0, 2.0, phases)
    # [0,1]: 0.7 forward + 0.2 sampling, 0.1 idle; [1,2]: 0.8 + 0.1, 0.1 idle
    assert out["seconds"] == {"forward": 1.5, "sampling": 0.3, "requests_not_forwarding": 0.2}
    assert out["busy_by_learner_phase"] == {"wait_rollout": {"span_s": 2.0, "busy": 0.9}}


def test_engine_breakdown_credits_a_pass_longer_than_the_polling_interval_backwards() -> None:
    """A 1.25 s prefill that ends between the samples at 1.25 and 1.5 s adds its seconds only
    then: the intervals it spanned are busy, not 'requests present but no forward'."""
    samples = [{"t": t, "sessions": 1, "e": {"forward_s": f, "running": 2, "waiting": 0, "paused": False}}
               for t, f in [(0.0, 0.0), (0.25, 0.0), (0.5, 0.0), (0.75, 0.0), (1.0, 0.0), (1.25, 0.0), (1.5, 1.35),
                            (1.75, 1.45)]]
    phases = learner_phases([{"time": 1.75, "time/step_s": 1.75, "time/wait_rollout_s": 1.75, "time/train_s": 0.0}])
    out = engine_breakdown(samples, "e", 0.0, 1.75, phases)
    # [1.25, 1.5]: 1.35 s counted, 0.25 of it there and 1.1 carried to [1.0, 1.25] ... [0.0, 0.25] (0.25,
    # 0.25, 0.25, 0.25, 0.1); [1.5, 1.75]: 0.1 busy, 0.15 idle. Busy 1.45, idle 0.3 (0.15 + 0.15)
    assert out["seconds"] == {"forward": 1.45, "requests_not_forwarding": 0.3}


def test_tree_cpu_seconds_counts_a_busy_child() -> None:
    burn = ("import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.5:\n    pass\n"
            "print('done', flush=True)\nsys.stdin.read()\n")
    child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "done"  # the child has used 0.5 s of CPU and is still alive
        own = tree_cpu_seconds(child.pid)
        assert own >= 0.45
        assert tree_cpu_seconds(os.getpid()) >= own
        assert tree_cpu_by_role(child.pid) == {"ray_and_other": own}  # a plain python -c is no run role
    finally:
        child.communicate("")


def test_engine_busy_share_by_learner_phase() -> None:
    samples = [{"t": float(t), "sessions": 1, "e": {"forward_s": f, "running": 1, "waiting": 0, "paused": False}}
               for t, f in [(0, 0.0), (1, 1.0), (2, 1.0), (3, 1.0), (4, 1.5)]]
    phases = learner_phases([{"time": 4.0, "time/step_s": 4.0, "time/wait_rollout_s": 1.0, "time/train_s": 3.0}])
    out = engine_breakdown(samples, "e", 0.0, 4.0, phases)["busy_by_learner_phase"]
    assert out == {"wait_rollout": {"span_s": 1.0, "busy": 1.0}, "train": {"span_s": 3.0, "busy": round(0.5 / 3, 4)}}


def test_monitor_reads_sglang_load_from_get_load():
    """SGLang's /get_server_info has no forward time or request counts (the strict double answers only
    0.5.4's fields): the monitor reads /get_load and sums the sampled time with a request running."""
    import asyncio
    import threading

    import httpx

    sys.path.insert(0, str(WORKLOADS.parents[1] / "tests" / "core"))
    from monitor import RunMonitor
    from sglang_double import FakeSGLang, parse_args

    from agentrl_core.http.server import bind_socket, serve_app

    server = FakeSGLang(parse_args(["--model-path", "none", "--api-key", "k"]))
    server.ready_at = 0.0
    sock = bind_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=lambda: loop.run_until_complete(serve_app(server.app, sock, stop=stop)))
    thread.start()
    monitor = RunMonitor(os.getpid(), interval=0.05, token="k")
    monitor.attach("http://127.0.0.1:1", {"current": [url]})
    try:
        with httpx.Client(headers={"Authorization": "Bearer k"}, timeout=30) as http:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if http.get(url + "/get_model_info").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline
                time.sleep(0.02)
            monitor.start()
            time.sleep(0.2)
            http.post(url + "/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 120}})
            time.sleep(0.2)
    finally:
        monitor.stop()
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=10)
    engine = [s["engine/current/0"] for s in monitor.samples if "engine/current/0" in s]
    assert engine and engine[0]["running"] == 0 and max(e["running"] for e in engine) == 1
    # 120 tokens at 5 ms: about 0.6 s running, measured in 0.05 s samples
    assert 0.3 < engine[-1]["forward_s"] < 1.5 and engine[-1]["running"] == 0
