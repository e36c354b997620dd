"""Containers never outlive their episode: cancels at random points, and a worker killed with SIGKILL."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap

import anyio
import pytest
from agentrl_env_os.docker_backend import LABEL_WORKER

from agentrl_core.env import assistant_tool_call

pytestmark = pytest.mark.docker


def _containers_of(env, worker: str) -> list:
    """The worker's containers, except the started, unused ones of ``env``'s warm pool."""
    env.pool.wait()  # refills started by the last sessions
    found = env.backend.api.containers(all=True, filters={"label": [f"{LABEL_WORKER}={worker}"]})
    idle = env.pool.idle_ids()
    return [c for c in found if c["Id"] not in idle]


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
    from agentrl_env_os.config import OSConfig
    from agentrl_env_os.env import OSEnvironment

    async def main():
        env = OSEnvironment(OSConfig(warm_pool=0))
        for index in (12, 13):
            session = await env.open("std", index)
            await session.start()
        print(env.backend.worker.id, flush=True)
        await anyio.sleep(3600)

    anyio.run(main)
    """
)


def test_containers_of_a_killed_worker_are_swept(make_env):
    env = make_env(warm_pool=0)
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


def test_warm_pool_serves_started_containers_and_is_removed_at_close(make_env):
    env = make_env(warm_pool=2)

    async def episode() -> dict:
        session = await env.open("std", 12)
        try:
            step = await session.start()
            return step.metrics
        finally:
            await session.close()

    async def main():
        first = await episode()  # the pool was empty: this one created its own container
        await anyio.to_thread.run_sync(env.pool.wait)
        assert len(env.pool.idle_ids()) == 2
        second = await episode()
        return first, second

    first, second = anyio.run(main)
    assert first["warm_container"] is False and second["warm_container"] is True
    idle = env.pool.idle_ids()
    anyio.run(env.aclose)
    assert env.pool.idle_ids() == set()
    for container_id in idle:
        assert env.backend.api.containers(all=True, filters={"id": container_id}) == []
