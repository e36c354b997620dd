"""GrailQA-style logical forms (s-expressions) and their translation to one SPARQL query.

A program is a nested s-expression over Freebase names, as in AgentBench::

    (AND biology.breed_temperament (JOIN (R biology.animal_breed.temperament) m.0km5c))
    (COUNT (JOIN (R film.film.genre) m.02l7c8))
    (ARGMAX (JOIN (R location.location.contains) m.0d05w3) topic_server.population_number)

Semantics (GrailQA): ``(JOIN r X)`` is ``{y : y r x, x in X}``; ``(JOIN (R r) X)`` is
``{y : x r y, x in X}``; ``(AND A B)`` intersects (``A`` may be a class name: "has type A");
``(COUNT X)`` is the number of elements; ``(ARGMAX X a)`` / ``(ARGMIN X a)`` are the elements
of ``X`` whose value of attribute ``a`` is the largest / smallest, *every* tied element
included (the superlative is a sub-query ``ORDER BY ... LIMIT 1`` joined on the value, as
upstream). The attribute may be a path ``(JOIN a b)``.

As upstream (``lisp_to_sparql``), the answer of a whole program never contains an entity
named in it, and literal answers are plain or English. The queries use only SPARQL 1.1 and
full IRIs under ``http://rdf.freebase.com/ns/``, so they run on Oxigraph and on Virtuoso
serving Freebase alike.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

NS = "http://rdf.freebase.com/ns/"
TYPE = "type.object.type"
NAME = "type.object.name"

Expr = str | list  # a token or a nested list of expressions

_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_ENTITY_RE = re.compile(r"^[mg]\.[A-Za-z0-9_]+$")
_SUPERLATIVES = {"ARGMAX": "DESC", "ARGMIN": "ASC"}


class LogicalFormError(ValueError):
    """A logical form that cannot be parsed or translated."""


def is_entity(token: object) -> bool:
    return isinstance(token, str) and bool(_ENTITY_RE.match(token))


def iri(name: str) -> str:
    """``<http://rdf.freebase.com/ns/name>``; refuses names that could break out of the IRI."""
    if not _NAME_RE.match(name):
        raise LogicalFormError(f"{name!r} is not a valid Freebase name")
    return f"<{NS}{name}>"


def parse(text: str) -> Expr:
    """Parse an s-expression into nested lists of tokens."""
    tokens = text.replace("(", " ( ").replace(")", " ) ").split()
    if not tokens:
        raise LogicalFormError("empty logical form")
    stack: list[list] = [[]]
    for tok in tokens:
        if tok == "(":
            stack.append([])
        elif tok == ")":
            if len(stack) == 1:
                raise LogicalFormError(f"unbalanced ')' in {text!r}")
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(tok)
    if len(stack) != 1 or len(stack[0]) != 1:
        raise LogicalFormError(f"malformed logical form {text!r}")
    return stack[0][0]


def unparse(expr: Expr) -> str:
    if isinstance(expr, str):
        return expr
    return "(" + " ".join(unparse(e) for e in expr) + ")"


def entities(expr: Expr) -> list[str]:
    """Entity ids (``m.`` / ``g.``) mentioned in a program, in order of appearance, unique."""
    seen: dict[str, None] = {}
    stack = [expr]
    while stack:
        e = stack.pop(0)
        if isinstance(e, str):
            if is_entity(e):
                seen.setdefault(e)
        else:
            stack[0:0] = list(e[1:])
    return list(seen)


def head(expr: Expr) -> str:
    return expr[0] if isinstance(expr, list) and expr and isinstance(expr[0], str) else ""


# ---------------------------------------------------------------------------------------
# Translation


