"""Containers never outlive their episode: cancels at random points, and a worker killed with SIGKILL."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap

import anyio
import pytest

from agentrl_core.env import assistant_tool_call
from agentrl_env_os.docker_backend import LABEL_WORKER

pytestmark = pytest.mark.docker


def _containers_of(env, worker: str) -> list:
    return env.backend.api.containers(all=True, filters={"label": [f"{LABEL_WORKER}={worker}"]})


def test_cancelled_episodes_leave_no_container(make_env):
    env = make_env(command_timeout_s=5)
    rng = random.Random(7)
    deadlines = [rng.uniform(0.0, 2.5) for _ in range(16)]
    outcomes: list[str] = []

    async def episode(i: int, limiter: anyio.CapacityLimiter) -> None:
        async with limiter:
            session = None
            with anyio.move_on_after(deadlines[i]) as scope:
                session = await env.open("std", 56 if i % 2 else 12)  # std 56 starts background jobs
                await session.start()
                await session.step(assistant_tool_call("bash_action", {"script": "sleep 3; echo done"}))
            outcomes.append("cancelled" if scope.cancelled_caught else "finished")
            if session is not None:
                await session.close()

    async def main():
        limiter = anyio.CapacityLimiter(6)
        async with anyio.create_task_group() as tg:
            for i in range(len(deadlines)):
                tg.start_soon(episode, i, limiter)

    anyio.run(main)
    assert outcomes.count("cancelled") >= 8  # the cancels hit start and the running command
    assert env.resource_count() == 0
    assert _containers_of(env, env.backend.worker.id) == []


WORKER = textwrap.dedent(
    """
    import anyio
    from agentrl_env_os.env import OSEnvironment

    async def main():
        env = OSEnvironment()
        for index in (12, 13):
            session = await env.open("std", index)
            await session.start()
        print(env.backend.worker.id, flush=True)
        await anyio.sleep(3600)

    anyio.run(main)
    """
)


def test_containers_of_a_killed_worker_are_swept(make_env):
    env = make_env()
    proc = subprocess.Popen([sys.executable, "-c", WORKER], stdout=subprocess.PIPE, text=True)
    try:
        worker = proc.stdout.readline().strip()
        assert worker, "the worker process did not start its sessions"
        assert len(_containers_of(env, worker)) == 2
        assert env.backend.sweep() == 0  # its owner is alive: not ours to remove
        assert len(_containers_of(env, worker)) == 2
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert len(_containers_of(env, worker)) == 2  # nobody closed them
    assert env.backend.sweep() == 2
    assert _containers_of(env, worker) == []
