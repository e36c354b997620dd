"""The bundled FB15k-237 graph as Freebase-shaped RDF.

FB15k-237 holds 310,116 real Freebase triples over 14,541 entities (MIDs) and 237
relations, in one direction each. AgentBench's tools only follow relations *leaving* a
variable (Freebase stores most properties in both directions), so the graph is written
with both directions:

* a relation path ``/people/person/nationality`` becomes ``people.person.nationality``; a
  CVT-collapsed path ``/film/film/release_date_s./film/film_regional_release_date/film_release_region``
  becomes ``film.film.release_date_s..film.film_regional_release_date.film_release_region``
  (the two Freebase properties joined by ``..``);
* every triple ``h r t`` also gives ``t reverse(r) h``; the reverse of a property is its
  Freebase reverse property from ``ontology/reverse_properties`` where there is one, else
  ``<property>_reverse``; a path is reversed hop by hop;
* entity names become ``type.object.name`` (``@en``); entity types (``type.object.type``)
  are derived from the bundled ontology: the domain and range (``fb_roles``) of the
  relations an entity takes part in, their supertypes (``fb_types``), and ``common.topic``.

There are no literal-valued attributes in FB15k-237, so ``get_attributes`` finds none here.
"""

from __future__ import annotations

import gzip
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path

from attrs import frozen

from agentrl_env_kg import ontology
from agentrl_env_kg.datafiles import data_file
from agentrl_env_kg.lisp import NAME, NS, TYPE
from agentrl_env_kg.ontology import DEFAULT_TYPE, Ontology

TRIPLES = "fb15k237/fb15k237_triples.tsv.gz"
NAMES = "fb15k237/kgbert/entity2text.txt"
ROLES = "agentbench/ontology/fb_roles"
REVERSE = "agentbench/ontology/reverse_properties"
TYPES = "agentbench/ontology/fb_types"
SOURCE_FILES = (TRIPLES, NAMES, ROLES, REVERSE, TYPES)
# Bump when the RDF written below changes, so persisted stores are rebuilt.
GRAPH_VERSION = 1


@frozen
class RelationInfo:
    name: str
    reverse: str
    domain: str
    range: str
    forward: bool  # True for the direction FB15k-237 stores


def mid(freebase_path: str) -> str:
    """``/m/027rn`` -> ``m.027rn``."""
    return freebase_path.strip("/").replace("/", ".")


def _segments(path: str) -> list[str]:
    return [part.strip("/").replace("/", ".") for part in path.split("./")]


def build_schema(paths: Iterable[str], roles: dict[str, tuple[str, str]], reverse_props: dict[str, str]) -> dict[str, RelationInfo]:
    """Forward and reverse relation names with their domain and range types."""

    def seg_types(segs: list[str]) -> list[tuple[str, str]]:
        out = []
        for i, seg in enumerate(segs):
            if seg in roles:
                out.append(roles[seg])
                continue
            domain = seg.rsplit(".", 1)[0]  # a Freebase property is named <type>.<property>
            nxt = segs[i + 1] if i + 1 < len(segs) else None
            rng = (roles[nxt][0] if nxt in roles else nxt.rsplit(".", 1)[0]) if nxt else DEFAULT_TYPE
            out.append((domain, rng))
        return out

    def seg_reverse(seg: str) -> str:
        rev = reverse_props.get(seg)
        return rev if rev and reverse_props.get(rev) == seg else f"{seg}_reverse"

    schema: dict[str, RelationInfo] = {}
    for path in sorted(set(paths)):
        segs = _segments(path)
        types = seg_types(segs)
        name = "..".join(segs)
        reverse = "..".join(seg_reverse(s) for s in reversed(segs))
        domain, rng = types[0][0], types[-1][1]
        for info in (RelationInfo(name, reverse, domain, rng, True), RelationInfo(reverse, name, rng, domain, False)):
            known = schema.get(info.name)
            if known is not None and known.reverse != info.reverse:
                raise ValueError(f"relation {info.name} would have two reverses: {known.reverse}, {info.reverse}")
            if known is None or info.forward:
                schema[info.name] = info
    return schema


