"""Each tool's semantics on the hand-built mini graph (see conftest.py), through sessions."""

from __future__ import annotations

import json

import pytest
from agentrl_env_kg.api import final_answer_index

from agentrl_core.env import assistant_tool_call, play_episode
from agentrl_core.types import Status

pytestmark = pytest.mark.anyio


async def started(env, index=0):
    session = await env.open("mini", index)
    first = await session.start()
    return session, first


async def call(session, tool, **arguments):
    step = await session.step(assistant_tool_call(tool, arguments))
    assert len(step.messages) == 1 and step.messages[0]["role"] == "tool"
    return step.messages[0]["content"], step


async def answer(session, text):
    return await session.step({"role": "assistant", "content": text})


async def test_prompt_lists_question_and_entity_mentions(mini_env):
    session, first = await started(mini_env)
    assert [m["role"] for m in first.messages] == ["system", "user"]
    assert "maximum of 15 actions" in first.messages[0]["content"]
    assert first.messages[1]["content"] == "which films did Dana direct in Arland?\nEntities: [Dana, Arland]"
    await session.close()


async def test_relations_of_entity_by_mention_and_by_id(mini_env):
    session, _ = await started(mini_env)
    by_name, _ = await call(session, "get_relations", variable="Dana")
    by_id, _ = await call(session, "get_relations", variable="m.mini_d1")
    # names and types are not relations; attributes are not either; sorted
    assert by_name == by_id == "Observation: [film.director.film]"
    film_rels, _ = await call(session, "get_relations", variable="Arland")
    assert film_rels == "Observation: [location.country.films]"
    await session.close()


async def test_variables_are_numbered_and_typed_by_the_relation_range(mini_env):
    session, _ = await started(mini_env)
    first, _ = await call(session, "get_neighbors", variable="Dana", relation="film.director.film")
    assert first == "Observation: variable #0, which are instances of film.film"
    second, _ = await call(session, "get_neighbors", variable="#0", relation="film.film.country")
    assert second == "Observation: variable #1, which are instances of location.country"
    # relations of a variable: what its members have (films: directed_by, country, genre)
    rels, _ = await call(session, "get_relations", variable="#0")
    assert rels == "Observation: [film.film.country, film.film.directed_by, film.film.genre]"
    # the answer of #1 excludes nothing here: Arland and Borduria
    step = await answer(session, "Final Answer: #1")
    assert step.status is Status.COMPLETED and step.reward == 0.0
    assert step.metrics["predicted"] == 2
    await session.close()


async def test_get_neighbors_checks_the_relation_belongs_to_the_variable(mini_env):
    session, _ = await started(mini_env)
    text, step = await call(session, "get_neighbors", variable="Dana", relation="film.film.country")
    assert text == "Error processing tool call: get_neighbors: relation must be a relation of the variable"
    assert step.status is Status.RUNNING and step.metrics["tool_errors"] == 1
    text, _ = await call(session, "get_neighbors", variable="Dana", relation="film.film.runtime")  # an attribute
    assert text.endswith("relation must be a relation of the variable")
    # no variable was created by the failed calls
    text, _ = await call(session, "get_neighbors", variable="Dana", relation="film.director.film")
    assert "variable #0" in text
    await session.close()


async def test_intersection_needs_two_variables_of_the_same_type(mini_env):
    session, _ = await started(mini_env)
    await call(session, "get_neighbors", variable="Dana", relation="film.director.film")  # #0 films
    await call(session, "get_neighbors", variable="Arland", relation="location.country.films")  # #1 films
    await call(session, "get_neighbors", variable="#0", relation="film.film.country")  # #2 countries
    text, _ = await call(session, "intersection", variable1="#0", variable2="#2")
    assert text == "Error processing tool call: intersection: two variables must have the same type"
    text, _ = await call(session, "intersection", variable1="#0", variable2="Arland")
    assert text == "Error processing tool call: intersection: variable must be a variable"
    text, _ = await call(session, "intersection", variable1="#0", variable2="#1")
    assert text == "Observation: variable #3, which are instances of film.film"
    step = await answer(session, "Thought: done. Final Answer: #3")
    assert step.status is Status.COMPLETED and step.reward == 1.0 and step.metrics["score"] == 1.0
    await session.close()


async def test_argmax_and_argmin_keep_every_tied_entity(mini_env):
    session, _ = await started(mini_env, 1)
    await call(session, "get_neighbors", variable="Dana", relation="film.director.film")
    attrs, _ = await call(session, "get_attributes", variable="#0")
    assert attrs == "Observation: [film.film.initial_release_date, film.film.runtime]"
    text, _ = await call(session, "argmax", variable="#0", attribute="film.film.runtime")
    assert text == "Observation: variable #1, which are instances of film.film"
    await call(session, "argmin", variable="#0", attribute="film.film.runtime")  # #2: Gamma (90)
    await call(session, "argmax", variable="#0", attribute="film.film.initial_release_date")  # #3: Beta, Gamma
    text, _ = await call(session, "argmax", variable="#0", attribute="film.film.directed_by")
    assert text == "Error processing tool call: argmax: attribute must be an attribute of the variable"
    api = session.api
    assert await api.execute(api.variables[1]) == {"m.mini_f1", "m.mini_f2"}  # 120 and 120
    assert await api.execute(api.variables[2]) == {"m.mini_f3"}
    assert await api.execute(api.variables[3]) == {"m.mini_f2", "m.mini_f3"}  # both 2001-01-01
    step = await answer(session, "Final Answer: #1")
    assert step.reward == 1.0
    await session.close()


