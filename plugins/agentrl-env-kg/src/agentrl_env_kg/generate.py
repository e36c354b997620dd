"""Generate GrailQA-style questions over a graph, reproducibly (``python -m agentrl_env_kg.generate``).

Templates (logical forms as in GrailQA / AgentBench):

* ``hop1``  ``(AND T (JOIN (R r) e))`` or ``(AND T (JOIN r' e))`` for a relation stored the other way
* ``hop2``  ``(AND T (JOIN (R r2) (JOIN (R r1) e)))`` (two hops, any directions)
* ``and``   ``(AND T (AND (JOIN (R r1) e1) (JOIN (R r2) e2)))`` (two branches of the same type)
* ``count`` ``(COUNT ...)`` over ``hop1`` or ``and``
* ``argmax`` / ``argmin`` over ``hop1`` sets whose members carry a numeric attribute;
  FB15k-237 has no literal attributes, so none are generated for it.

The answers are computed here in Python on the in-memory graph, with upstream's rule that
an entity named in the question is never an answer. Every question also carries the gold
tool sequence an agent would run. Entity mentions are entity names that are unique in the
graph. The generator sorts everything it iterates and draws from one seeded
``random.Random``, so the same graph and seed give the same file, byte for byte.

Splits: logical forms are deduplicated (``AND`` arguments in canonical order) before the
seeded shuffle that assigns ``fb-test``, ``fb-dev`` and ``fb-train``, so no test logical
form occurs in train.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from collections.abc import Mapping
from typing import Any, Protocol

import attrs

from agentrl_env_kg import lisp
from agentrl_env_kg.questions import FB_SPLITS, GENERATED, Question, write_generated

SEED = 20240817
TARGETS = {"hop1": 1200, "hop2": 1000, "and": 900, "count": 600, "argmax": 150, "argmin": 150}
SPLIT_SIZES = {"fb-test": 500, "fb-dev": 200}  # the rest is fb-train
MAX_ANSWERS = 10
MAX_INTERMEDIATE = 20
MAX_COUNT = 50


class GraphLike(Protocol):
    out: Mapping[str, Mapping[str, set[str]]]
    names: Mapping[str, str]
    schema: Mapping[str, Any]  # name -> RelationInfo(name, reverse, domain, range, forward)


def _words(name: str) -> str:
    last = name.split("..")[-1].rsplit(".", 1)[-1]
    for suffix in ("_reverse", "_s"):
        last = last.removesuffix(suffix)
    return last.replace("_", " ")


def _type_words(t: str) -> str:
    return t.rsplit(".", 1)[-1].replace("_", " ")


class Generator:
    def __init__(self, graph: GraphLike, *, seed: int = SEED, values: Mapping[str, Mapping[str, float]] | None = None):
        self.g = graph
        self.rng = random.Random(seed)
        self.values = values or {}
        counts = Counter(graph.names[e] for e in graph.out if e in graph.names)
        self.topics = sorted(e for e in graph.out if e in graph.names and counts[graph.names[e]] == 1)
        self.seen_forms: set[str] = set()
        self.seen_texts: set[str] = set()

    # -- building blocks ------------------------------------------------------------------

    def rels(self, entity: str) -> list[str]:
        return sorted(self.g.out.get(entity, {}))

    def step(self, relation: str, inner: lisp.Expr) -> list:
        """The logical form of one hop along ``relation`` (a tool-facing name) from ``inner``."""
        info = self.g.schema[relation]
        return ["JOIN", ["R", relation], inner] if info.forward else ["JOIN", info.reverse, inner]

    def phrase(self, relation: str, inner: str) -> str:
        info = self.g.schema[relation]
        if info.forward:
            return f"the {_words(relation)} of {inner}"
        return f"the {_type_words(info.range)} whose {_words(info.reverse)} is {inner}"

    def neighbors(self, entities: set[str] | list[str], relation: str) -> set[str]:
        out: set[str] = set()
        for e in entities:
            out |= self.g.out.get(e, {}).get(relation, set())
        return out

    def set_relations(self, members: set[str]) -> list[str]:
        return sorted({r for m in members for r in self.g.out.get(m, {})})

    # -- templates ------------------------------------------------------------------------

    def hop1(self, e: str, *, lo: int = 1, hi: int = MAX_ANSWERS):
        rels = self.rels(e)
        r = self.rng.choice(rels)
        answers = self.g.out[e][r] - {e}
        if not lo <= len(answers) <= hi:
            return None
        form = self.step(r, e)
        actions = [f"get_relations({e})", f"get_neighbors({e},{r})"]
        return form, self.g.schema[r].range, answers, actions, self.phrase(r, self.g.names[e]), [e]

    def hop2(self, e: str):
        r1 = self.rng.choice(self.rels(e))
        middle = self.g.out[e][r1]
        if not 1 <= len(middle) <= MAX_INTERMEDIATE:
            return None
        # get_relations(#0) looks at #0's members other than the topic entity, as upstream.
        candidates = [r for r in self.set_relations(middle - {e}) if r != self.g.schema[r1].reverse]
        if not candidates:
            return None
        r2 = self.rng.choice(candidates)
        answers = self.neighbors(middle, r2) - {e}
        if not 1 <= len(answers) <= MAX_ANSWERS:
            return None
        form = self.step(r2, self.step(r1, e))
        actions = [f"get_relations({e})", f"get_neighbors({e},{r1})", "get_relations(#0)", f"get_neighbors(#0,{r2})"]
        text = self.phrase(r2, self.phrase(r1, self.g.names[e]))
        return form, self.g.schema[r2].range, answers, actions, text, [e]

    def conjunction(self, e1: str, *, lo: int = 1, hi: int = MAX_ANSWERS):
        r1 = self.rng.choice(self.rels(e1))
        first = self.g.out[e1][r1]
        pivot = self.rng.choice(sorted(first))
        options = []
        for back in self.rels(pivot):
            r2 = self.g.schema[back].reverse
            if self.g.schema[r2].range != self.g.schema[r1].range:
                continue
            options.extend((r2, e2) for e2 in sorted(self.g.out[pivot][back]) if e2 in self.topic_set and e2 != e1)
        options = [(r2, e2) for r2, e2 in options if (r2, e2) != (r1, e1)]
        if not options:
            return None
        r2, e2 = self.rng.choice(options)
        second = self.g.out[e2][r2]
        answers = (first & second) - {e1, e2}
        if not lo <= len(answers) <= hi or len(answers) == max(len(first - {e1, e2}), len(second - {e1, e2})):
            return None  # empty, too large, or one branch alone already answers it
        b1, b2 = self.step(r1, e1), self.step(r2, e2)
        if lisp.unparse(b2) < lisp.unparse(b1):
            b1, b2, r1, r2, e1, e2 = b2, b1, r2, r1, e2, e1
        form = ["AND", b1, b2]
        actions = [f"get_relations({e1})", f"get_neighbors({e1},{r1})", f"get_relations({e2})",
                   f"get_neighbors({e2},{r2})", "intersection(#0,#1)"]
        text = f"{self.phrase(r1, self.g.names[e1])} and {self.phrase(r2, self.g.names[e2])}"
        return form, self.g.schema[r1].range, answers, actions, text, [e1, e2]

    @property
    def topic_set(self) -> set[str]:
        if not hasattr(self, "_topic_set"):
            self._topic_set = set(self.topics)
        return self._topic_set

    # -- assembling questions -----------------------------------------------------------

    def make(self, template: str, e: str) -> Question | None:
        if template == "hop1":
            built = self.hop1(e)
        elif template == "hop2":
            built = self.hop2(e)
        elif template == "and":
            built = self.conjunction(e)
        elif template == "count":
            built = self.conjunction(e, lo=1, hi=MAX_COUNT) if self.rng.random() < 0.5 else self.hop1(e, lo=2, hi=MAX_COUNT)
        else:
            return self.superlative(template, e)
        if built is None:
            return None
        form, typ, answers, actions, text, topics = built
        form = ["AND", typ, form]
        if template == "count":
            form = ["COUNT", form]
            last = len([a for a in actions if not a.startswith("get_relations")]) - 1
            actions = [*actions, f"count(#{last})"]
            question = f"how many {_type_words(typ)} are {text}?"
            answer = [{"answer_argument": str(len(answers)), "answer_type": "Value"}]
        else:
            question = f"which {_type_words(typ)} is {text}?"
            answer = [{"answer_argument": a, "answer_type": "Entity", "entity_name": self.g.names.get(a, a)}
                      for a in sorted(answers)]
        return self.accept(template, form, question, actions, answer, topics)

    def superlative(self, template: str, e: str) -> Question | None:
        built = self.hop1(e, lo=2, hi=MAX_COUNT)
        if built is None:
            return None
        form, typ, members, actions, text, topics = built
        attrs = sorted({a for m in members for a in self.values.get(m, {})})
        if not attrs:
            return None
        attr = self.rng.choice(attrs)
        scored = {m: self.values[m][attr] for m in members if attr in self.values.get(m, {})}
        if len(scored) < 2:
            return None
        best = (max if template == "argmax" else min)(scored.values())
        answers = {m for m, v in scored.items() if v == best}
        form = [template.upper(), ["AND", typ, form], attr]
        actions = [*actions, "get_attributes(#0)", f"{template}(#0,{attr})"]
        extreme = "largest" if template == "argmax" else "smallest"
        question = f"which {_type_words(typ)} is {text} and has the {extreme} {_words(attr)}?"
        answer = [{"answer_argument": a, "answer_type": "Entity", "entity_name": self.g.names.get(a, a)}
                  for a in sorted(answers)]
        return self.accept(template, form, question, actions, answer, topics)

    def accept(self, template, form, question, actions, answer, topics) -> Question | None:
        canonical = lisp.unparse(form)
        if canonical in self.seen_forms or question in self.seen_texts:
            return None
        self.seen_forms.add(canonical)
        self.seen_texts.add(question)
        return Question(
            qid="", question=question, entities={self.g.names[e]: e for e in topics},
            s_expression=canonical, actions=tuple(actions), answer=tuple(answer),
            source="fb15k237", template=template,
        )

    def generate(self, targets: Mapping[str, int] = TARGETS, *, max_tries: int = 200) -> list[Question]:
        made: list[Question] = []
        order = list(self.topics)
        for template in sorted(targets):
            self.rng.shuffle(order)
            count, position = 0, 0
            budget = targets[template] * max_tries
            while count < targets[template] and position < min(budget, len(order) * 4):
                q = self.make(template, order[position % len(order)])
                position += 1
                if q is not None:
                    made.append(q)
                    count += 1
        return made


def split(questions: list[Question], *, seed: int = SEED, sizes: Mapping[str, int] = SPLIT_SIZES) -> dict[str, list[Question]]:
    """Assign splits by a seeded shuffle; qids name the split and position."""
    rng = random.Random(seed + 1)
    order = list(questions)
    rng.shuffle(order)
    out: dict[str, list[Question]] = {}
    start = 0
    for name in ("fb-test", "fb-dev", "fb-train"):
        size = len(order) - start if name == "fb-train" else sizes[name]
        chunk = order[start : start + size]
        start += size
        out[name] = [attrs.evolve(q, qid=f"{name}-{i:05d}") for i, q in enumerate(chunk)]
    return {name: out[name] for name in FB_SPLITS}


def generate_fb15k237(data_dir: str | None = None, *, seed: int = SEED) -> dict[str, list[Question]]:
    from agentrl_env_kg.fb15k237 import Graph

    return split(Generator(Graph(data_dir), seed=seed).generate(), seed=seed)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(GENERATED))
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    splits = generate_fb15k237(seed=args.seed)
    write_generated(args.out, splits)
    for name, qs in splits.items():
        print(name, len(qs), dict(sorted(Counter(q.template for q in qs).items())))


if __name__ == "__main__":
    main()
