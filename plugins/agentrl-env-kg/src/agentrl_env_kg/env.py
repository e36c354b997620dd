"""The ``kg`` environment: AgentBench-FC's knowledge-graph task.

One episode: the system prompt, the question with its entity mentions, then up to
``max_rounds`` (15) turns of tool calls (every call of a turn runs, as upstream). A turn
without tool calls that says "Final Answer: #k" ends the episode: the variable's program
runs once, reward 1 for exactly the gold answer set, 0 otherwise, F1 in
``metrics.score``. "Final Answer" naming a variable that does not exist ends it as
``agent validation failed`` (as upstream); any other text gets upstream's "No valid
function calls found!" and the episode goes on.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from agentrl_core.env import (
    BadTurn,
    Environment,
    Status,
    Step,
    ToolCall,
    ToolSession,
    assistant_tool_call,
    parse_tool_call,
    run_blocking,
    tool_result,
)
from agentrl_core.errors import EnvError
from agentrl_core.types import Index, Message
from agentrl_env_kg import prompts
from agentrl_env_kg.api import KGApi, ToolError, f1, final_answer_index
from agentrl_env_kg.backends import Backend, EmbeddedBackend, SparqlBackend
from agentrl_env_kg.config import KGConfig
from agentrl_env_kg.ontology import Ontology
from agentrl_env_kg.questions import Question, load_agentbench, load_generated

log = logging.getLogger(__name__)

AGENTBENCH_SETS = ("std", "dev", "train")


def tool_calls_of(message: Message) -> list:
    calls = message.get("tool_calls") if isinstance(message, Mapping) else None
    return list(calls) if isinstance(calls, list) else []


class KGSession(ToolSession):
    def __init__(self, env: KGEnvironment, question: Question, backend: Backend, ontology: Ontology) -> None:
        super().__init__(prompts.TOOLS, max_rounds=env.config.max_rounds)
        self.env = env
        self.question = question
        self.api = KGApi(backend, ontology, question.entities, max_results=env.config.max_results)
        self.tool_calls = 0
        self.tool_errors = 0

    async def on_start(self) -> Step:
        self.env.live_sessions += 1
        messages: list[Message] = [{"role": "system", "content": prompts.INSTRUCTIONS.format(max_round=self.max_rounds)}]
        if self.env.config.one_shot:
            messages.extend(prompts.one_shot())
        messages.append({"role": "user", "content": self.question.prompt()})
        return Step(messages)

    async def _run(self, call: ToolCall) -> Message:
        self.tool_calls += 1
        try:
            observation = await self.api.call(call.name, call.arguments)
        except ToolError as exc:
            self.tool_errors += 1
            observation = f"Error processing tool call: {exc}"
        return tool_result(call, observation)

    async def _rest(self, message: Message) -> list[Message]:
        """Upstream runs every tool call of a turn; the base class validated only the first."""
        out: list[Message] = []
        for raw in tool_calls_of(message)[1:]:
            parsed = parse_tool_call(raw, self.tools)
            if isinstance(parsed, BadTurn):
                self.tool_errors += 1
                out.extend(parsed.observation)
            else:
                out.append(await self._run(parsed))
        return out

    async def on_tool_call(self, call: ToolCall, message: Message) -> Step:
        first = await self._run(call)
        return Step([first, *await self._rest(message)])

    async def on_bad_turn(self, bad: BadTurn, message: Message) -> Step:
        if tool_calls_of(message):
            return Step([*bad.observation, *await self._rest(message)])
        return Step(bad.observation)

    async def on_text(self, message: Message) -> Step | None:
        index = final_answer_index(message.get("content") if isinstance(message.get("content"), str) else None)
        if index is None:
            self.invalid_turns += 1
            return Step([{"role": "user", "content": prompts.NO_CALL}])
        if index >= len(self.api.variables):
            return Step(
                [{"role": "user", "content": f"Variable #{index} does not exist."}],
                status=Status.AGENT_VALIDATION_FAILED,
                metrics={"score": 0.0},
            )
        try:
            predicted = await self.api.execute(self.api.variables[index])
        except ToolError as exc:
            return Step(
                [{"role": "user", "content": f"The answer could not be computed: {exc}"}],
                status=Status.AGENT_VALIDATION_FAILED,
                metrics={"score": 0.0},
            )
        gold = set(self.question.gold)
        correct = predicted == gold
        return Step(
            [],
            status=Status.COMPLETED,
            reward=1.0 if correct else 0.0,
            metrics={"score": f1(predicted, gold), "predicted": len(predicted), "gold": len(gold)},
        )

    def metrics(self) -> dict[str, Any]:
        return {**super().metrics(), "tool_calls": self.tool_calls, "tool_errors": self.tool_errors,
                "queries": self.api.queries, "variables": len(self.api.variables)}

    async def on_close(self) -> None:
        if self._started:
            self.env.live_sessions -= 1


class KGEnvironment(Environment):
    name = "kg"
    tools = prompts.TOOLS

    def __init__(
        self,
        config: KGConfig | None = None,
        *,
        questions: Mapping[str, Sequence[Question]] | None = None,
        backend: Backend | None = None,
        ontology: Ontology | None = None,
    ) -> None:
        """``questions``, ``backend`` and ``ontology`` replace what the config would load
        (for custom graphs and question sets; a given backend is closed by :meth:`aclose`)."""
        super().__init__(config or KGConfig())
        cfg: KGConfig = self.config
        if cfg.backend == "sparql" and not cfg.endpoint and backend is None:
            raise EnvError("environments.kg: backend 'sparql' needs an endpoint URL (e.g. http://localhost:3001/sparql)")
        if (backend is None) != (ontology is None):
            raise ValueError("KGEnvironment: pass backend and ontology together")
        self.concurrency = cfg.concurrency
        self.live_sessions = 0
        self.questions = {k: list(v) for k, v in questions.items()} if questions is not None else self._load_questions(cfg)
        self._backend: Backend | None = backend
        self._ontology: Ontology | None = ontology
        self._ready = anyio.Lock()
        self.store_info: dict[str, Any] = {}

    @staticmethod
    def _load_questions(cfg: KGConfig) -> dict[str, list[Question]]:
        if cfg.source == "agentbench":
            return {split: load_agentbench(split, cfg.data_dir) for split in AGENTBENCH_SETS}
        return load_generated(cfg.questions_file)

    def index_sets(self) -> dict[str, Sequence[Index]]:
        return {split: range(len(qs)) for split, qs in self.questions.items()}

    def question(self, split: str, index: Index) -> Question:
        return self.questions[split][int(self.check_index(split, index))]

    async def backend(self) -> tuple[Backend, Ontology]:
        """The shared backend and ontology, prepared on first use (a store may be built)."""
        async with self._ready:
            if self._backend is None:
                self._backend, self._ontology = await run_blocking(self._prepare)
        return self._backend, self._ontology

    def _prepare(self) -> tuple[Backend, Ontology]:
        from agentrl_env_kg import graphs

        cfg: KGConfig = self.config
        ontology = graphs.ontology_for(cfg)
        if cfg.backend == "sparql":
            backend: Backend = SparqlBackend(cfg.endpoint, timeout=cfg.query_timeout, connect_timeout=cfg.connect_timeout,
                                             max_connections=cfg.max_connections)
        else:
            store, self.store_info = graphs.open_embedded(cfg)
            backend = EmbeddedBackend(store, timeout=cfg.query_timeout, threads=cfg.query_threads)
        return backend, ontology

    async def open(self, split: str, index: Index) -> KGSession:
        question = self.question(split, index)
        backend, ontology = await self.backend()
        return KGSession(self, question, backend, ontology)

    def oracle(self, split: str, index: Index, *, error_rate: float = 0.0, seed: int = 0) -> KGOracle:
        return KGOracle(self.question(split, index), error_rate=error_rate, seed=seed)

    def resource_count(self) -> int:
        return self.live_sessions

    async def aclose(self) -> None:
        if self._backend is not None:
            await self._backend.aclose()
            self._backend = None


class KGOracle:
    """Replays the gold tool sequence with entity mentions, then answers the last variable.

    With ``error_rate`` > 0 it errs on purpose: a ``get_neighbors`` may follow another of
    the listed relations, and the final answer may name an earlier variable.
    """

    def __init__(self, question: Question, *, error_rate: float = 0.0, seed: int = 0) -> None:
        self.question = question
        self.calls = question.tool_calls()
        self.error_rate = error_rate
        self.rng = random.Random(f"{question.qid}/{seed}")
        self.variables = sum(1 for tool, _ in self.calls if tool not in ("get_relations", "get_attributes"))

    def _err(self) -> bool:
        return self.error_rate > 0 and self.rng.random() < self.error_rate

    def act(self, messages: Sequence[Message]) -> Message:
        done = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
        if done < len(self.calls):
            tool, args = self.calls[done]
            if tool == "get_neighbors" and self._err():
                listed = _last_listing(messages)
                others = [r for r in listed if r != args["relation"]]
                if others:
                    args = {**args, "relation": self.rng.choice(others)}
            return assistant_tool_call(tool, args, call_id=f"call_{done}")
        answer = self.variables - 1
        if answer > 0 and self._err():
            answer = self.rng.randrange(answer)
        return {"role": "assistant", "content": f"Final Answer: #{answer}"}


def _last_listing(messages: Sequence[Message]) -> list[str]:
    for m in reversed(messages):
        content = m.get("content") if m.get("role") == "tool" else None
        if isinstance(content, str) and content.startswith("Observation: ["):
            inner = content[len("Observation: ["):].rstrip("]")
            return [r.strip() for r in inner.split(",") if r.strip()]
    return []


__all__ = ["KGConfig", "KGEnvironment", "KGOracle", "KGSession"]
