"""Agent programs through the gateway: the agent loop of ``agentrl train`` with ``agent: ...``.

A real gateway on a real hf engine (tiny model); the environment is an in-process test
environment behind :class:`LocalEnvClient` (the control plane's interface). The programs are
real ``openai`` SDK code, including ``examples/gateway/openai_agent.py`` itself.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import openai
import pytest

from agentrl_core.config import config_from_dict
from agentrl_core.engine.process import BackgroundEngine
from agentrl_core.engine.server import EngineServer
from agentrl_core.env import Environment, Status, Step, ToolSession, function_tool, tool_result
from agentrl_core.errors import ConfigError
from agentrl_core.gateway.client import GatewayClient
from agentrl_core.gateway.loop import GatewayAgentLoop, load_program
from agentrl_core.gateway.process import BackgroundGateway, build_gateway
from agentrl_core.registry import Registry
from agentrl_core.rollout.agent_loop import RolloutRequest
from agentrl_core.testing.local_env import LocalEnvClient
from agentrl_core.train.advantages import compute_advantages, grpo_advantages
from agentrl_core.train.batching import train_samples

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
ADD = function_tool("add", "add two numbers", {"a": {"type": "integer"}, "b": {"type": "integer"}}, ["a", "b"])


@pytest.fixture
def anyio_backend():
    return "asyncio"


class CountSession(ToolSession):
    async def on_start(self):
        return Step([{"role": "system", "content": "Add numbers with the tool."},
                     {"role": "user", "content": "What is 2 + 3?"}])

    async def on_tool_call(self, call, message):
        return Step([tool_result(call, "5")], status=Status.COMPLETED, reward=1.0)


class CountEnv(Environment):
    name = "count"
    tools = [ADD]

    def __init__(self):
        super().__init__()
        self.opened = 0
        self.closed = 0

    def index_sets(self):
        return {"test": [0, 1]}

    async def open(self, split, index):
        env = self
        env.opened += 1

        class Tracked(CountSession):
            async def on_close(self):
                env.closed += 1

        return Tracked(self.tools, max_rounds=3)


@pytest.fixture(scope="module")
def gateway(tiny_model_dir):
    config = config_from_dict({"model": {"path": str(tiny_model_dir)},
                               "rollout": {"max_new_tokens": 8, "max_total_len": 1024, "temperature": 1.0}})
    with BackgroundEngine(EngineServer(tiny_model_dir, max_running_requests=16, dtype="float32")) as engine, \
            BackgroundGateway(build_gateway(config, {"current": [engine.url]})) as background:
        yield background


def request(sample=0):
    return RolloutRequest(task="count-test", index=0, group_id="g0", uid=f"g0/{sample}", sample=sample,
                          split="test", env="count")


async def play(gateway, program, env=None, **options):
    env = env or CountEnv()
    async with GatewayClient(gateway.url) as client:
        loop = GatewayAgentLoop(program=program, gateway=client, env_client=LocalEnvClient({"count-test": (env, "test")}),
                                **options)
        trajectory = await loop.run(request())
    return trajectory, env


async def test_the_plain_openai_example_trains_unchanged(gateway):
    program = load_program(str(ROOT / "examples/gateway/openai_agent.py") + ":run", registry=Registry())
    trajectory, env = await play(gateway, program)
    # the tiny model rarely writes a valid call: the environment ends the episode at its round limit
    assert trajectory.status in (Status.TASK_LIMIT_REACHED, Status.COMPLETED)
    assert trajectory.failure.value in ("agent", "none") and trajectory.training_reward is not None
    assert trajectory.num_turns == trajectory.metrics["env_steps"] >= 1
    assert trajectory.num_action_tokens == sum(t.num_tokens for t in trajectory.turns)
    assert env.opened == env.closed == 1
    adv = compute_advantages([trajectory], grpo_advantages)
    samples = train_samples([trajectory], adv.advantages)
    assert len(samples) == len(trajectory.sequences()) and all(s.loss_mask[0] == 0 for s in samples)


async def test_the_outcome_posted_then_returned_then_the_environments(gateway):
    async def posts(task, base_url):
        async with openai.AsyncOpenAI(base_url=base_url, api_key=task.api_key, max_retries=0) as client:
            await client.chat.completions.create(model=task.model, messages=task.messages, max_tokens=2)
        await task.report(0.25, metrics={"judge": 3})
        return 0.9  # a posted reward wins over a returned one

    trajectory, _ = await play(gateway, posts)
    assert (trajectory.status, trajectory.reward, trajectory.metrics["judge"]) == (Status.COMPLETED, 0.25, 3)

    def returns(task, base_url):  # a plain function: run in a thread, as a sync agent framework would be
        client = openai.OpenAI(base_url=base_url, api_key=task.api_key, max_retries=0)
        client.chat.completions.create(model=task.model, messages=task.messages, max_tokens=2)
        return 0.5

    trajectory, _ = await play(gateway, returns)
    assert (trajectory.status, trajectory.reward, trajectory.training_reward) == (Status.COMPLETED, 0.5, 0.5)

    async def solves(task, base_url):
        async with openai.AsyncOpenAI(base_url=base_url, api_key=task.api_key, max_retries=0) as client:
            reply = await client.chat.completions.create(model=task.model, messages=task.messages, tools=task.tools,
                                                         max_tokens=2)
        call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
        observation = await task.env.step({"role": "assistant", "content": reply.choices[0].message.content,
                                           "tool_calls": [call]})
        assert observation.finished and task.env.finished
        return None

    trajectory, env = await play(gateway, solves)
    assert (trajectory.status, trajectory.reward) == (Status.COMPLETED, 1.0) and env.closed == 1


async def test_running_out_of_context_is_an_agent_failure(gateway):
    async def rambles(task, base_url):
        async with openai.AsyncOpenAI(base_url=base_url, api_key=task.api_key, max_retries=0) as client:
            await client.chat.completions.create(model=task.model, messages=task.messages, max_tokens=2)
            long = [*task.messages, {"role": "user", "content": "go on " * 2000}]
            await client.chat.completions.create(model=task.model, messages=long)  # 400: the SDK raises

    trajectory, env = await play(gateway, rambles)
    assert trajectory.status is Status.AGENT_CONTEXT_LIMIT and trajectory.training_reward == -0.2
    assert "BadRequestError" in trajectory.metrics["agent_error"] and trajectory.num_action_tokens > 0
    assert env.closed == 1


async def test_episodes_without_a_scorable_outcome_are_infrastructure_failures(gateway):
    async def crashes(task, base_url):
        async with openai.AsyncOpenAI(base_url=base_url, api_key=task.api_key, max_retries=0) as client:
            await client.chat.completions.create(model=task.model, messages=task.messages, max_tokens=2)
        raise RuntimeError("the agent's own bug")

    async def never_calls(task, base_url):
        return 1.0  # a reward, but nothing was generated through the gateway: nothing to train on

    async def forgets_the_reward(task, base_url):
        async with openai.AsyncOpenAI(base_url=base_url, api_key=task.api_key, max_retries=0) as client:
            await client.chat.completions.create(model=task.model, messages=task.messages, max_tokens=2)

    async def hangs(task, base_url):
        await anyio.sleep(60)

    cases = [(crashes, {}, "the agent's own bug"), (never_calls, {}, "no model call"),
             (forgets_the_reward, {}, "without a reward"), (hangs, {"timeout": 0.5}, "did not finish within")]
    for program, options, reason in cases:
        trajectory, env = await play(gateway, program, **options)
        assert trajectory.failure.value == "infra" and trajectory.training_reward is None, program.__name__
        assert reason in trajectory.metrics["infra_error"], (program.__name__, trajectory.metrics)
        assert env.opened == env.closed == 1  # the environment session is ended on every path


def test_programs_load_from_files_modules_and_say_what_is_wrong(tmp_path):
    registry = Registry()
    agent = tmp_path / "my_agent.py"
    agent.write_text("async def run(task, base_url):\n    return 1.0\n")
    assert load_program(f"{agent}:run", registry=registry).__name__ == "run"
    assert load_program("json:dumps", registry=registry).__name__ == "dumps"
    with pytest.raises(ConfigError, match="is not a file"):
        load_program("nowhere/agent.py:run", registry=registry)
    with pytest.raises(ConfigError, match="cannot be loaded: AttributeError"):
        load_program(f"{agent}:missing", registry=registry)
    with pytest.raises(Exception, match="unknown agent program 'nope'"):
        load_program("nope", registry=registry)


def test_config_names_the_key_of_a_wrong_gateway_or_agent_setting():
    with pytest.raises(ConfigError, match="gateway.chat_template: unknown chat template 'qwen4'"):
        config_from_dict({"gateway": {"chat_template": "qwen4"}})
    with pytest.raises(ConfigError, match="gateway.reasoning_parser: unknown reasoning parser 'thinks'; did you mean"):
        config_from_dict({"gateway": {"reasoning_parser": "thinks"}})
    with pytest.raises(ConfigError, match="options are for a registered agent program"):
        config_from_dict({"agent": {"name": "my_agent.py:run", "my_agent": {"turns": 3}}})
    config = config_from_dict({"agent": "my_agent.py:run", "gateway": {"on_weight_update": "reject"}})
    assert config.agent.is_reference and config.gateway.on_weight_update == "reject"


async def test_the_stall_report_sees_the_program_and_each_environment_step(gateway):
    from agentrl_core.gateway.loop import RUNNING_PROGRAM
    from agentrl_core.rollout.activity import Activity

    activity, seen = Activity(), []

    def phase():
        (episode,) = activity.episodes.values()
        return episode.phase, episode.turn

    class Watched(CountEnv):
        async def open(self, split, index):
            session = await super().open(split, index)
            answer = session.on_tool_call

            async def on_tool_call(call, message):
                seen.append(phase())  # while the environment acts
                return await answer(call, message)

            session.on_tool_call = on_tool_call
            return session

    async def steps(task, base_url):
        async with openai.AsyncOpenAI(base_url=base_url, api_key=task.api_key, max_retries=0) as client:
            await client.chat.completions.create(model=task.model, messages=task.messages, max_tokens=2)
        seen.append(phase())
        call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
        await task.env.step({"role": "assistant", "content": "", "tool_calls": [call]})
        seen.append(phase())

    with activity.episode("g0/0", "count-test"):
        trajectory, _ = await play(gateway, steps, env=Watched())
    assert trajectory.status is Status.COMPLETED
    assert seen == [(RUNNING_PROGRAM, 0), ("in the environment", 0), (RUNNING_PROGRAM, 1)]