async def test_count_is_a_number_usable_only_as_the_answer(mini_env):
    session, _ = await started(mini_env, 2)
    await call(session, "get_neighbors", variable="Dana", relation="film.director.film")
    await call(session, "get_neighbors", variable="#0", relation="film.film.country")
    text, _ = await call(session, "count", variable="#1")
    assert text == "Observation: variable #2, which is a number"
    text, _ = await call(session, "get_relations", variable="#2")
    assert text == "Error processing tool call: get_relations: the variable is a number (a count), not a set of entities"
    text, _ = await call(session, "count", variable="Dana")
    assert text == "Error processing tool call: count: variable must be a variable"
    step = await answer(session, "Final Answer: #2")
    assert step.reward == 1.0 and step.metrics["predicted"] == 1
    await session.close()


async def test_answers_never_contain_the_question_entities(mini_env):
    session, _ = await started(mini_env)
    await call(session, "get_neighbors", variable="Dana", relation="film.director.film")  # films
    await call(session, "get_neighbors", variable="#0", relation="film.film.directed_by")  # back to Dana
    assert await session.api.execute(session.api.variables[1]) == set()  # Dana is excluded, as upstream
    await session.close()


async def test_f1_score_for_a_partly_right_answer(mini_env):
    session, _ = await started(mini_env)  # gold: Alpha, Gamma
    await call(session, "get_neighbors", variable="Dana", relation="film.director.film")  # Alpha, Beta, Gamma
    step = await answer(session, "Final Answer: #0")
    assert step.reward == 0.0
    assert step.metrics["score"] == pytest.approx(0.8)  # precision 2/3, recall 1: 2*(2/3)/(5/3)
    await session.close()


async def test_malformed_calls_get_error_observations(mini_env):
    session, _ = await started(mini_env)
    text, _ = await call(session, "get_relations", variable="#4")
    assert text == "Error processing tool call: variable #4 does not exist (variables so far: none yet)"
    text, _ = await call(session, "get_relations", variable="#x")
    assert "not a variable" in text
    text, _ = await call(session, "get_relations", variable="Nobody")
    assert text == "Error processing tool call: get_relations: variable must be a variable or an entity"
    bad_json = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_relations", "arguments": "{oops"}}]}
    step = await session.step(bad_json)
    assert step.messages[0]["role"] == "tool" and "not valid JSON" in step.messages[0]["content"]
    step = await session.step(assistant_tool_call("get_neighbors", {"variable": "Dana"}))
    assert "missing required argument 'relation'" in step.messages[0]["content"]
    step = await session.step(assistant_tool_call("union", {"variable1": "#0", "variable2": "#1"}))
    assert "unknown tool 'union'" in step.messages[0]["content"]
    assert step.status is Status.RUNNING and step.metrics["invalid_turns"] == 3
    await session.close()


async def test_every_tool_call_of_a_turn_runs(mini_env):
    session, _ = await started(mini_env)
    calls = [
        {"id": "a", "type": "function", "function": {"name": "get_neighbors",
         "arguments": json.dumps({"variable": "Dana", "relation": "film.director.film"})}},
        {"id": "b", "type": "function", "function": {"name": "nope", "arguments": "{}"}},
        {"id": "c", "type": "function", "function": {"name": "get_neighbors",
         "arguments": json.dumps({"variable": "Arland", "relation": "location.country.films"})}},
    ]
    step = await session.step({"role": "assistant", "content": "", "tool_calls": calls})
    assert [m["tool_call_id"] for m in step.messages] == ["a", "b", "c"]
    assert "variable #0" in step.messages[0]["content"] and "variable #1" in step.messages[2]["content"]
    assert step.metrics["rounds"] == 1
    await session.close()


async def test_text_without_final_answer_continues(mini_env):
    session, _ = await started(mini_env)
    step = await answer(session, "I think the answer is Alpha.")
    assert step.status is Status.RUNNING
    assert step.messages == [{"role": "user", "content": "No valid function calls found! Need to recheck the function calls."}]
    assert step.metrics["invalid_turns"] == 1
    await session.close()


async def test_final_answer_naming_an_unknown_variable_fails_validation(mini_env):
    session, _ = await started(mini_env)
    await call(session, "get_neighbors", variable="Dana", relation="film.director.film")
    step = await answer(session, "Final Answer: #3")
    assert step.status is Status.AGENT_VALIDATION_FAILED and step.reward == 0.0
    await session.close()


async def test_round_limit_is_fifteen(mini_env):
    session, _ = await started(mini_env)
    for i in range(15):
        _, step = await call(session, "get_relations", variable="Dana")
        assert step.finish == (i == 14)
    assert step.status is Status.TASK_LIMIT_REACHED
    await session.close()


@pytest.mark.parametrize("index", [0, 1, 2])
async def test_oracle_solves_the_mini_questions(mini_env, index):
    episode = await play_episode(mini_env, "mini", index, mini_env.oracle("mini", index))
    assert episode.status is Status.COMPLETED and episode.reward == 1.0


def test_final_answer_parsing_as_upstream():
    assert final_answer_index("Thought: ok.\nFinal Answer: #12") == 12
    assert final_answer_index("Find Answer: #2") == 2
    assert final_answer_index("Final Answer: #1\nObservation: Final Answer: #3") == 1
    assert final_answer_index("Observation: Final Answer: #3") is None
    assert final_answer_index("Final Answer: 3") is None
    assert final_answer_index(None) is None
