"""The agentbench source: upstream's index sets, gold actions, and one episode end to end.

Real AgentBench episodes need Freebase (a Virtuoso endpoint of about 53 GB). Here the
first ``std`` question runs on a hand-built Freebase fragment that holds exactly the facts
its gold actions touch, loaded through ``graph_files`` into the embedded store.
"""

from __future__ import annotations

import json

import anyio
from agentrl_env_kg.api import KGApi
from agentrl_env_kg.config import KGConfig
from agentrl_env_kg.datafiles import AGENTBENCH_SPLITS, data_file
from agentrl_env_kg.env import KGEnvironment
from agentrl_env_kg.lisp import NS
from agentrl_env_kg.questions import TOOL_PARAMS, load_agentbench

from agentrl_core.env import play_episode
from agentrl_core.types import Status


def test_index_i_is_upstream_index_i():
    for split, relpath in AGENTBENCH_SPLITS.items():
        with open(data_file(relpath)) as f:
            raw = json.load(f)
        questions = load_agentbench(split)
        assert [q.qid for q in questions] == [r["qid"] for r in raw]
        assert [q.gold for q in questions] == [frozenset(str(a["answer_argument"]) for a in r["answer"]) for r in raw]


def test_every_gold_action_is_a_valid_tool_call():
    total = 0
    for split in AGENTBENCH_SPLITS:
        for q in load_agentbench(split):
            calls = q.tool_calls()
            created = 0
            for tool, args in calls:
                assert set(args) == set(TOOL_PARAMS[tool])
                for value in args.values():
                    if value.startswith("#"):
                        assert int(value[1:]) < created, (q.qid, tool, args)  # only existing variables
                created += tool not in ("get_relations", "get_attributes")
            assert created >= 1
            total += len(calls)
    assert total == 1024 + 138 + 8354  # actions in std, dev and train (counted by tool name in the files)


def _fragment(tmp_path):
    ns = lambda x: f"<{NS}{x}>"  # noqa: E731
    facts = [
        ("m.05t073s", "biology.pedigreed_animal.breed", "m.0test_breed"),
        ("m.0test_breed", "biology.animal_breed.temperament", "m.04kqpjd"),
        ("m.0test_breed", "biology.animal_breed.temperament", "m.04kpkld"),
        ("m.0test_breed", "biology.animal_breed.temperament", "m.0test_lazy"),
        ("m.0km5c", "biology.animal_breed.temperament", "m.04kqpjd"),
        ("m.0km5c", "biology.animal_breed.temperament", "m.04kpkld"),
        ("m.0km5c", "biology.animal_breed.temperament", "m.0test_loud"),
    ]
    path = tmp_path / "fragment.nt"
    path.write_text("".join(f"{ns(s)} {ns(p)} {ns(o)} .\n" for s, p, o in facts))
    return path


def test_first_std_question_end_to_end_on_a_freebase_fragment(tmp_path):
    config = KGConfig(source="agentbench", graph_files=[str(_fragment(tmp_path))], store_path=str(tmp_path / "store"))

    async def main():
        env = KGEnvironment(config)
        q = env.question("std", 0)
        assert q.entities == {"first dog": "m.05t073s", "german shepherds": "m.0km5c"}
        episode = await play_episode(env, "std", 0, env.oracle("std", 0))
        wrong = await play_episode(env, "std", 0, env.oracle("std", 0, error_rate=1.0, seed=3))
        await env.aclose()
        return episode, wrong

    episode, wrong = anyio.run(main)
    assert episode.status is Status.COMPLETED and episode.reward == 1.0
    tool_calls = [m["tool_calls"][0]["function"] for m in episode.messages if m.get("tool_calls")]
    assert json.loads(tool_calls[0]["arguments"]) == {"variable": "first dog"}  # mentions, not ids
    observations = [m["content"] for m in episode.messages if m["role"] == "tool"]
    assert observations[1] == "Observation: variable #0, which are instances of biology.animal_breed"  # range from fb_roles
    assert wrong.reward == 0.0  # with error_rate 1 the oracle answers an earlier variable


def test_agentbench_relations_are_filtered_by_upstream_vocab(tmp_path):
    from agentrl_env_kg.graphs import ontology_for

    onto = ontology_for(KGConfig(source="agentbench"))
    assert "biology.animal_breed.temperament" in onto.relations
    assert "type.object.name" not in onto.relations and "time.event.end_date" in onto.attributes
    assert len(onto.relations) == 13100 and len(onto.attributes) == 3384
    assert KGApi  # the tools use exactly these lists (see test_tools.py for the semantics)
