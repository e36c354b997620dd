"""The stall report: a step that waits long for rollouts says what the episodes in flight are doing.

The episodes are played by the real ``chat`` loop and rollout manager against a real
environment (``SumEnv`` of test_agent_loop.py, run in process by ``LocalEnvClient``) that
hangs in a tool call or whose engine (a labelled test double) never answers.
"""

from __future__ import annotations

import logging
import re
import time

import anyio
import pytest
from test_agent_loop import ScriptedPool, SumEnv, SumSession, canonical_call, encode_reply

from agentrl_core.config import config_from_dict
from agentrl_core.rollout.activity import Activity, EpisodeActivity, current_episode, note_phase
from agentrl_core.rollout.agent_loop import ChatAgentLoop, LoopSettings
from agentrl_core.rollout.sampler import CurrentSampler
from agentrl_core.testing.local_env import LocalEnvClient
from agentrl_core.train.buffer import GroupBuffer
from agentrl_core.train.rollout_manager import RolloutManager
from agentrl_core.train.task_stream import StreamTask, TaskStream

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def test_describe_groups_by_task_and_phase_longest_wait_first():
    activity = Activity()
    now = 1000.0
    for uid, task, phase, turn, since in [
        ("a/0", "db-dev", "generating", 0, 990.0),          # 10 s
        ("a/1", "db-dev", "generating", 0, 950.0),          # 50 s
        ("a/2", "db-dev", "in the environment", 1, 995.0),  # 5 s
        ("b/0", "os-dev", "starting a session", None, 700.0),  # 300 s: os-dev first
    ]:
        activity.episodes[uid] = EpisodeActivity(uid, task, started=since, phase=phase, turn=turn, since=since)
    assert activity.describe(now) == (
        "os-dev 1: 1 starting a session (for up to 300 s); "
        "db-dev 3: 2 generating (turn 1, for up to 50 s), 1 in the environment (turn 2, for up to 5 s)")
    assert Activity().describe(now) == ""


async def test_each_task_marks_its_own_episode_and_outside_one_nothing_happens():
    note_phase("generating", 3)  # no episode: nothing to mark, no error
    assert current_episode() is None
    activity = Activity()
    seen = {}

    async def play(uid, phase):
        with activity.episode(uid, "t") as record:
            await anyio.sleep(0.01)
            note_phase(phase, 1)
            await anyio.sleep(0.01)
            seen[uid] = (record.phase, record.turn, current_episode() is record)

    async with anyio.create_task_group() as tg:
        tg.start_soon(play, "x/0", "generating")
        tg.start_soon(play, "x/1", "in the environment")
    assert seen == {"x/0": ("generating", 1, True), "x/1": ("in the environment", 1, True)}
    assert activity.episodes == {} and current_episode() is None


def manager_for(loop, n_samples=2):
    stream = TaskStream([StreamTask("sum-test", "sum", "test", (0,))], n_samples=n_samples, seed=0)
    buffer = GroupBuffer(n_samples, 64)
    return RolloutManager(agent_loop=loop, buffer=buffer, stream=stream, concurrency=8, batch_groups=1), buffer


def chat_loop(tokenizer, parser, pool, env):
    return ChatAgentLoop(tokenizer=tokenizer, env_client=LocalEnvClient({"sum-test": (env, "test")}),
                         pools={"current": pool}, sampler=CurrentSampler(), tool_parser=parser,
                         settings=LoopSettings(max_turns=3))


async def test_episodes_hanging_in_the_environment_are_reported_with_their_turn(tokenizer, parser):
    released = anyio.Event()

    class Stuck(SumSession):
        async def on_tool_call(self, call, message):
            await released.wait()  # the tool never answers until the test lets it
            return await super().on_tool_call(call, message)

    class StuckEnv(SumEnv):
        async def open(self, split, index):
            return Stuck(self.tools, max_rounds=self.max_rounds)

    answer = encode_reply(tokenizer, canonical_call("answer", {"value": 5}))
    pool = ScriptedPool([(answer, "stop", 0)] * 2)
    manager, buffer = manager_for(chat_loop(tokenizer, parser, pool, StuckEnv()))
    async with anyio.create_task_group() as tg:
        tg.start_soon(manager.run_groups, 1)
        with anyio.fail_after(10):
            while sum(e.phase == "in the environment" for e in manager.activity.episodes.values()) < 2:
                await anyio.sleep(0.01)
        await anyio.sleep(0.05)
        text = manager.activity.describe()
        assert text.startswith("sum-test 2: 2 in the environment (turn 1, for up to ") and text.endswith(" s)")
        released.set()
    assert manager.activity.episodes == {} and buffer.ready_groups == 1


async def test_the_trainer_reports_a_long_wait_then_again_and_stops_when_the_step_comes(tokenizer, parser, caplog):
    from agentrl_core.jobs.training import Trainer

    class Silent(ScriptedPool):
        async def generate(self, key, input_ids, params):
            await anyio.sleep_forever()  # an engine that accepted the request and never answers

    manager, buffer = manager_for(chat_loop(tokenizer, parser, Silent([]), SumEnv()))
    config = config_from_dict({"model": {"path": "/m"}, "tasks": [{"env": "calc"}], "train": {"total_steps": 5}},
                              validate_plugins=False)
    trainer = Trainer(config)
    trainer.manager, trainer.buffer = manager, buffer
    caplog.set_level(logging.WARNING, logger="agentrl_core.jobs.training")
    async with anyio.create_task_group() as tg:
        tg.start_soon(trainer._report_stalls, 0.4)
        tg.start_soon(manager.run_groups, 1)
        trainer._waiting = (time.monotonic(), 1)
        await anyio.sleep(1.0)  # reports at 0.4 s and 0.8 s
        trainer._waiting = None  # the step came: no more reports
        await anyio.sleep(0.6)
        tg.cancel_scope.cancel()
    reports = [r.getMessage() for r in caplog.records if "for rollouts" in r.getMessage()]
    assert len(reports) == 2, reports
    for report, waited in zip(reports, (0.4, 0.8), strict=True):
        first, last = report.split("\n  ")
        match = re.fullmatch(r"step 1 of 5 has waited (\d+) s for rollouts: 0 of 1 groups ready, 2 episodes in "
                             r"flight: sum-test 2: 2 generating \(turn 1, for up to (\d+) s\)", first)
        assert match, first
        assert abs(int(match[1]) - waited) <= 0.6 and int(match[2]) <= int(match[1])
        assert last == "the workers' and engines' own logs say more (engines: <run dir>/logs/)"
