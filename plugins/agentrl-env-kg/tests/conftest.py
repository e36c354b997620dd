"""Shared fixtures: a private store cache, a hand-built mini graph, a private Virtuoso."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from agentrl_env_kg.backends import EmbeddedBackend
from agentrl_env_kg.lisp import NS
from agentrl_env_kg.ontology import Ontology
from agentrl_env_kg.questions import Question


@pytest.fixture(scope="session", autouse=True)
def kg_cache(tmp_path_factory) -> Path:
    """Stores built by the tests go to a session folder, never to the user's cache."""
    path = tmp_path_factory.mktemp("kg-cache")
    old = os.environ.get("AGENTRL_CACHE_DIR")
    os.environ["AGENTRL_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("AGENTRL_CACHE_DIR", None)
    else:
        os.environ["AGENTRL_CACHE_DIR"] = old


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# ---------------------------------------------------------------------------------------
# The mini graph: three films by Dana (two tied for the longest runtime, two tied for the
# latest release), one by Eli; countries Arland and Borduria; one genre. Both directions
# of every relation are stored, as in Freebase.

XSD = "http://www.w3.org/2001/XMLSchema#"
ENTITIES = {
    "m.mini_f1": ("Alpha", "film.film"),
    "m.mini_f2": ("Beta", "film.film"),
    "m.mini_f3": ("Gamma", "film.film"),
    "m.mini_f4": ("Delta", "film.film"),
    "m.mini_d1": ("Dana", "film.director"),
    "m.mini_d2": ("Eli", "film.director"),
    "m.mini_c1": ("Arland", "location.country"),
    "m.mini_c2": ("Borduria", "location.country"),
    "m.mini_g1": ("Drama", "film.film_genre"),
}
RELATIONS = {  # relation: (reverse, domain, range)
    "film.film.directed_by": ("film.director.film", "film.film", "film.director"),
    "film.film.country": ("location.country.films", "film.film", "location.country"),
    "film.film.genre": ("film.film_genre.films_in_this_genre", "film.film", "film.film_genre"),
}
EDGES = [
    ("m.mini_f1", "film.film.directed_by", "m.mini_d1"),
    ("m.mini_f2", "film.film.directed_by", "m.mini_d1"),
    ("m.mini_f3", "film.film.directed_by", "m.mini_d1"),
    ("m.mini_f4", "film.film.directed_by", "m.mini_d2"),
    ("m.mini_f1", "film.film.country", "m.mini_c1"),
    ("m.mini_f2", "film.film.country", "m.mini_c2"),
    ("m.mini_f3", "film.film.country", "m.mini_c1"),
    ("m.mini_f4", "film.film.country", "m.mini_c1"),
    ("m.mini_f1", "film.film.genre", "m.mini_g1"),
    ("m.mini_f4", "film.film.genre", "m.mini_g1"),
]
VALUES = [  # (entity, attribute, lexical value, datatype)
    ("m.mini_f1", "film.film.runtime", "120", "integer"),
    ("m.mini_f2", "film.film.runtime", "120", "integer"),
    ("m.mini_f3", "film.film.runtime", "90", "integer"),
    ("m.mini_f4", "film.film.runtime", "150", "integer"),
    ("m.mini_f1", "film.film.initial_release_date", "1999-05-01", "date"),
    ("m.mini_f2", "film.film.initial_release_date", "2001-01-01", "date"),
    ("m.mini_f3", "film.film.initial_release_date", "2001-01-01", "date"),
    ("m.mini_f4", "film.film.initial_release_date", "1990-01-01", "date"),
]


def mini_ntriples() -> str:
    lines = []
    for s, p, o in EDGES:
        reverse = RELATIONS[p][0]
        lines.append(f"<{NS}{s}> <{NS}{p}> <{NS}{o}> .")
        lines.append(f"<{NS}{o}> <{NS}{reverse}> <{NS}{s}> .")
    for e, (name, kind) in ENTITIES.items():
        lines.append(f'<{NS}{e}> <{NS}type.object.name> "{name}"@en .')
        lines.append(f"<{NS}{e}> <{NS}type.object.type> <{NS}{kind}> .")
        lines.append(f"<{NS}{e}> <{NS}type.object.type> <{NS}common.topic> .")
    for e, attr, value, dtype in VALUES:
        lines.append(f'<{NS}{e}> <{NS}{attr}> "{value}"^^<{XSD}{dtype}> .')
    return "\n".join(lines) + "\n"


def mini_ontology() -> Ontology:
    ranges = {}
    for rel, (rev, domain, rng) in RELATIONS.items():
        ranges[rel], ranges[rev] = rng, domain
    return Ontology(frozenset(ranges), frozenset({"film.film.runtime", "film.film.initial_release_date"}), ranges)


MINI_QUESTIONS = [
    # 0: Dana's films made in Arland -> Alpha, Gamma
    Question("mini-0", "which films did Dana direct in Arland?", {"Dana": "m.mini_d1", "Arland": "m.mini_c1"},
             "(AND film.film (AND (JOIN film.film.directed_by m.mini_d1) (JOIN film.film.country m.mini_c1)))",
             ("get_relations(m.mini_d1)", "get_neighbors(m.mini_d1,film.director.film)", "get_relations(m.mini_c1)",
              "get_neighbors(m.mini_c1,location.country.films)", "intersection(#0,#1)"),
             ({"answer_argument": "m.mini_f1", "answer_type": "Entity"}, {"answer_argument": "m.mini_f3", "answer_type": "Entity"})),
    # 1: the longest film by Dana -> Alpha and Beta (tied at 120)
    Question("mini-1", "what is Dana's longest film?", {"Dana": "m.mini_d1"},
             "(ARGMAX (JOIN film.film.directed_by m.mini_d1) film.film.runtime)",
             ("get_relations(m.mini_d1)", "get_neighbors(m.mini_d1,film.director.film)", "get_attributes(#0)",
              "argmax(#0,film.film.runtime)"),
             ({"answer_argument": "m.mini_f1", "answer_type": "Entity"}, {"answer_argument": "m.mini_f2", "answer_type": "Entity"})),
    # 2: how many countries have Dana's films been made in -> 2
    Question("mini-2", "in how many countries did Dana make films?", {"Dana": "m.mini_d1"},
             "(COUNT (JOIN (R film.film.country) (JOIN film.film.directed_by m.mini_d1)))",
             ("get_relations(m.mini_d1)", "get_neighbors(m.mini_d1,film.director.film)", "get_relations(#0)",
              "get_neighbors(#0,film.film.country)", "count(#1)"),
             ({"answer_argument": "2", "answer_type": "Value"},)),
]


@pytest.fixture
def mini_store():
    import pyoxigraph

    store = pyoxigraph.Store()
    store.load(mini_ntriples().encode(), format=pyoxigraph.RdfFormat.N_TRIPLES)
    return store


@pytest.fixture
def mini_backend(mini_store) -> EmbeddedBackend:
    return EmbeddedBackend(mini_store, timeout=10.0, threads=2)


@pytest.fixture
def mini_env(mini_backend):
    from agentrl_env_kg.env import KGEnvironment

    return KGEnvironment(questions={"mini": MINI_QUESTIONS}, backend=mini_backend, ontology=mini_ontology())


# ---------------------------------------------------------------------------------------
# A private Virtuoso holding the bundled graph and the mini graph


@pytest.fixture(scope="session")
def bundled_ntriples(tmp_path_factory) -> Path:
    from agentrl_env_kg.fb15k237 import Graph

    path = tmp_path_factory.mktemp("nt") / "fb15k237.nt"
    Graph().write_ntriples(path)
    return path


@pytest.fixture(scope="session")
def virtuoso(tmp_path_factory, bundled_ntriples):
    """Starts Virtuoso on free ports with its own folder, bulk-loads both graphs, stops it after."""
    from agentrl_env_kg.virtuoso import VirtuosoError, VirtuosoServer

    root = tmp_path_factory.mktemp("virtuoso")
    try:
        server = VirtuosoServer(root)
    except VirtuosoError as exc:
        pytest.fail(str(exc), pytrace=False)
    mini = root / "mini.nt"
    mini.write_text(mini_ntriples())
    with server:
        server.load([bundled_ntriples, mini])
        yield server
