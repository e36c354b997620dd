"""An upstream AgentRL task (agentrl-worker 0.4.0 API) for the interoperability tests.

Loaded by ``python -m agentrl.worker echo-upstream --config echo_task.yaml`` inside the
upstream virtual environment. Two tools: ``ping`` answers "pong <n>", ``finish`` ends the
episode with reward 1; at most four turns.
"""

from agentrl.worker.task import Task
from agentrl.worker.typings import RewardHistoryItem, SampleStatus, TaskSampleExecutionResult

TOOLS = [
    {"type": "function", "function": {"name": "ping", "description": "answer pong",
                                      "parameters": {"type": "object", "properties": {"n": {"type": "integer"}},
                                                     "required": ["n"]}}},
    {"type": "function", "function": {"name": "finish", "description": "end the episode",
                                      "parameters": {"type": "object", "properties": {}}}},
]


class EchoTask(Task):
    def __init__(self, name="echo-upstream", concurrency=2, **kwargs):
        super().__init__(name=name, concurrency=concurrency, tools=TOOLS, full_async=True)

    def get_indices(self):
        return list(range(5))

    async def start_sample(self, index, session):
        import json

        session.inject({"role": "user", "content": f"upstream task {index}"})
        for turn in range(4):
            answer = await session.action()
            message = answer.messages[-1]
            calls = message.get("tool_calls") or []
            if not calls:
                session.inject({"role": "user", "content": "call a tool"})
                continue
            call = calls[0]
            if call["function"]["name"] == "finish":
                session.inject({"role": "tool", "tool_call_id": call["id"], "content": "bye"})
                session.inject(RewardHistoryItem(reward=1.0, metrics={"turns": turn + 1}))
                return TaskSampleExecutionResult(status=SampleStatus.COMPLETED, result={"index": index})
            n = json.loads(call["function"]["arguments"] or "{}").get("n", 0)
            session.inject({"role": "tool", "tool_call_id": call["id"], "content": f"pong {n}"})
        return TaskSampleExecutionResult(status=SampleStatus.TASK_LIMIT_REACHED)
