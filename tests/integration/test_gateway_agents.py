"""Agent programs trained through the gateway: the example agents, and ``agentrl train`` with ``agent:``.

Everything is real: the example programs of ``examples/gateway`` (the plain ``openai`` SDK
and the OpenAI Agents SDK), the gateway, the hf engine with the tiny model, and the calc
environment of ``agentrl-plugin-example``. The tiny model need not solve calc: the tests
check that every call went through the gateway and became training data.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentrl_core.config import config_from_dict
from agentrl_core.engine.process import BackgroundEngine
from agentrl_core.engine.server import EngineServer
from agentrl_core.gateway.client import GatewayClient
from agentrl_core.gateway.loop import GatewayAgentLoop, load_program
from agentrl_core.gateway.process import BackgroundGateway, build_gateway
from agentrl_core.registry import Registry, build_environment
from agentrl_core.rollout.agent_loop import RolloutRequest
from agentrl_core.testing.local_env import LocalEnvClient
from agentrl_core.types import FailureKind

ROOT = Path(__file__).resolve().parents[2]
CALC = {"max_ops": 1, "ops": ["+"], "max_operand": 9, "compact_prompt": True, "max_rounds": 3}


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def gateway(tiny_model_dir):
    config = config_from_dict({"model": {"path": str(tiny_model_dir)},
                               "rollout": {"max_new_tokens": 16, "max_total_len": 2048, "temperature": 1.0}})
    with BackgroundEngine(EngineServer(tiny_model_dir, max_running_requests=8, dtype="float32")) as engine, \
            BackgroundGateway(build_gateway(config, {"current": [engine.url]})) as background:
        yield background


@pytest.mark.anyio
@pytest.mark.parametrize("example", ["openai_agent.py", "agents_sdk_agent.py"])
async def test_the_example_agents_play_calc_through_the_gateway(example, gateway):
    program = load_program(f"{ROOT / 'examples' / 'gateway' / example}:run", registry=Registry())
    env = build_environment("calc", CALC)
    calls_before = gateway.server.counters["calls"]
    async with GatewayClient(gateway.url) as client:
        loop = GatewayAgentLoop(program=program, gateway=client, env_client=LocalEnvClient({"calc-train": (env, "train")}))
        trajectories = [await loop.run(RolloutRequest(task="calc-train", index=i, group_id="g", uid=f"g/{i}",
                                                      sample=i, split="train", env="calc")) for i in range(2)]
    for t in trajectories:
        assert t.failure is not FailureKind.INFRA, t.metrics
        assert t.training_reward is not None and t.num_action_tokens > 0
        assert t.num_turns == sum(t.metrics[f"gateway/{k}"] for k in ("new", "append", "realign", "fork"))
    assert gateway.server.counters["calls"] - calls_before == sum(t.num_turns for t in trajectories)


def test_agentrl_train_with_an_agent_program(tmp_path, tiny_model_dir):
    """``agentrl train`` starts the gateway, runs the plain openai example n times per task and trains."""
    config = yaml.safe_load((ROOT / "examples" / "gateway" / "train_calc.yaml").read_text())
    config["run"] = {"name": "agent", "output_dir": str(tmp_path / "agent"), "seed": 1}
    config["model"]["path"] = str(tiny_model_dir)
    config["agent"] = str(ROOT / "examples" / "gateway" / "openai_agent.py") + ":run"
    config["environments"]["calc"]["max_rounds"] = 3
    config["rollout"].update(n_samples=2, batch_size=2, concurrency=8, max_new_tokens=16, max_total_len=1024)
    config["train"].update(total_steps=2)
    config["logging"]["progress"] = False
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run([sys.executable, "-m", "agentrl_core.cli.main", "train", str(path)], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "gateway for agent program" in proc.stdout
    run_dir = tmp_path / "agent"
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    trained = [s for s in steps if "learner/num_tokens" in s]
    assert len(trained) == 2
    for step in trained:
        calls = sum(step.get(f"gateway/{k}", 0) for k in ("new", "append", "realign", "fork"))
        assert calls == step["task/calc-train/turns"] * step["trajectories"] and step["learner/num_tokens"] > 0
        assert step.get("rollout/failure/infra", 0) == 0
    assert "listening on" in (run_dir / "logs" / "gateway.log").read_text()
