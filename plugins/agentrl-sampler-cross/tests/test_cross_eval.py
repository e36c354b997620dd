"""Evaluation across models (the paper's Fig. 8a) with two scripted policies of complementary skills.

The task is a three-code lock: each turn the agent enters one code; a wrong code jams the
lock (reward 0), three right codes open it (reward 1). Policy A knows the first two codes
and almost never the third; policy B the reverse. The policies are labelled test doubles
of engine pools (scripted token ids); the environment, the agent loop, the cross sampler
and the evaluation statistics are the real ones.
"""

from __future__ import annotations

import json
import random

import anyio
import attrs
import pytest

from agentrl_core.config import Config, EvalConfig, RolloutConfig, TaskConfig
from agentrl_core.env import Environment, Status, Step, ToolSession, function_tool, tool_result
from agentrl_core.eval.metrics import EpisodeResult, pass_at_k, summarize
from agentrl_core.eval.runner import build_requests, make_token_players, run_requests
from agentrl_core.registry import Registry
from agentrl_core.testing.local_env import LocalEnvClient

PRESS = function_tool("press", "enter one code", {"code": {"type": "integer"}}, ["code"])


def codes(index):
    rng = random.Random(f"lock/{index}")
    return [rng.randrange(10, 99) for _ in range(3)]


class LockSession(ToolSession):
    def __init__(self, index):
        super().__init__([PRESS], max_rounds=3)
        self.codes = codes(index)
        self.entered = 0

    async def on_start(self):
        return Step([{"role": "system", "content": "Open the lock."},
                     {"role": "user", "content": "Enter the three codes, one per turn."}])

    async def on_tool_call(self, call, message):
        if call.arguments["code"] != self.codes[self.entered]:
            return Step([tool_result(call, "Jammed.")], status=Status.COMPLETED, reward=0.0)
        self.entered += 1
        if self.entered == 3:
            return Step([tool_result(call, "Open.")], status=Status.COMPLETED, reward=1.0)
        return Step([tool_result(call, "Click.")])


class LockEnv(Environment):
    name = "lock"
    tools = [PRESS]

    def index_sets(self):
        return {"test": list(range(12))}

    async def open(self, split, index):
        return LockSession(self.check_index(split, index))


@attrs.frozen
class Generated:
    output_ids: list
    logprobs: list
    finish_reason: str
    weight_version: int
    engine: str


class ScriptedPolicy:
    """TEST DOUBLE of an engine pool: knows code k of the lock with probability skill[k]."""

    def __init__(self, name, tokenizer, skill):
        self.name, self.tokenizer, self.skill = name, tokenizer, skill

    async def generate(self, key, input_ids, params):
        text = self.tokenizer.decode(input_ids)
        step = text.count("Click.")
        index = int(key.split("/")[2])
        rng = random.Random(f"{self.name}/{key}/{step}")
        code = codes(index)[step] if rng.random() < self.skill[step] else 0
        reply = f'<tool_call>\n{{"name": "press", "arguments": {{"code": {code}}}}}\n</tool_call>'
        ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.tokenizer.convert_tokens_to_ids("<|im_end|>")]
        return Generated(ids, [-0.1] * len(ids), "stop", 0, self.name)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from agentrl_core.tinymodel import init_model

    return AutoTokenizer.from_pretrained(init_model(tmp_path_factory.mktemp("tiny"), "tiny"))


def evaluate(mode, tokenizer, repeats=8):
    registry = Registry()
    config = Config(rollout=RolloutConfig(max_turns=3, max_total_len=2048),
                    eval=EvalConfig(tasks=[TaskConfig(env="lock", split="test")], repeats=repeats, mode=mode))
    client = LocalEnvClient.for_environments([LockEnv()])
    pools = {"a": ScriptedPolicy("a", tokenizer, [1.0, 1.0, 0.05]), "b": ScriptedPolicy("b", tokenizer, [0.05, 0.05, 1.0])}

    async def main():
        play = make_token_players(config, registry=registry, tokenizer=tokenizer, env_client=client, pools=pools, mode=mode)
        requests = await build_requests(client, config.eval.tasks, repeats, sorted(pools), mode)
        results = []

        def keep(item, result):
            r = item.request
            results.append(EpisodeResult(r.task, r.index, item.repeat, result["reward"], result["status"],
                                         result["turns"], item.model))
            if mode == "cross":
                keep.pools.append(result["pools"])
        keep.pools = []
        await run_requests(requests, play, concurrency=16, on_result=keep)
        return results, keep.pools

    return anyio.run(main)


def by_model(results):
    out = {}
    for r in results:
        out.setdefault(r.model, []).append(r)
    return {m: summarize(rs)["lock-test"] for m, rs in out.items()}


def union_coverage(results):
    solved = {r.index for r in results if r.success}
    return len(solved) / len({r.index for r in results})


def test_cross_beats_mix_and_singles(tokenizer):
    singles_results, _ = evaluate("single", tokenizer)
    singles = by_model(singles_results)
    mix_results, _ = evaluate("mix", tokenizer)
    assert {r.model for r in mix_results} == {"a", "b"}  # whole trajectories from each model
    mix = summarize(mix_results)["lock-test"]
    cross_results, cross_pools = evaluate("cross", tokenizer)
    cross = by_model(cross_results)["cross"]
    print(json.dumps({name: s.pass_at for name, s in {**singles, "mix": mix, "cross": cross}.items()}, indent=1))
    for k in (1, 2, 4, 8):
        assert cross.pass_at[k] > mix.pass_at[k], k
        assert cross.pass_at[k] > singles["a"].pass_at[k] and cross.pass_at[k] > singles["b"].pass_at[k], k
        assert mix.pass_at[k] <= union_coverage(singles_results) + 1e-12, k
    # every cross trajectory really mixed the two models turn by turn
    assert {p for pools in cross_pools for p in pools} == {"a", "b"}
    assert any(len(set(pools)) == 2 for pools in cross_pools)


def test_pass_at_k_is_the_unbiased_estimator():
    # 8 samples, 1 correct: pass@2 = 1 - C(7,2)/C(8,2) = 1 - 21/28
    assert pass_at_k(8, 1, 2) == pytest.approx(0.25)
