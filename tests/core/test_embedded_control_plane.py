"""The embedded control plane: a real controller and workers as child processes."""

from __future__ import annotations

import anyio
import pytest

from agentrl_core.config import ControllerConfig, TaskConfig
from agentrl_core.controlplane.client import ControllerClient
from agentrl_core.controlplane.embedded import EmbeddedControlPlane
from agentrl_core.testing import temporary_distribution

pytestmark = pytest.mark.processes

ENV_MODULE = """
from agentrl_core import hookimpl
from agentrl_core.env import Environment, Status, Step, ToolSession, function_tool, tool_result
from agentrl_core.types import EnvironmentSpec

TOOLS = [function_tool("done", "finish", {"ok": {"type": "boolean"}}, ["ok"])]

@hookimpl
def agentrl_environments():
    return [EnvironmentSpec(name="ping", factory="ping_env:PingEnv")]

class PingSession(ToolSession):
    async def on_start(self):
        return Step([{"role": "user", "content": "call done"}])

    async def on_tool_call(self, call, message):
        return Step([tool_result(call, "ok")], status=Status.COMPLETED, reward=float(call.arguments["ok"]))

class PingEnv(Environment):
    name = "ping"
    tools = TOOLS

    def index_sets(self):
        return {"a": [0, 1], "b": ["x"]}

    async def open(self, split, index):
        self.check_index(split, index)
        return PingSession(TOOLS, max_rounds=3)
"""


def test_controller_and_workers_start_register_and_serve(tmp_path, monkeypatch):
    with temporary_distribution(tmp_path / "dist", "agentrl-env-ping", entry_points={"env_ping": "ping_env"},
                                modules={"ping_env": ENV_MODULE}) as root:
        monkeypatch.setenv("PYTHONPATH", str(root))
        tasks = [TaskConfig(env="ping", split="a"), TaskConfig(env="ping", split="b"), TaskConfig(env="ping", split="a")]
        with EmbeddedControlPlane(tasks, ControllerConfig(heartbeat_interval=1.0), run_dir=tmp_path / "run") as cp:
            assert sorted(cp.workers) == ["ping-a", "ping-b"]

            async def episode():
                async with ControllerClient(cp.url) as client:
                    assert await client.get_indices("ping-a") == [0, 1]
                    started = await client.start("ping-b", 0)
                    result = await client.interact(started.session_id, [{
                        "role": "assistant", "content": "",
                        "tool_calls": [{"id": "c", "type": "function",
                                        "function": {"name": "done", "arguments": '{"ok": true}'}}]}])
                    return result

            result = anyio.run(episode)
            assert result.finish and result.reward == 1.0 and result.status == "completed"
            workers = [w for ws in cp.workers.values() for w in ws]
        assert not any(w.alive() for w in workers) and not cp.controller.alive()
