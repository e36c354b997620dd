"""An agentrl environment plugin (``interop``) served by *our* worker in the interoperability tests.

Installed for the test run as a throw-away distribution with an ``agentrl`` entry point.
"""

import json

from agentrl_core import hookimpl
from agentrl_core.env import Environment, Status, Step, ToolSession, function_tool, tool_result
from agentrl_core.types import EnvironmentSpec

TOOLS = [
    function_tool("ping", "answer pong", {"n": {"type": "integer"}}, ["n"]),
    function_tool("finish", "end the episode", {}),
]


class InteropSession(ToolSession):
    def __init__(self, index):
        super().__init__(TOOLS, max_rounds=4)
        self.index = index

    async def on_start(self):
        return Step([{"role": "system", "content": "interop test"}, {"role": "user", "content": f"task {self.index}"}])

    async def on_tool_call(self, call, message):
        if call.name == "ping":
            return Step([tool_result(call, f"pong {call.arguments['n']}")])
        return Step([tool_result(call, "bye")], status=Status.COMPLETED, reward=1.0, metrics={"index": self.index})


class InteropEnvironment(Environment):
    name = "interop"
    tools = TOOLS
    concurrency = 2

    def index_sets(self):
        return {"std": list(range(5)), "named": ["alpha", "beta"]}

    async def open(self, split, index):
        return InteropSession(self.check_index(split, index))


@hookimpl
def agentrl_environments():
    yield EnvironmentSpec(name="interop", factory="interop_env:InteropEnvironment")


if __name__ == "__main__":  # pragma: no cover - a quick look at the tools
    print(json.dumps(TOOLS, indent=2))
