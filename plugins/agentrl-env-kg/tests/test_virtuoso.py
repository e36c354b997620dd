"""The ``sparql`` backend on a private Virtuoso gives exactly what the embedded store gives.

The session fixture (conftest.py) starts Debian's virtuoso-t on free ports with its own
folder and bulk-loads the bundled graph and the mini graph. CI replays every 50th
generated question; the full set is ``benchmarks/env_kg.py``.
"""

from __future__ import annotations

import anyio
import pytest
from agentrl_env_kg import lisp
from agentrl_env_kg.backends import EmbeddedBackend, SparqlBackend
from agentrl_env_kg.config import KGConfig
from agentrl_env_kg.env import KGEnvironment
from agentrl_env_kg.virtuoso import VirtuosoError, VirtuosoServer
from conftest import MINI_QUESTIONS, mini_ontology

from agentrl_core.env import assistant_tool_call
from agentrl_core.types import Status

pytestmark = pytest.mark.virtuoso
STRIDE = 50

PROBES = [  # mistakes and extra calls, replayed the same way on both backends
    ("get_relations", {"variable": "#0"}),
    ("get_attributes", {"variable": "#0"}),
    ("get_neighbors", {"variable": "#0", "relation": "no.such.relation"}),
    ("intersection", {"variable1": "#0", "variable2": "#0"}),
    ("count", {"variable": "#0"}),
]


async def transcript(env, split, index):
    """Gold calls, then the probes, then the oracle's final answer: every message back."""
    oracle = env.oracle(split, index)
    session = await env.open(split, index)
    out = []
    try:
        await session.start()
        for tool, args in [*oracle.calls, *PROBES]:
            out.append((await session.step(assistant_tool_call(tool, args))).messages)
        final = await session.step({"role": "assistant", "content": f"Final Answer: #{oracle.variables - 1}"})
        out.append((final.status.value, final.reward, final.metrics["score"]))
    finally:
        await session.close()
    return out


def test_same_tool_calls_same_results_on_the_bundled_graph(virtuoso):
    async def main():
        embedded = KGEnvironment()
        remote = KGEnvironment(KGConfig(backend="sparql", endpoint=virtuoso.endpoint))
        checked = 0
        for split, qs in embedded.questions.items():
            for index in range(0, len(qs), STRIDE):
                a = await transcript(embedded, split, index)
                b = await transcript(remote, split, index)
                assert a == b, qs[index].qid
                assert b[-1] == ("completed", 1.0, 1.0), qs[index].qid  # the oracle solves it on Virtuoso
                backend, _ = await remote.backend()
                rows = await backend.select(lisp.to_sparql(qs[index].s_expression))
                assert {r[0] for r in rows} == set(qs[index].gold)
                checked += 1
        await embedded.aclose()
        await remote.aclose()
        return checked

    assert anyio.run(main) == sum(-(-n // STRIDE) for n in (3000, 200, 500))


def test_mini_graph_superlatives_ties_and_counts_agree(virtuoso, mini_store):
    async def main():
        ontology = mini_ontology()
        embedded = KGEnvironment(questions={"mini": MINI_QUESTIONS}, backend=EmbeddedBackend(mini_store), ontology=ontology)
        remote = KGEnvironment(questions={"mini": MINI_QUESTIONS}, backend=SparqlBackend(virtuoso.endpoint), ontology=ontology)
        for index in range(len(MINI_QUESTIONS)):
            a, b = await transcript(embedded, "mini", index), await transcript(remote, "mini", index)
            assert a == b and b[-1] == ("completed", 1.0, 1.0)
        forms = [
            "(ARGMAX (JOIN film.film.directed_by m.mini_d1) film.film.initial_release_date)",
            "(ARGMIN (JOIN film.film.directed_by m.mini_d1) film.film.runtime)",
            "(COUNT (JOIN film.film.country m.mini_c1))",
        ]
        backend, _ = await remote.backend()
        results = [{r[0] for r in await backend.select(lisp.to_sparql(f))} for f in forms]
        assert results == [{"m.mini_f2", "m.mini_f3"}, {"m.mini_f3"}, {"3"}]
        await embedded.aclose()
        await remote.aclose()

    anyio.run(main)


def test_virtuoso_unreachable_is_a_task_error_not_an_agent_mistake(virtuoso):
    from agentrl_env_kg.backends import BackendError

    async def main():
        env = KGEnvironment(KGConfig(backend="sparql", endpoint=virtuoso.endpoint.replace(str(virtuoso.http_port), "9")))
        session = await env.open("fb-dev", 0)
        await session.start()
        with pytest.raises(BackendError, match="unreachable"):
            await session.step(assistant_tool_call("get_relations", {"variable": next(iter(env.questions["fb-dev"][0].entities))}))
        await session.close()
        await env.aclose()

    anyio.run(main)


def test_missing_binaries_fail_with_one_sentence(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(VirtuosoError, match="virtuoso-opensource-7-bin"):
        VirtuosoServer(tmp_path)


def test_status_of_a_replayed_episode_is_completed(virtuoso):
    async def main():
        from agentrl_core.env import play_episode

        env = KGEnvironment(KGConfig(backend="sparql", endpoint=virtuoso.endpoint))
        episode = await play_episode(env, "fb-test", 7, env.oracle("fb-test", 7))
        await env.aclose()
        return episode

    episode = anyio.run(main)
    assert episode.status is Status.COMPLETED and episode.reward == 1.0
