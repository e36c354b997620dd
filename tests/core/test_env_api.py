"""The environment API: ToolSession bookkeeping, tool-call validation, threaded sessions."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

from agentrl_core.env import (
    Environment,
    SessionError,
    Status,
    Step,
    ThreadedSession,
    ToolSession,
    UnknownIndexError,
    assistant_tool_call,
    first_tool_call,
    function_tool,
    tool_result,
    tool_schema_errors,
)
from agentrl_core.env.tools import BadTurn, ToolCall

ECHO = function_tool("echo", "echo text", {"text": {"type": "string"}, "times": {"type": "integer"}}, ["text"])
DONE = function_tool("done", "finish", {"ok": {"type": "boolean"}}, ["ok"])


class EchoSession(ToolSession):
    def __init__(self, env, max_rounds=3):
        super().__init__([ECHO, DONE], max_rounds=max_rounds)
        self.env = env

    async def on_start(self):
        self.env.live += 1
        return Step([{"role": "user", "content": "say something"}])

    async def on_tool_call(self, call, message):
        if call.name == "done":
            return Step([tool_result(call, "bye")], status=Status.COMPLETED, reward=float(call.arguments["ok"]))
        return Step([tool_result(call, call.arguments["text"] * call.arguments.get("times", 1))])

    async def on_close(self):
        self.env.live -= 1


class EchoEnv(Environment):
    name = "echo"
    tools = [ECHO, DONE]

    def __init__(self):
        super().__init__()
        self.live = 0

    def index_sets(self):
        return {"std": [0, 1, 2], "named": ["a", "b"]}

    async def open(self, split, index):
        self.check_index(split, index)
        return EchoSession(self)


def run(coro_fn):
    return anyio.run(coro_fn)


def test_episode_runs_and_counts_rounds():
    async def main():
        env = EchoEnv()
        s = await env.open("std", 0)
        first = await s.start()
        assert first.status is Status.RUNNING and env.live == 1
        step = await s.step(assistant_tool_call("echo", {"text": "ab", "times": 2}))
        assert step.messages == [{"role": "tool", "tool_call_id": "call_0", "content": "abab"}]
        step = await s.step(assistant_tool_call("done", {"ok": True}))
        assert step.finish and step.reward == 1.0 and step.metrics == {"rounds": 2, "invalid_turns": 0}
        with pytest.raises(SessionError, match="already finished"):
            await s.step(assistant_tool_call("done", {"ok": True}))
        await s.close()
        await s.close()
        assert env.live == 0

    run(main)


def test_bad_turns_get_error_observations_and_round_limit_applies():
    async def main():
        env = EchoEnv()
        s = await env.open("std", 1)
        await s.start()
        step = await s.step({"role": "assistant", "content": "no tools here"})
        assert step.status is Status.RUNNING and step.messages[0]["role"] == "user"
        assert "no tool call" in step.messages[0]["content"]
        bad_json = {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                          "function": {"name": "echo", "arguments": "{oops"}}]}
        step = await s.step(bad_json)
        assert step.messages[0]["role"] == "tool" and "not valid JSON" in step.messages[0]["content"]
        step = await s.step(assistant_tool_call("echo", {"text": 3}))
        assert step.status is Status.TASK_LIMIT_REACHED
        assert step.metrics == {"rounds": 3, "invalid_turns": 3}
        await s.close()

    run(main)


def test_concurrent_step_is_refused():
    class Slow(EchoSession):
        async def on_tool_call(self, call, message):
            await anyio.sleep(0.2)
            return await super().on_tool_call(call, message)

    async def main():
        s = Slow(EchoEnv())
        await s.start()
        errors = []

        async def second():
            await anyio.sleep(0.05)
            try:
                await s.step(assistant_tool_call("echo", {"text": "x"}))
            except SessionError as exc:
                errors.append(str(exc))

        async with anyio.create_task_group() as tg:
            tg.start_soon(s.step, assistant_tool_call("echo", {"text": "x"}))
            tg.start_soon(second)
        assert errors == ["another call on this session is still running"]
        await s.close()

    run(main)


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (assistant_tool_call("nope", {}), "unknown tool 'nope'"),
        (assistant_tool_call("echo", {}), "missing required argument 'text'"),
        (assistant_tool_call("echo", {"text": "a", "extra": 1}), "unexpected argument 'extra'"),
        (assistant_tool_call("echo", {"text": "a", "times": "2"}), "times must be of type integer"),
        (assistant_tool_call("done", {"ok": 1}), "ok must be of type boolean"),
        ({"role": "user", "content": "hi"}, "expected an assistant message"),
    ],
)
def test_tool_call_validation(message, reason):
    parsed = first_tool_call(message, [ECHO, DONE])
    assert isinstance(parsed, BadTurn) and reason in parsed.reason


def test_only_first_tool_call_is_used():
    msg = assistant_tool_call("echo", {"text": "a"})
    msg["tool_calls"].append({"id": "c2", "type": "function", "function": {"name": "done", "arguments": "{}"}})
    parsed = first_tool_call(msg, [ECHO, DONE])
    assert isinstance(parsed, ToolCall) and parsed.name == "echo"


def test_tool_schema_errors():
    assert tool_schema_errors(ECHO) == []
    assert tool_schema_errors({"type": "function", "function": {"name": "bad name"}})
    bad_required = function_tool("x", "d", {"a": {"type": "string"}}, ["b"])
    assert "required parameter 'b' is not in properties" in tool_schema_errors(bad_required)[0]


def test_index_checks():
    env = EchoEnv()
    assert env.check_index("std", 2) == 2
    assert env.check_index("std", "1") == 1
    assert env.check_index("named", 1) == "b"  # int indices map onto string lists by position
    with pytest.raises(UnknownIndexError, match="no index set 'train'; available: named, std"):
        env.check_index("train", 0)
    with pytest.raises(UnknownIndexError, match="index 7 is not in echo/std"):
        env.check_index("std", 7)


def test_threaded_session_does_not_block_the_loop():
    class Blocking:
        def start(self):
            time.sleep(0.3)
            return Step([{"role": "user", "content": "hi"}])

        def step(self, message):
            raise AssertionError("not called")

        def close(self):
            self.closed_in = threading.current_thread().name

    async def main():
        b = Blocking()
        s = ThreadedSession(b)
        ticks = 0

        async def ticker():
            nonlocal ticks
            for _ in range(5):
                await anyio.sleep(0.03)
                ticks += 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            await s.start()
        assert ticks == 5  # the loop kept running while start() blocked a thread
        await s.close()
        assert b.closed_in != threading.main_thread().name

    run(main)


def test_threaded_session_timeout():
    class Hangs:
        def start(self):
            time.sleep(2)

        def close(self):
            pass

    async def main():
        s = ThreadedSession(Hangs(), timeout=0.2)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            await s.start()
        assert time.monotonic() - t0 < 1.0

    run(main)
