"""Logical forms -> one SPARQL query, checked on the mini graph with hand-computed answers."""

from __future__ import annotations

import pytest
from agentrl_env_kg import lisp


def answers(store, form):
    return {s[0].value.removeprefix(lisp.NS) for s in store.query(lisp.to_sparql(form))}


@pytest.mark.parametrize(
    ("form", "expected"),
    [
        # films Dana directed (JOIN r e = {y : y r e})
        ("(JOIN film.film.directed_by m.mini_d1)", {"m.mini_f1", "m.mini_f2", "m.mini_f3"}),
        # the same through the reverse relation (JOIN (R r) e = {y : e r y})
        ("(JOIN (R film.director.film) m.mini_d1)", {"m.mini_f1", "m.mini_f2", "m.mini_f3"}),
        # class constraint and conjunction
        ("(AND film.film (AND (JOIN film.film.directed_by m.mini_d1) (JOIN film.film.country m.mini_c1)))",
         {"m.mini_f1", "m.mini_f3"}),
        ("(AND location.country (JOIN film.film.directed_by m.mini_d1))", set()),
        # two hops: countries of Dana's films
        ("(JOIN (R film.film.country) (JOIN film.film.directed_by m.mini_d1))", {"m.mini_c1", "m.mini_c2"}),
        # ties: runtime 120 twice; release 2001-01-01 twice
        ("(ARGMAX (JOIN film.film.directed_by m.mini_d1) film.film.runtime)", {"m.mini_f1", "m.mini_f2"}),
        ("(ARGMIN (JOIN film.film.directed_by m.mini_d1) film.film.runtime)", {"m.mini_f3"}),
        ("(ARGMAX (JOIN film.film.directed_by m.mini_d1) film.film.initial_release_date)", {"m.mini_f2", "m.mini_f3"}),
        # the country of the shortest of Dana's films, through an attribute path (country -> film -> runtime)
        ("(ARGMIN (JOIN (R film.film.country) (JOIN film.film.directed_by m.mini_d1)) (JOIN (R film.film.country) film.film.runtime))",
         {"m.mini_c1"}),
        # entities of the program are never answers: Dana's films' directors = Dana -> nothing
        ("(JOIN (R film.film.directed_by) (JOIN film.film.directed_by m.mini_d1))", set()),
    ],
)
def test_set_forms(mini_store, form, expected):
    assert answers(mini_store, form) == expected


def test_count(mini_store):
    rows = list(mini_store.query(lisp.to_sparql("(COUNT (JOIN film.film.country m.mini_c1))")))
    assert [r[0].value for r in rows] == ["3"]  # Alpha, Gamma, Delta


def test_relations_query_of_a_program_excludes_its_entities(mini_store):
    query = lisp.relations_query("(JOIN (R film.film.directed_by) (JOIN film.film.directed_by m.mini_d1))")
    assert list(mini_store.query(query)) == []  # the only member would be Dana, who is excluded


def test_parse_unparse_roundtrip_and_entities():
    text = "(AND film.film (AND (JOIN film.film.directed_by m.mini_d1) (JOIN (R x.y.z) g.12ab)))"
    assert lisp.unparse(lisp.parse(text)) == text
    assert lisp.entities(lisp.parse(text)) == ["m.mini_d1", "g.12ab"]


@pytest.mark.parametrize(
    "bad",
    ["", "(JOIN a", "(JOIN a b))", "(COUNT (COUNT (JOIN r m.x)))", "(FOO m.x)", "(JOIN r> m.x)",
     "(JOIN r m.x} UNION {?x ?p ?o)"],
)
def test_malformed_forms_are_rejected(bad):
    with pytest.raises(lisp.LogicalFormError):
        lisp.to_sparql(bad if bad.startswith("(") else lisp.parse(bad))


def test_names_cannot_inject_sparql():
    with pytest.raises(lisp.LogicalFormError):
        lisp.iri("a> ?p ?o . <b")
    assert lisp.iri("film.film.release_date_s..film.film_regional_release_date.film_release_region").startswith("<http")
