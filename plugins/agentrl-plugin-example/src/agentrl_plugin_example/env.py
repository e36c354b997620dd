"""The ``calc`` environment: evaluate an arithmetic expression one operation at a time.

Each sample is an expression such as ``((12 + 7) * 3) - 5``, generated deterministically
from its index. The agent calls ``calculate(a, op, b)`` for each operation, left to right,
then ``submit_answer(answer)``. Reward 1 for the exact value, else 0. Episodes take 2 to
``max_ops + 1`` turns, so lengths vary.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from attrs import field, frozen

from agentrl_core.env import (
    Environment,
    Status,
    Step,
    ToolCall,
    ToolSession,
    assistant_tool_call,
    function_tool,
    tool_result,
)
from agentrl_core.structure import in_range
from agentrl_core.types import Index, Message

OPS = ("+", "-", "*")

SYSTEM_PROMPT = (
    "You are a careful calculator agent. Evaluate the expression one operation at a time, "
    "innermost parentheses first: call `calculate` with two numbers and an operator, use its "
    "result in the next operation, and finally call `submit_answer` with the final value."
)

TOOLS = [
    function_tool(
        "calculate",
        "Apply one arithmetic operation to two integers and return the result.",
        {
            "a": {"type": "integer", "description": "left operand"},
            "op": {"type": "string", "enum": list(OPS), "description": "operator"},
            "b": {"type": "integer", "description": "right operand"},
        },
        required=["a", "op", "b"],
    ),
    function_tool(
        "submit_answer",
        "Submit the final value of the expression. This ends the episode.",
        {"answer": {"type": "integer", "description": "the value of the whole expression"}},
        required=["answer"],
    ),
]

# ``compact_prompt: true``: the same tools without descriptions and a one-line system
# prompt, about 120 tokens shorter per episode; for tiny models trained on CPU.
COMPACT_SYSTEM_PROMPT = "Calculate step by step with `calculate`, then call `submit_answer`."


def _without_descriptions(tool: dict) -> dict:
    fn = {k: v for k, v in tool["function"].items() if k != "description"}
    params = dict(fn["parameters"])
    params["properties"] = {
        name: {k: v for k, v in prop.items() if k != "description"} for name, prop in params["properties"].items()
    }
    return {"type": "function", "function": {**fn, "parameters": params}}


COMPACT_TOOLS = [_without_descriptions(t) for t in TOOLS]


def _check_ops(instance: object, attribute: object, value: list[str]) -> None:
    if not value or len(set(value)) != len(value) or set(value) - set(OPS):
        raise ValueError(f"ops must be distinct operators among {list(OPS)}, got {value!r}")


@frozen
class CalcConfig:
    """Config section ``environments.calc``."""

    train_size: int = field(default=5000, validator=in_range(1))
    test_size: int = field(default=200, validator=in_range(1))
    min_ops: int = field(default=1, validator=in_range(1))
    max_ops: int = field(default=3, validator=in_range(1, 8))
    max_operand: int = field(default=20, validator=in_range(2))
    max_rounds: int = field(default=10, validator=in_range(1))
    concurrency: int = field(default=256, validator=in_range(1))
    compact_prompt: bool = False  # tools without descriptions, one-line system prompt
    ops: list[str] = field(factory=lambda: list(OPS), validator=_check_ops)  # operators problems use


@frozen
class Problem:
    start: int
    steps: tuple[tuple[str, int], ...]  # (op, right operand), applied left to right

    @property
    def text(self) -> str:
        expr = str(self.start)
        for i, (op, b) in enumerate(self.steps):
            expr = f"({expr} {op} {b})" if i < len(self.steps) - 1 else f"{expr} {op} {b}"
        return expr

    def intermediate(self) -> list[int]:
        values, value = [], self.start
        for op, b in self.steps:
            value = apply(value, op, b)
            values.append(value)
        return values

    @property
    def answer(self) -> int:
        return self.intermediate()[-1]


def apply(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    return a * b


def make_problem(split: str, index: int, config: CalcConfig) -> Problem:
    # A string seed is hashed deterministically by random.Random (unlike hash()).
    rng = random.Random(f"calc/{split}/{index}")
    n_ops = rng.randint(config.min_ops, max(config.min_ops, config.max_ops))
    start = rng.randint(1, config.max_operand)
    steps = tuple((rng.choice(config.ops), rng.randint(1, config.max_operand)) for _ in range(n_ops))
    return Problem(start, steps)


class CalcSession(ToolSession):
    def __init__(self, env: CalcEnvironment, problem: Problem) -> None:
        super().__init__(env.tools, max_rounds=env.config.max_rounds)
        self.env = env
        self.problem = problem
        self.calls = 0

    async def on_start(self) -> Step:
        self.env.live_sessions += 1
        return Step(
            [
                {"role": "system", "content": COMPACT_SYSTEM_PROMPT if self.env.config.compact_prompt else SYSTEM_PROMPT},
                {"role": "user", "content": f"Compute {self.problem.text}"},
            ]
        )

    async def on_tool_call(self, call: ToolCall, message: Message) -> Step:
        if call.name == "calculate":
            self.calls += 1
            value = apply(call.arguments["a"], call.arguments["op"], call.arguments["b"])
            return Step([tool_result(call, f"Result: {value}")])
        correct = call.arguments["answer"] == self.problem.answer
        text = "Correct." if correct else "Incorrect."
        return Step(
            [tool_result(call, text)],
            status=Status.COMPLETED,
            reward=1.0 if correct else 0.0,
            metrics={"calculate_calls": self.calls, "ops": len(self.problem.steps)},
        )

    async def on_close(self) -> None:
        self.env.live_sessions -= 1


class CalcEnvironment(Environment):
    name = "calc"
    tools = TOOLS

    def __init__(self, config: CalcConfig | None = None) -> None:
        super().__init__(config or CalcConfig())
        if self.config.min_ops > self.config.max_ops:
            raise ValueError("environments.calc: min_ops must be <= max_ops")
        self.concurrency = self.config.concurrency
        self.tools = COMPACT_TOOLS if self.config.compact_prompt else TOOLS
        self.live_sessions = 0
        self._sets = {"train": range(self.config.train_size), "test": range(self.config.test_size)}

    def index_sets(self) -> dict[str, Sequence[Index]]:
        # Test problems use their own seed space ("calc/test/i"), so train and test differ.
        return {split: list(r) for split, r in self._sets.items()}

    def problem(self, split: str, index: Index) -> Problem:
        index = self.check_index(split, index)
        return make_problem(split, int(index), self.config)

    async def open(self, split: str, index: Index) -> CalcSession:
        return CalcSession(self, self.problem(split, index))

    def oracle(self, split: str, index: Index, *, error_rate: float = 0.0, seed: int = 0) -> CalcOracle:
        return CalcOracle(self.problem(split, index), error_rate=error_rate, seed=seed)

    def resource_count(self) -> int:
        return self.live_sessions


_RESULT = re.compile(r"Result: (-?\d+)")


class CalcOracle:
    """Solves the problem step by step; with ``error_rate`` it perturbs operands on purpose.

    It chains the results the environment returns (not its own arithmetic), so one wrong
    operand propagates to a wrong answer, as a model's mistake would.
    """

    def __init__(self, problem: Problem, *, error_rate: float = 0.0, seed: int = 0) -> None:
        self.problem = problem
        self.error_rate = error_rate
        self.rng = random.Random(seed)

    def _maybe_wrong(self, value: int) -> int:
        if self.error_rate > 0 and self.rng.random() < self.error_rate:
            return value + self.rng.choice([-3, -2, -1, 1, 2, 3])
        return value

    def act(self, messages: Sequence[Message]) -> Message:
        results = [int(m.group(1)) for msg in messages if msg.get("role") == "tool"
                   for m in [_RESULT.match(str(msg.get("content", "")))] if m]
        done = len(results)
        current = results[-1] if results else self.problem.start
        if done < len(self.problem.steps):
            op, b = self.problem.steps[done]
            return assistant_tool_call("calculate", {"a": current, "op": op, "b": self._maybe_wrong(b)},
                                       call_id=f"call_{done}")
        return assistant_tool_call("submit_answer", {"answer": self._maybe_wrong(current)}, call_id=f"call_{done}")

