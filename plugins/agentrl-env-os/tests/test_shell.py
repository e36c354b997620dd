"""The agent's shell in a real container: state across turns, timeouts, infrastructure failures."""

from __future__ import annotations

import time

import anyio
import attrs
import pytest
from agentrl_env_os.env import InitScriptFailed, OSSession
from agentrl_env_os.tasks import Script, load_split

from agentrl_core.env import assistant_tool_call
from agentrl_core.types import Status

pytestmark = pytest.mark.docker

PLAIN = 12  # std 12 ("how many groups"): default image, no init or start script


async def bash(session, script: str) -> str:
    step = await session.step(assistant_tool_call("bash_action", {"script": script}))
    assert step.status is Status.RUNNING, step
    return step.messages[0]["content"]


def test_cd_variables_and_su_persist_across_turns(make_env):
    env = make_env(round_limit=30)

    async def main():
        session = await env.open("std", PLAIN)
        try:
            first = await session.start()
            assert first.messages[0]["role"] == "system" and "Now, I will start a new problem" in first.messages[1]["content"]
            assert await bash(session, "cd /tmp && X=41") == "The output of the OS is empty."
            assert await bash(session, "echo $((X + 1)) $(pwd)") == "The output of the OS:\n\n42 /tmp\n"
            assert await bash(session, "for i in 1 2; do\n\techo n$i\ndone") == "The output of the OS:\n\nn1\nn2\n"
            assert await bash(session, "printf '\\033[31mred\\033[0m'; false") == "The output of the OS:\n\nred"
            assert await bash(session, "useradd -m -s /bin/bash jack && su - jack") == "The output of the OS is empty."
            assert await bash(session, "whoami; pwd") == "The output of the OS:\n\njack\n/home/jack\n"
            assert "logout" in await bash(session, "exit")
            assert await bash(session, "whoami; echo $X") == "The output of the OS:\n\nroot\n41\n"
            exited = await bash(session, "exit")
            assert "[The shell exited; a new shell was started" in exited
            assert await bash(session, "pwd; echo x${X}x") == "The output of the OS:\n\n/root\nxx\n"
            assert session.metrics()["shell_restarts"] == 1
        finally:
            await session.close()

    anyio.run(main)


def test_a_command_past_the_time_limit_is_reported_and_the_episode_continues(make_env):
    env = make_env(round_limit=30, command_timeout_s=2, interrupt_grace_s=3)

    async def main():
        session = await env.open("std", PLAIN)
        try:
            await session.start()
            t0 = time.monotonic()
            out = await bash(session, "echo started; sleep 30")
            assert out == (
                "The output of the OS:\n\nstarted\n"
                "[The command did not finish within 2 seconds and was interrupted with Ctrl-C.]"
            )
            assert time.monotonic() - t0 < 2 + 3 + 3
            assert await bash(session, "echo ok") == "The output of the OS:\n\nok\n"
            # A program reading the terminal swallows typed lines; Ctrl-C still gets the shell back.
            assert "interrupted with Ctrl-C" in await bash(session, "cat")
            # A program that ignores SIGINT is killed.
            ignoring = "python3 -c 'import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)'"
            assert "and was killed." in await bash(session, ignoring)
            assert await bash(session, "echo still here") == "The output of the OS:\n\nstill here\n"
            step = await session.step(assistant_tool_call("bash_action", {"script": "echo done"}))
            assert step.metrics["command_timeouts"] == 3 and step.metrics["commands"] == 6
        finally:
            await session.close()

    anyio.run(main)


def test_round_limit_and_bad_turns(make_env):
    env = make_env(round_limit=3, tool_arguments="strict")

    async def main():
        session = await env.open("std", PLAIN)
        try:
            await session.start()
            step = await session.step({"role": "assistant", "content": "I think the answer is 3."})
            assert step.messages == [{"role": "user", "content": "No executable tool calls found. Please call a tool instead"}]
            step = await session.step(assistant_tool_call("answer_action", {"reply": "3"}))
            assert step.messages[0]["role"] == "tool" and "missing required argument 'answer'" in step.messages[0]["content"]
            step = await session.step(assistant_tool_call("bash_action", {"script": "true"}))
            assert step.status is Status.TASK_LIMIT_REACHED and step.metrics["invalid_turns"] == 2
        finally:
            await session.close()

    anyio.run(main)


def test_wrong_answer_scores_zero_and_finish_uses_the_thought(make_env):
    env = make_env()

    async def main():
        session = await env.open("std", 31)  # match "no"
        try:
            await session.start()
            step = await session.step(assistant_tool_call("finish_action", {"thought": "no"}))
            assert step.status is Status.COMPLETED and step.reward == 1.0 and step.messages == []
        finally:
            await session.close()
        session = await env.open("std", PLAIN)
        try:
            await session.start()
            step = await session.step(assistant_tool_call("answer_action", {"answer": "12345"}))
            assert step.status is Status.COMPLETED and step.reward == 0.0
            assert step.metrics["verdict"] == "check step 1 exited 1"
        finally:
            await session.close()

    anyio.run(main)


def test_a_failing_init_script_is_an_infrastructure_failure(make_env):
    env = make_env()
    task = attrs.evolve(load_split("std")[PLAIN], init=(Script("bash", "echo broken >&2; exit 3"),))

    async def main():
        session = OSSession(env, task)
        try:
            with pytest.raises(InitScriptFailed, match="init script 0 exited with 3: broken"):
                await session.start()
            container_id = session.container_id
        finally:
            await session.close()
        assert env.resource_count() == 0
        assert env.backend.api.containers(all=True, filters={"id": container_id}) == []

    anyio.run(main)
