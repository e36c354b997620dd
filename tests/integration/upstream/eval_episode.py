"""Drive our controller with the upstream evaluation client (agentrl-eval 0.1.2).

Runs inside the upstream virtual environment:

    python eval_episode.py CONTROLLER_URL TASK INDEX [INDEX ...]

Each index is played by agentrl-eval's own ``SampleWorkflow`` (start_sample with retries,
interact, cancel on client errors) with a scripted model: ``ping`` twice, then ``finish``.
Prints one JSON line: the indices the client got from ``get_indices`` and a result per run.
"""

import asyncio
import json
import sys

from agentrl.eval.client._base import BaseClient
from agentrl.eval.convert import OpenAIChatCompletionInputMessageRecord
from agentrl.eval.session.controller import ControllerClient
from agentrl.eval.session.types import RunSpec
from agentrl.eval.session.workflow import SampleWorkflow


class ScriptedModel(BaseClient):
    """Answers with tool calls: ping 1, ping 2, finish."""

    def __init__(self):
        self.turn = 0

    async def get_model_name(self):
        return "scripted"

    async def query(self, messages, tools=None, cache_key=None):
        self.turn += 1
        name, args = ("ping", {"n": self.turn}) if self.turn <= 2 else ("finish", {})
        call = {"id": f"call_{self.turn}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)}}
        return [OpenAIChatCompletionInputMessageRecord([{"role": "assistant", "content": "", "tool_calls": [call]}])]

    async def close(self):
        pass


async def main(url, task, indices):
    controller = ControllerClient(url, proxy_url=None)
    try:
        known = await controller.get_indices(task)
        results = []
        for index in indices:
            spec = RunSpec(model="scripted", run=0, task=task, index=index, custom_params=None)
            result = await SampleWorkflow(controller=controller, models=[ScriptedModel()], spec=spec)()
            results.append(result.model_dump(mode="json"))
        print(json.dumps({"indices": known, "results": results}))
    finally:
        await controller.close()


if __name__ == "__main__":
    url, task, *raw = sys.argv[1:]
    asyncio.run(main(url, task, [int(i) if i.lstrip("-").isdigit() else i for i in raw]))
