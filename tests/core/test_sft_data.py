"""Demonstrations encode to the same tokens and masks a live rollout would produce."""

from __future__ import annotations

import anyio
import pytest
from test_agent_loop import ScriptedPool, SumEnv, canonical_call, encode_reply

from agentrl_core.env.episodes import play_episode
from agentrl_core.rollout.agent_loop import ChatAgentLoop, LoopSettings, RolloutRequest
from agentrl_core.rollout.sampler import CurrentSampler
from agentrl_core.testing.local_env import LocalEnvClient
from agentrl_core.train.sft_data import encode_demonstration, encode_demonstrations


class SumOracle:
    def act(self, messages):
        from agentrl_core.env import assistant_tool_call

        if not any(m["role"] == "tool" for m in messages):
            return assistant_tool_call("add", {"a": 2, "b": 3})
        return assistant_tool_call("answer", {"value": 5}, call_id="call_1")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_demonstration_matches_rollout_tokens(tokenizer):
    from agentrl_core.rollout.tool_parsers import Qwen25Parser

    env = SumEnv()
    episode = anyio.run(play_episode, env, "test", 0, SumOracle())
    record = episode.to_json()
    seq = encode_demonstration(tokenizer, record, max_total_len=4096)
    # the same episode generated token by token through the agent loop
    texts = [canonical_call("add", {"a": 2, "b": 3}), canonical_call("answer", {"value": 5})]
    pool = ScriptedPool([(encode_reply(tokenizer, t), "stop", 0) for t in texts])
    loop = ChatAgentLoop(tokenizer=tokenizer, env_client=LocalEnvClient({"sum-test": (env, "test")}),
                         pools={"current": pool}, sampler=CurrentSampler(), tool_parser=Qwen25Parser(None),
                         settings=LoopSettings())
    traj = anyio.run(loop.run, RolloutRequest(task="sum-test", index=0, group_id="g", uid="g/0"))
    assert seq.input_ids == traj.input_ids
    assert seq.loss_mask == traj.loss_mask
    assert seq.reward == 1.0


def test_filters_and_truncation(tokenizer):
    env = SumEnv()
    record = anyio.run(play_episode, env, "test", 0, SumOracle()).to_json()
    bad = {**record, "reward": 0.0}
    assert len(encode_demonstrations(tokenizer, [record, bad], max_total_len=4096)) == 2
    assert len(encode_demonstrations(tokenizer, [record, bad], max_total_len=4096, min_reward=1.0)) == 1
    short = encode_demonstration(tokenizer, record, max_total_len=50)
    assert len(short.input_ids) == len(short.loss_mask) == 50


def test_sft_reports_progress_with_total_and_eta(tmp_path, tiny_model_dir):
    import json

    from agentrl_core.config import load_config
    from agentrl_core.jobs.sft import run_sft

    record = anyio.run(play_episode, SumEnv(), "test", 0, SumOracle()).to_json()
    demos = tmp_path / "demos.jsonl"
    demos.write_text("".join(json.dumps(record) + "\n" for _ in range(5)))
    config = load_config(None, [f"model.path={tiny_model_dir}", f"sft.data=[{demos}]", "sft.epochs=2",
                                "sft.batch_size=2", "train.device=cpu", f"run.output_dir={tmp_path / 'run'}"])
    lines = []
    out = run_sft(config, echo=lines.append)
    assert (out / "model.safetensors").is_file()
    assert any("torch thread(s) per rank on CPU" in line for line in lines)
    steps = [line for line in lines if line.startswith("sft ") and " steps (" in line]
    # 5 sequences in batches of 2: 3 steps an epoch, 6 in all; quiet: the first step and the last
    assert steps[0].startswith("sft 1/6 steps (17%)  elapsed") and "eta" in steps[0] and "tok/s" in steps[0]
    assert steps[-1].startswith("sft 6/6 steps (100%)") and "epoch 2/2" in steps[-1]
