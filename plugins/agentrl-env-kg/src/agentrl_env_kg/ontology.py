"""Schema knowledge the tools need: which names are relations or attributes, and range types.

Upstream (AgentBench ``api.py``) filters ``get_relations`` / ``get_attributes`` by the
relation and attribute lists of ``ontology/vocab.json`` and names the type of a
``get_neighbors`` result by the range of the relation in ``ontology/fb_roles``. The
``agentbench`` source uses exactly those files; the ``fb15k237`` source builds the same
three things for its own relation names (:mod:`agentrl_env_kg.fb15k237`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from attrs import field, frozen

DEFAULT_TYPE = "common.topic"


@frozen
class Ontology:
    relations: frozenset[str]
    attributes: frozenset[str]
    ranges: Mapping[str, str] = field(repr=False)

    def range_of(self, relation: str) -> str:
        # Upstream raises KeyError for a relation without a recorded range; every Freebase
        # topic is a common.topic, so that is the honest type to show instead.
        return self.ranges.get(relation, DEFAULT_TYPE)


def read_roles(path: Path) -> dict[str, tuple[str, str]]:
    """``fb_roles``: ``domain relation range`` per line -> {relation: (domain, range)}.

    One upstream line holds two records glued together (a newline is missing between
    ``type.int`` and the next domain); it is split back into both records.
    """
    roles: dict[str, tuple[str, str]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if len(fields) == 3:
                roles[fields[1]] = (fields[0], fields[2])
            elif len(fields) == 5:
                second_domain = fields[3].rsplit(".", 1)[0]
                if fields[2].endswith(second_domain):
                    roles[fields[1]] = (fields[0], fields[2][: -len(second_domain)])
                    roles[fields[3]] = (second_domain, fields[4])
    return roles


def read_reverse_properties(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) == 2 and parts[0] and parts[1]:
                out[parts[0]] = parts[1]
    return out


def read_supertypes(path: Path) -> dict[str, set[str]]:
    """``fb_types``: ``type meta.subclassOf super`` -> {type: {direct supertypes}}."""
    out: dict[str, set[str]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 3 and fields[1] == "meta.subclassOf":
                out.setdefault(fields[0], set()).add(fields[2])
    return out


def agentbench_ontology(vocab_path: Path, roles_path: Path) -> Ontology:
    with open(vocab_path, encoding="utf-8") as f:
        vocab = json.load(f)
    roles = read_roles(roles_path)
    return Ontology(
        relations=frozenset(vocab["relations"]),
        attributes=frozenset(vocab["attributes"]),
        ranges={rel: rng for rel, (_, rng) in roles.items()},
    )