class _Compiler:
    def __init__(self) -> None:
        self._ids = itertools.count()

    def fresh(self, stem: str = "v") -> str:
        return f"?{stem}{next(self._ids)}"

    def node(self, expr: Expr, var: str) -> list[str]:
        """Graph patterns that bind ``var`` to the elements of ``expr``."""
        if isinstance(expr, str):
            if is_entity(expr):
                return [f"VALUES {var} {{ {iri(expr)} }}"]
            raise LogicalFormError(f"{expr!r} is not a set expression (expected an entity or a (...) form)")
        op = head(expr)
        if op == "JOIN" and len(expr) == 3:
            return self.join(expr[1], expr[2], var)
        if op == "AND" and len(expr) == 3:
            left, right = expr[1], expr[2]
            out = [f"{var} {iri(TYPE)} {iri(left)} ."] if isinstance(left, str) and not is_entity(left) else self.node(left, var)
            return out + self.node(right, var)
        if op in _SUPERLATIVES and len(expr) == 3:
            return self.superlative(op, expr[1], expr[2], var)
        if op == "COUNT":
            raise LogicalFormError("COUNT can only be the outermost operator")
        raise LogicalFormError(f"unsupported form {unparse(expr)!r}")

    def join(self, relation: Expr, arg: Expr, var: str) -> list[str]:
        reverse = isinstance(relation, list) and head(relation) == "R" and len(relation) == 2
        name = relation[1] if reverse else relation
        if not isinstance(name, str):
            raise LogicalFormError(f"JOIN needs a relation or (R relation), got {unparse(relation)!r}")
        if is_entity(arg):
            other, patterns = iri(arg), []
        else:
            other = self.fresh()
            patterns = self.node(arg, other)
        triple = f"{other} {iri(name)} {var} ." if reverse else f"{var} {iri(name)} {other} ."
        return [triple, *patterns]

    def path(self, attribute: Expr, subject: str, value: str) -> list[str]:
        """Patterns linking ``subject`` to ``value`` through an attribute or a (JOIN a b) path."""
        hops = list(_path_hops(attribute))
        out, current = [], subject
        for i, (name, reverse) in enumerate(hops):
            nxt = value if i == len(hops) - 1 else self.fresh("c")
            out.append(f"{nxt} {iri(name)} {current} ." if reverse else f"{current} {iri(name)} {nxt} .")
            current = nxt
        return out

    def superlative(self, op: str, arg: Expr, attribute: Expr, var: str) -> list[str]:
        inner_var, best = self.fresh(), self.fresh("best")
        inner = " ".join(self.node(arg, inner_var) + self.path(attribute, inner_var, best))
        order = f"DESC({best})" if _SUPERLATIVES[op] == "DESC" else best
        sub = f"{{ SELECT {best} WHERE {{ {inner} }} ORDER BY {order} LIMIT 1 }}"
        # Joined on the extreme value itself (as upstream): every tied element is an answer.
        return [sub, *self.node(arg, var), *self.path(attribute, var, best)]


def _path_hops(attribute: Expr) -> Iterator[tuple[str, bool]]:
    if isinstance(attribute, str):
        yield attribute, False
        return
    op = head(attribute)
    if op == "R" and len(attribute) == 2 and isinstance(attribute[1], str):
        yield attribute[1], True
    elif op == "JOIN" and len(attribute) == 3:
        yield from _path_hops(attribute[1])
        yield from _path_hops(attribute[2])
    else:
        raise LogicalFormError(f"an attribute must be a name or a (JOIN a b) path, got {unparse(attribute)!r}")


PREFIX = f"PREFIX ns: <{NS}>\n"
_LANG_FILTER = "FILTER (!isLiteral(?x) || lang(?x) = '' || langMatches(lang(?x), 'en'))"


def _answer_patterns(expr: Expr) -> list[str]:
    patterns = _Compiler().node(expr, "?x")
    patterns.append(_LANG_FILTER)
    patterns.extend(f"FILTER (?x != {iri(e)})" for e in entities(expr))
    return patterns


def to_sparql(expr: Expr | str, *, limit: int | None = None) -> str:
    """One SELECT query for the answers of a program: ``?x`` (sets) or ``?count`` (COUNT)."""
    if isinstance(expr, str) and expr.lstrip().startswith("("):
        expr = parse(expr)
    if head(expr) == "COUNT":
        if len(expr) != 2:
            raise LogicalFormError("COUNT takes one argument")
        body = "\n".join(_answer_patterns(expr[1]))
        return f"{PREFIX}SELECT (COUNT(DISTINCT ?x) AS ?count) WHERE {{\n{body}\n}}"
    body = "\n".join(_answer_patterns(expr))
    tail = f"\nLIMIT {int(limit)}" if limit else ""
    return f"{PREFIX}SELECT DISTINCT ?x WHERE {{\n{body}\n}}{tail}"


def relations_query(expr: Expr | str) -> str:
    """Distinct predicates leaving the elements of a program's answer set (as upstream)."""
    if isinstance(expr, str) and expr.lstrip().startswith("("):
        expr = parse(expr)
    if is_entity(expr):
        return f"{PREFIX}SELECT DISTINCT ?r WHERE {{ {iri(expr)} ?r ?o . }}"
    if head(expr) == "COUNT":
        raise LogicalFormError("a count is a number and has no relations")
    inner = "\n".join(_answer_patterns(expr))
    return f"{PREFIX}SELECT DISTINCT ?r WHERE {{\n?x ?r ?o .\n{{ SELECT DISTINCT ?x WHERE {{\n{inner}\n}} }}\n}}"
