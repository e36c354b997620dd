"""Game worker processes: hung and crashed games are stopped, processes are reused and
replaced, the event loop keeps running, capacity is respected."""

from __future__ import annotations

import os
import signal
import time

import anyio
import anyio.lowlevel
import pytest
from agentrl_env_alfworld.pool import GameError, GameProcessError

from agentrl_core.env import Status, assistant_tool_call, play_episode

pytestmark = pytest.mark.processes


def act(action: str) -> dict:
    return assistant_tool_call("take_action", {"action": action})


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_hung_game_is_stopped_and_the_next_episode_runs(make_env):
    env = make_env(concurrency=2, step_timeout=10.0)

    async def main():
        session = await env.open("std", 0)
        await session.start()
        pid = session.proc.pid
        os.kill(pid, signal.SIGSTOP)  # the game process stops answering, as a hung engine would
        began = time.monotonic()
        with pytest.raises(GameProcessError, match="did not answer 'step' in time; it is stopped"):
            await session.step(act("go to desk 2"))
        waited = time.monotonic() - began
        await session.close()
        assert gone(pid)
        assert env.resource_count() == 0 and env.pool.processes == []
        episode = await play_episode(env, "std", 0, env.oracle("std", 0))
        return waited, episode

    waited, episode = anyio.run(main)
    assert 10.0 <= waited < 60
    assert episode.status is Status.COMPLETED


def test_reset_timeout(make_env):
    env = make_env(concurrency=1, reset_timeout=0.05)  # loading a game takes longer than that

    async def main():
        session = await env.open("std", 0)
        with pytest.raises(GameProcessError, match="did not answer 'reset' in time"):
            await session.start()
        pid = session.proc.pid
        await session.close()
        return pid

    assert gone(anyio.run(main))
    assert env.resource_count() == 0


def test_a_crashed_game_process_is_a_task_error_not_a_hang(make_env):
    env = make_env(concurrency=1)

    async def main():
        session = await env.open("std", 0)
        await session.start()
        os.kill(session.proc.pid, signal.SIGKILL)
        with pytest.raises(GameProcessError, match="exited during 'step'"):
            await session.step(act("go to desk 2"))
        await session.close()
        # an idle process that died is noticed at the next lease
        first = await play_episode(env, "std", 0, env.oracle("std", 0))
        os.kill(env.pool.processes[0].pid, signal.SIGKILL)
        second = await play_episode(env, "std", 0, env.oracle("std", 0))
        return first, second

    first, second = anyio.run(main)
    assert first.status is Status.COMPLETED and second.status is Status.COMPLETED
    assert env.pool.started == 3


def test_processes_are_reused_then_replaced(make_env):
    env = make_env(concurrency=1, max_episodes_per_process=2)

    async def main():
        pids = []
        for index in env.index_sets()["dev"][:5]:
            episode = await play_episode(env, "dev", index, env.oracle("dev", index))
            assert episode.reward == 1.0
            pids.append(env.pool.processes[0].pid if env.pool.processes else None)
        return pids

    pids = anyio.run(main)
    # episodes 1-2 on the first process (retired after its 2nd), 3-4 on the second, 5 on a third
    assert pids[1] is None and pids[3] is None
    assert len({pids[0], pids[2], pids[4]}) == 3
    assert env.pool.started == 3


def test_the_event_loop_keeps_running_during_reset_and_step(make_env):
    env = make_env(concurrency=1)
    gaps: list[float] = []

    async def ticker(stop: anyio.Event):
        last = time.monotonic()
        while not stop.is_set():
            await anyio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    async def main():
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker, stop)
            began = time.monotonic()
            session = await env.open("std", 0)
            await session.start()  # spawns a process and loads a game: seconds of work
            for action in ["go to desk 2", "take pencil 2 from desk 2"]:
                await session.step(act(action))
            await session.close()
            busy = time.monotonic() - began
            stop.set()
        return busy

    busy = anyio.run(main)
    assert busy > 0.3
    assert max(gaps) < busy / 4, (max(gaps), busy)


def test_capacity_waits_for_a_free_process(make_env):
    env = make_env(concurrency=2)

    async def main():
        first, second, third = [await env.open("std", 0) for _ in range(3)]
        await first.start()
        await second.start()
        started = anyio.Event()

        async def start_third():
            await third.start()
            started.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(start_third)
            with anyio.fail_after(60):
                while not env.pool._waiters:  # the third session queues for a process
                    await anyio.lowlevel.checkpoint()
            assert env.pool.leased == 2 and not started.is_set()
            await first.close()
            with anyio.fail_after(60):
                await started.wait()
        assert env.pool.leased == 2
        await second.close()
        await third.close()

    anyio.run(main)
    assert env.pool.started == 2 and env.resource_count() == 0


def test_cancelled_step_stops_the_process(make_env):
    env = make_env(concurrency=1)

    async def main():
        session = await env.open("std", 0)
        await session.start()
        proc = session.proc
        with anyio.move_on_after(0.001) as scope:
            await session.step(act("go to desk 2"))
        await session.close()
        return scope.cancelled_caught, proc

    cancelled, proc = anyio.run(main)
    assert cancelled
    assert not proc.alive and gone(proc.pid)
    assert env.resource_count() == 0


def test_engine_error_keeps_the_process(make_env, tmp_path):
    env = make_env(concurrency=1)
    bad = tmp_path / "game.tw-pddl"
    bad.write_text("{not json")
    good = env.library.game_file(env.game("std", 0))

    async def main():
        proc = await env.pool.acquire()
        try:
            with pytest.raises(GameError, match="cannot read game file"):
                await env.pool.call(proc, {"op": "reset", "game": str(bad), "logic": env.logic}, 60)
            reply = await env.pool.call(proc, {"op": "reset", "game": str(good), "logic": env.logic}, 60)
            memory = await env.pool.call(proc, {"op": "memory"}, 10)
        finally:
            await env.pool.release(proc)
        return proc, reply, memory

    proc, reply, memory = anyio.run(main)
    assert proc.alive and env.pool.processes == [proc]
    assert reply["observation"].startswith("-= Welcome to TextWorld, ALFRED! =-") and not reply["won"]
    assert memory["rss_kb"] > 10_000
    anyio.run(env.aclose)
    assert not proc.alive and gone(proc.pid)
