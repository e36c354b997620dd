"""Question sets: AgentBench's files and the generated FB15k-237 set share one record shape.

Each record has the AgentBench keys: ``question``, ``qid``, ``source``, ``entities``
(``{mention: entity id}``), ``s_expression`` (the logical form), ``actions`` (the gold tool
sequence, e.g. ``get_neighbors(m.05t073s,biology.pedigreed_animal.breed)``) and ``answer``
(``[{answer_argument, answer_type, entity_name?}]``). The generated set adds ``split`` and
``template``.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attrs import field, frozen

from agentrl_env_kg.datafiles import AGENTBENCH_SPLITS, data_file

GENERATED = Path(__file__).parent / "generated" / "fb15k237_questions.jsonl.gz"
FB_SPLITS = ("fb-train", "fb-dev", "fb-test")
TOOL_PARAMS = {
    "get_relations": ("variable",),
    "get_neighbors": ("variable", "relation"),
    "intersection": ("variable1", "variable2"),
    "get_attributes": ("variable",),
    "argmax": ("variable", "attribute"),
    "argmin": ("variable", "attribute"),
    "count": ("variable",),
}
_ACTION_RE = re.compile(r"^\s*(\w+)\((.*)\)\s*$")


@frozen
class Question:
    qid: str
    question: str
    entities: Mapping[str, str]
    s_expression: str
    actions: tuple[str, ...]
    answer: tuple[Mapping[str, Any], ...] = field(repr=False)
    source: str = ""
    template: str = ""

    @property
    def gold(self) -> frozenset[str]:
        return frozenset(str(a["answer_argument"]) for a in self.answer)

    def prompt(self) -> str:
        """The user message, as upstream: the question, then the entity mentions."""
        return f"{self.question}\nEntities: [{', '.join(self.entities)}]"

    def tool_calls(self) -> list[tuple[str, dict[str, str]]]:
        """The gold actions as (tool, arguments), entity ids replaced by their mentions."""
        names = {eid: mention for mention, eid in self.entities.items()}
        return [(tool, {k: names.get(v, v) for k, v in args.items()}) for tool, args in map(parse_action, self.actions)]

    def to_json(self) -> dict[str, Any]:
        return {
            "qid": self.qid, "question": self.question, "entities": dict(self.entities),
            "s_expression": self.s_expression, "actions": list(self.actions),
            "answer": [dict(a) for a in self.answer], "source": self.source, "template": self.template,
        }


def parse_action(action: str) -> tuple[str, dict[str, str]]:
    """``get_neighbors(m.0km5c,biology.animal_breed.temperament)`` -> (tool, arguments)."""
    match = _ACTION_RE.match(action)
    if not match or match.group(1) not in TOOL_PARAMS:
        raise ValueError(f"not a gold action: {action!r}")
    tool, params = match.group(1), TOOL_PARAMS[match.group(1)]
    values = [v.strip() for v in match.group(2).split(",")]
    if len(values) != len(params):
        raise ValueError(f"{action!r}: {tool} takes {len(params)} argument(s)")
    return tool, dict(zip(params, values, strict=True))


def from_record(record: Mapping[str, Any]) -> Question:
    return Question(
        qid=str(record["qid"]),
        question=record["question"],
        entities=dict(record["entities"]),
        s_expression=record["s_expression"],
        actions=tuple(record.get("actions", ())),
        answer=tuple(record["answer"]),
        source=record.get("source", ""),
        template=record.get("template", ""),
    )


def load_agentbench(split: str, data_dir: str | None = None) -> list[Question]:
    with open(data_file(AGENTBENCH_SPLITS[split], data_dir), encoding="utf-8") as f:
        return [from_record(r) for r in json.load(f)]


def load_generated(path: str | Path | None = None) -> dict[str, list[Question]]:
    """The generated FB15k-237 splits, in file order."""
    sets: dict[str, list[Question]] = {s: [] for s in FB_SPLITS}
    with gzip.open(path or GENERATED, "rt", encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            sets[record["split"]].append(from_record(record))
    return sets


def write_generated(path: str | Path, splits: Mapping[str, Sequence[Question]]) -> None:
    """Deterministic bytes (fixed gzip mtime), so regeneration can be checked by sha256."""
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
        for split in FB_SPLITS:
            for q in splits.get(split, ()):
                line = json.dumps({"split": split, **q.to_json()}, ensure_ascii=False, sort_keys=True)
                gz.write(line.encode("utf-8") + b"\n")
