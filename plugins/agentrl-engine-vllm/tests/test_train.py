"""``agentrl train`` with ``engine.driver: vllm``: two learner steps, weights synced to vLLM each step.

Everything is real (the CLI, Ray, the embedded controller and a task worker, the FSDP2
learner, a vLLM CPU server behind its front); the environment is a one-tool toy installed
for the test only (this nox session has no environment plugin).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import needs_vllm

from agentrl_core.testing import temporary_distribution

pytestmark = [needs_vllm, pytest.mark.vllm, pytest.mark.processes, pytest.mark.slow]

ENV_MODULE = """
from agentrl_core import hookimpl
from agentrl_core.env import Environment, Status, Step, ToolSession, function_tool, tool_result
from agentrl_core.types import EnvironmentSpec

TOOLS = [function_tool("answer", "give the answer", {"value": {"type": "string"}}, ["value"])]

@hookimpl
def agentrl_environments():
    return [EnvironmentSpec(name="echo", factory="echo_env:EchoEnv")]

class EchoSession(ToolSession):
    def __init__(self, index):
        super().__init__(TOOLS, max_rounds=2)
        self.index = index

    async def on_start(self):
        return Step([{"role": "user", "content": f"Answer with the word {self.index}."}])

    async def on_tool_call(self, call, message):
        ok = str(call.arguments.get("value")) == str(self.index)
        return Step([tool_result(call, "ok")], status=Status.COMPLETED, reward=float(ok))

class EchoEnv(Environment):
    name = "echo"
    tools = TOOLS

    def index_sets(self):
        return {"train": list(range(8))}

    async def open(self, split, index):
        self.check_index(split, index)
        return EchoSession(index)
"""


def test_two_train_steps_with_the_vllm_engine(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    config = {
        "run": {"name": "vllm", "output_dir": str(run_dir), "seed": 3},
        "model": {"path": str(tiny_model_dir)},
        "tasks": [{"env": "echo", "split": "train", "limit": 8}],
        "rollout": {"n_samples": 2, "batch_size": 2, "concurrency": 8, "max_turns": 2, "max_total_len": 512,
                    "max_new_tokens": 16, "temperature": 1.0},
        "loss": {"kl_coef": 0.0},
        "optim": {"lr": 1.0e-3},
        "train": {"mode": "async", "total_steps": 2, "device": "cpu"},
        "engine": {"driver": "vllm", "device": "cpu", "vllm": {"max_num_seqs": 8}},
        "weight_sync": {"transport": "disk", "disk_path": str(tmp_path / "weights")},
        "logging": {"loggers": ["jsonl"], "sample_rollouts": 0, "progress": False},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    with temporary_distribution(tmp_path / "dist", "agentrl-env-echo", entry_points={"env_echo": "echo_env"},
                                modules={"echo_env": ENV_MODULE}) as root:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
        proc = subprocess.run([sys.executable, "-m", "agentrl_core.cli.main", "train", str(path)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    trained = [m for m in steps if "weight_sync/current/seconds" in m]
    assert len(trained) == 2
    engine_log = (run_dir / "logs" / "current-0.log").read_text()
    assert "agentrl vllm engine listening on" in engine_log  # the engines were vLLM servers behind the front
    for version in (0, 1, 2):  # the initial sync and one after each step, each checked bit for bit
        assert f"(version {version}, bit-exact)" in engine_log
