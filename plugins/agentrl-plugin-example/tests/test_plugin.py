"""The example plugin: discovery first, then the environment contract and the oracle."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import anyio
import pytest
from agentrl_plugin_example.env import CalcConfig, CalcEnvironment, make_problem

from agentrl_core.config import config_from_dict
from agentrl_core.env import assistant_tool_call, play_episode, read_demonstrations
from agentrl_core.errors import ConfigError
from agentrl_core.plugins import get_plugin_manager
from agentrl_core.registry import Registry
from agentrl_core.testing import check_environment


def test_entry_point_is_discovered_by_a_fresh_plugin_manager():
    pm = get_plugin_manager(environ={})
    assert pm.records["plugin_example"].status == "ok"
    assert pm.records["plugin_example"].distribution == "agentrl-plugin-example"
    spec = Registry(pm).get_environment("calc")
    assert spec.factory == "agentrl_plugin_example.env:CalcEnvironment"


def test_conformance():
    report = check_environment("calc", oracle_samples=5)
    assert not report.failures


def test_problems_are_deterministic_and_splits_differ():
    config = CalcConfig()
    assert make_problem("train", 7, config) == make_problem("train", 7, config)
    train = {make_problem("train", i, config).text for i in range(200)}
    test = {make_problem("test", i, config).text for i in range(200)}
    assert len(train) > 150 and train != test


def test_hand_checked_problem():
    problem = make_problem("train", 0, CalcConfig())
    # Recompute left to right from the recorded steps, independently of the env's code path.
    value = problem.start
    for op, b in problem.steps:
        value = {"+": value + b, "-": value - b, "*": value * b}[op]
    assert problem.answer == value
    assert problem.text.count("(") == len(problem.steps) - 1


def test_wrong_answer_scores_zero_and_varying_lengths():
    async def main():
        env = CalcEnvironment()
        session = await env.open("test", 0)
        await session.start()
        answer = env.problem("test", 0).answer
        step = await session.step(assistant_tool_call("submit_answer", {"answer": answer + 1}))
        assert step.finish and step.reward == 0.0 and step.status.value == "completed"
        await session.close()
        lengths = set()
        for i in range(30):
            ep = await play_episode(env, "train", i, env.oracle("train", i))
            assert ep.reward == 1.0
            lengths.add(sum(1 for m in ep.messages if m["role"] == "assistant"))
        assert len(lengths) >= 3  # 2..4 turns with the default max_ops=3

    anyio.run(main)


@pytest.mark.parametrize("error_rate", [0.0, 0.3])
def test_oracle_error_rate(error_rate):
    async def main():
        env = CalcEnvironment()
        rewards = [
            (await play_episode(env, "train", i, env.oracle("train", i, error_rate=error_rate, seed=i))).reward
            for i in range(60)
        ]
        return sum(rewards) / len(rewards)

    rate = anyio.run(main)
    if error_rate == 0:
        assert rate == 1.0
    else:
        assert 0.2 < rate < 0.8


def test_cli_lists_plugin_and_writes_demonstrations(tmp_path):
    env = {**os.environ, "AGENTRL_PLUGINS": ""}
    out = subprocess.run([sys.executable, "-m", "agentrl_core.cli.main", "plugins", "--json"],
                         capture_output=True, text=True, env=env, check=True)
    records = {r["name"]: r for r in json.loads(out.stdout)}
    assert records["plugin_example"]["provides"] == {"environment": ["calc"]}
    demos = tmp_path / "demos.jsonl"
    subprocess.run([sys.executable, "-m", "agentrl_core.cli.main", "demos", "--env", "calc", "--split", "train",
                    "--limit", "10", "--error-rate", "0.5", "--out", str(demos)], check=True, env=env)
    records = list(read_demonstrations(demos))
    assert len(records) == 10
    assert {r["status"] for r in records} == {"completed"}
    assert 0 < sum(r["reward"] for r in records) < 10
    assert records[0]["messages"][0]["role"] == "system"


def test_compact_prompt_keeps_the_contract_and_drops_descriptions():
    config = CalcConfig(compact_prompt=True)
    assert not check_environment("calc", config, oracle_samples=5).failures
    env = CalcEnvironment(config)
    assert [t["function"]["name"] for t in env.tools] == ["calculate", "submit_answer"]
    assert "description" not in json.dumps(env.tools)
    assert CalcEnvironment().tools[0]["function"]["description"]  # the default is unchanged

    async def main():
        session = await env.open("test", 0)
        first = await session.start()
        assert len(first.messages[0]["content"]) < 80
        # the tool schema still validates arguments: a string operand is a bad turn, not a crash
        step = await session.step(assistant_tool_call("calculate", {"a": "x", "op": "+", "b": 1}))
        assert step.status.value == "running" and "invalid" in step.messages[0]["content"].lower()
        await session.close()

    anyio.run(main)


def test_ops_option_restricts_operators_and_keeps_default_problems():
    default = [make_problem("train", i, CalcConfig()) for i in range(50)]
    assert default == [make_problem("train", i, CalcConfig(ops=["+", "-", "*"])) for i in range(50)]
    plus = [make_problem("train", i, CalcConfig(ops=["+"])) for i in range(50)]
    assert {op for p in plus for op, _ in p.steps} == {"+"}
    assert [(len(p.steps), p.start) for p in plus] == [(len(p.steps), p.start) for p in default]
    assert plus[3].answer == plus[3].start + sum(b for _, b in plus[3].steps)
    for bad in ([], ["/"], ["+", "+"]):
        with pytest.raises(ValueError, match="ops must be distinct operators"):
            CalcConfig(ops=bad)
    with pytest.raises(ConfigError, match=r"environments\.calc\.ops: ops must be distinct operators"):
        config_from_dict({"environments": {"calc": {"ops": ["%"]}}})