def read_triples(path: Path) -> Iterator[tuple[str, str, str]]:
    """(head MID, FB15k-237 relation path, tail MID) for all splits of the dataset."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        header = f.readline().rstrip("\n").split("\t")
        if header != ["split", "head", "relation", "tail"]:
            raise ValueError(f"{path}: unexpected header {header}")
        for line in f:
            _, h, r, t = line.rstrip("\n").split("\t")
            yield mid(h), r, mid(t)


def read_names(path: Path) -> dict[str, str]:
    names = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            key, _, name = line.rstrip("\n").partition("\t")
            if key and name:
                names[mid(key)] = name.strip()
    return names


class Graph:
    """The closed (both directions) graph in memory: used to build RDF and to generate questions."""

    def __init__(self, data_dir: str | None = None) -> None:
        files = {rel: data_file(rel, data_dir) for rel in SOURCE_FILES}
        triples = list(read_triples(files[TRIPLES]))
        roles = ontology.read_roles(files[ROLES])
        self.schema = build_schema((r for _, r, _ in triples), roles, ontology.read_reverse_properties(files[REVERSE]))
        self.out: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        for h, r, t in triples:
            info = self.schema["..".join(_segments(r))]
            self.out[h][info.name].add(t)
            self.out[t][info.reverse].add(h)
        self.out = {e: {r: set(v) for r, v in rels.items()} for e, rels in self.out.items()}
        all_names = read_names(files[NAMES])
        self.names = {e: all_names[e] for e in self.out if e in all_names}
        self.types = self._derive_types(ontology.read_supertypes(files[TYPES]))
        self.num_source_triples = len(triples)

    def _derive_types(self, supertypes: dict[str, set[str]]) -> dict[str, set[str]]:
        def closure(t: str) -> set[str]:
            seen, todo = set(), [t]
            while todo:
                cur = todo.pop()
                if cur not in seen:
                    seen.add(cur)
                    todo.extend(supertypes.get(cur, ()))
            return seen

        cache: dict[str, set[str]] = {}
        types: dict[str, set[str]] = {}
        for e, rels in self.out.items():
            direct = {DEFAULT_TYPE}
            for r in rels:
                direct.add(self.schema[r].domain)
            for t in direct.copy():
                direct |= cache.setdefault(t, closure(t))
            types[e] = direct
        # Ranges need no extra pass: an object of r is the subject of reverse(r), whose domain is range(r).
        return types

    def ontology(self) -> Ontology:
        return Ontology(
            relations=frozenset(self.schema),
            attributes=frozenset(),
            ranges={name: info.range for name, info in self.schema.items()},
        )

    def neighbors(self, entities: Iterable[str], relation: str) -> set[str]:
        out: set[str] = set()
        for e in entities:
            out |= self.out.get(e, {}).get(relation, set())
        return out

    def triples(self) -> Iterator[tuple[str, str, str | tuple[str]]]:
        """All RDF statements as (subject, predicate, object); a 1-tuple object is a literal."""
        for e in sorted(self.out):
            for r in sorted(self.out[e]):
                for t in sorted(self.out[e][r]):
                    yield e, r, t
            if e in self.names:
                yield e, NAME, (self.names[e],)
            for t in sorted(self.types[e]):
                yield e, TYPE, t

    def write_ntriples(self, path: Path) -> int:
        n = 0
        with open(path, "w", encoding="utf-8") as f:
            for s, p, o in self.triples():
                obj = f'"{_escape(o[0])}"@en' if isinstance(o, tuple) else f"<{NS}{o}>"
                f.write(f"<{NS}{s}> <{NS}{p}> {obj} .\n")
                n += 1
        return n


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
