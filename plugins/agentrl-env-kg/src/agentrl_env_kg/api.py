"""The seven KG tools with AgentBench-FC semantics, over any :class:`Backend`.

As upstream (``api.py``), a variable is a *lazy program*: ``get_neighbors``,
``intersection``, ``argmax``, ``argmin`` and ``count`` only build a logical form and tell
the agent the new variable's type; ``get_relations`` and ``get_attributes`` run one query;
the final answer runs the variable's program once. So the agent sees relation lists and
types, never the ids of intermediate results.

* ``get_relations(v)``: relations leaving ``v`` (an entity of the question, by its mention
  or id, or a variable ``#k``), kept to the ontology's relation list, sorted.
* ``get_neighbors(v, r)``: ``r`` must be one of ``v``'s relations (checked with a
  ``get_relations`` query when not yet known); the new variable's type is ``r``'s range.
* ``intersection(a, b)``: both variables, of the same type.
* ``get_attributes(v)`` / ``argmax(v, a)`` / ``argmin(v, a)``: numeric attributes; the
  superlative keeps *every* element tied at the extreme value.
* ``count(v)``: a number; numbers can only be given as the final answer.

Arguments resolve as upstream: ``#k`` is variable k, a mention of a question entity is
that entity, anything else is taken as written (an entity id such as ``m.0km5c`` works).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from attrs import frozen

from agentrl_env_kg import lisp
from agentrl_env_kg.backends import Backend, QueryError
from agentrl_env_kg.ontology import Ontology
from agentrl_env_kg.questions import TOOL_PARAMS

NUMBER_TYPE = "type.int"
_FINAL_RE = re.compile(r"(?:Find|Final) Answer: #(\d+)")


class ToolError(Exception):
    """A tool call the agent got wrong; the message is the observation it gets back."""


@frozen
class Variable:
    type: str
    program: str

    @property
    def is_number(self) -> bool:
        return self.program.startswith("(COUNT ")


def final_answer_index(text: str | None) -> int | None:
    """The k of the first "Final Answer: #k" (upstream also accepts "Find Answer")."""
    text = (text or "").split("Observation:")[0].replace("\\_", "_")
    match = _FINAL_RE.search(text)
    return int(match.group(1)) if match else None


def f1(predicted: set[str], gold: set[str]) -> float:
    hits = len(predicted & gold)
    if hits == 0:
        return 0.0
    precision, recall = hits / len(predicted), hits / len(gold)
    return 2 * precision * recall / (precision + recall)


class KGApi:
    """The tool state of one episode: its variables and the relations seen so far."""

    def __init__(self, backend: Backend, ontology: Ontology, entities: Mapping[str, str], *, max_results: int = 10_000):
        self.backend = backend
        self.ontology = ontology
        self.entities = dict(entities)
        self.max_results = max_results
        self.variables: list[Variable] = []
        self._relations: dict[str, list[str]] = {}
        self._attributes: dict[str, list[str]] = {}
        self.queries = 0

    # -- dispatch -----------------------------------------------------------------------

    async def call(self, tool: str, arguments: Mapping[str, Any]) -> str:
        """Run one validated tool call; returns the observation or raises ToolError."""
        values = [self._resolve(arguments[p]) for p in TOOL_PARAMS[tool]]
        return await getattr(self, tool)(*values)

    def _resolve(self, value: Any) -> Variable | str:
        if isinstance(value, str) and value.strip().startswith("#"):
            ref = value.strip()
            if not ref[1:].isdigit():
                raise ToolError(f"{ref!r} is not a variable; variables are written #0, #1, ...")
            k = int(ref[1:])
            if k >= len(self.variables):
                known = f"#0 to #{len(self.variables) - 1}" if self.variables else "none yet"
                raise ToolError(f"variable #{k} does not exist (variables so far: {known})")
            return self.variables[k]
        if value in self.entities:
            return self.entities[value]
        return value

    def _new(self, variable: Variable, message: str) -> str:
        self.variables.append(variable)
        return message.replace("##", f"#{len(self.variables) - 1}")

    async def _select(self, query: str, max_rows: int | None = None) -> list[tuple[str, ...]]:
        self.queries += 1
        try:
            return await self.backend.select(query, max_rows=max_rows)
        except QueryError as exc:
            raise ToolError(str(exc)) from None

    # -- helpers ------------------------------------------------------------------------

    @staticmethod
    def _subject(tool: str, value: Variable | str) -> str:
        """The program or entity id a tool works on."""
        if isinstance(value, Variable):
            if value.is_number:
                raise ToolError(f"{tool}: the variable is a number (a count), not a set of entities")
            return value.program
        if isinstance(value, str) and lisp.is_entity(value):
            return value
        raise ToolError(f"{tool}: variable must be a variable or an entity")

    @staticmethod
    def _variable(tool: str, value: Variable | str) -> Variable:
        if not isinstance(value, Variable):
            raise ToolError(f"{tool}: variable must be a variable")
        if value.is_number:
            raise ToolError(f"{tool}: the variable is a number (a count), not a set of entities")
        return value

    async def _outgoing(self, subject: str) -> list[str]:
        rows = await self._select(lisp.relations_query(subject))
        return sorted({r[0] for r in rows})

    async def relations_of(self, subject: str) -> list[str]:
        if subject not in self._relations:
            self._relations[subject] = [r for r in await self._outgoing(subject) if r in self.ontology.relations]
        return self._relations[subject]

    async def attributes_of(self, program: str) -> list[str]:
        if program not in self._attributes:
            self._attributes[program] = [r for r in await self._outgoing(program) if r in self.ontology.attributes]
        return self._attributes[program]

    # -- the tools ----------------------------------------------------------------------

    async def get_relations(self, variable: Variable | str) -> str:
        relations = await self.relations_of(self._subject("get_relations", variable))
        return f"Observation: [{', '.join(relations)}]"

    async def get_neighbors(self, variable: Variable | str, relation: Any) -> str:
        subject = self._subject("get_neighbors", variable)
        if not isinstance(relation, str) or relation not in await self.relations_of(subject):
            raise ToolError("get_neighbors: relation must be a relation of the variable")
        kind = self.ontology.range_of(relation)
        program = f"(JOIN (R {relation}) {subject})"
        return self._new(Variable(kind, program), f"Observation: variable ##, which are instances of {kind}")

    async def intersection(self, variable1: Variable | str, variable2: Variable | str) -> str:
        first, second = self._variable("intersection", variable1), self._variable("intersection", variable2)
        if first.type != second.type:
            raise ToolError("intersection: two variables must have the same type")
        program = f"(AND {first.program} {second.program})"
        return self._new(Variable(first.type, program), f"Observation: variable ##, which are instances of {first.type}")

    async def get_attributes(self, variable: Variable | str) -> str:
        attributes = await self.attributes_of(self._variable("get_attributes", variable).program)
        return f"Observation: [{', '.join(attributes)}]"

    async def _superlative(self, tool: str, variable: Variable | str, attribute: Any) -> str:
        var = self._variable(tool, variable)
        if not isinstance(attribute, str) or attribute not in await self.attributes_of(var.program):
            raise ToolError(f"{tool}: attribute must be an attribute of the variable")
        program = f"({tool.upper()} {var.program} {attribute})"
        return self._new(Variable(var.type, program), f"Observation: variable ##, which are instances of {var.type}")

    async def argmax(self, variable: Variable | str, attribute: Any) -> str:
        return await self._superlative("argmax", variable, attribute)

    async def argmin(self, variable: Variable | str, attribute: Any) -> str:
        return await self._superlative("argmin", variable, attribute)

    async def count(self, variable: Variable | str) -> str:
        var = self._variable("count", variable)
        return self._new(Variable(NUMBER_TYPE, f"(COUNT {var.program})"), "Observation: variable ##, which is a number")

    # -- the answer ---------------------------------------------------------------------

    async def execute(self, variable: Variable) -> set[str]:
        """The answers of a variable's program (a count gives its number as a string)."""
        rows = await self._select(lisp.to_sparql(variable.program, limit=self.max_results))
        return {row[0] for row in rows}
