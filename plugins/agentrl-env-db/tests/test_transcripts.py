"""Replays of recorded AgentBench-FC episodes (tests/data/runs) with the lost turns restored, on SQLite."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from agentrl_env_db.config import DBConfig
from agentrl_env_db.env import DBEnvironment
from agentrl_env_db.transcripts import TranscriptError, _answer_key, read_runs, replay, summarize

RUNS = Path(__file__).with_name("data") / "runs"


def _replay_all(config: DBConfig, restore: bool = True):
    async def main():
        env = DBEnvironment(config)
        try:
            return {(t.model, t.index): await replay(env, t, restore_lost_turns=restore) for t in read_runs(RUNS)}
        finally:
            await env.aclose()

    return anyio.run(main)


def test_the_recorded_runs_are_read():
    found = {(t.model, t.index): t for t in read_runs(RUNS)}
    assert sorted(found) == [("ollama-gemma2-9b", 77), ("ollama-gemma2-9b", 288), ("ollama-qwen-4b", 115),
                             ("ollama-qwen-4b", 158)]
    assert found[("ollama-gemma2-9b", 288)].status == "completed" and found[("ollama-gemma2-9b", 288)].reward == 1.0
    assert found[("ollama-qwen-4b", 115)].split == "std" and len(found[("ollama-qwen-4b", 115)].messages) == 2
    with pytest.raises(TranscriptError, match="does not exist"):
        read_runs(RUNS / "missing")


def test_every_episode_agrees_with_the_lost_turns_restored():
    results = _replay_all(DBConfig())
    assert all(r.agrees and r.first_prompt_matches for r in results.values()), {
        k: (r.diverged_at, r.expected, r.got) for k, r in results.items() if not r.agrees}
    # 15 rounds: the log kept 1 of qwen-4b's and 2 of gemma2-9b's turns.
    assert results[("ollama-qwen-4b", 115)].lost_turns == 14
    assert results[("ollama-gemma2-9b", 77)].lost_turns == 13
    assert results[("ollama-gemma2-9b", 288)].lost_turns == 0 and results[("ollama-gemma2-9b", 288)].reward == 1.0
    summary = summarize(results.values())
    assert summary["episodes"] == summary["agree"] == summary["status_agrees"] == summary["reward_agrees"] == 4
    assert summary["agree_with_lost_turns_restored"] == 2 and summary["lost_turns_restored"] == 27


def test_trusting_the_log_misses_the_lost_turns():
    results = _replay_all(DBConfig(), restore=False)
    assert {k for k, r in results.items() if r.agrees} == {("ollama-gemma2-9b", 288), ("ollama-qwen-4b", 158)}
    # The plain replay repeats the last turn until the limit, so the outcome still agrees.
    assert all(r.status == r.transcript.status for r in results.values())


def test_strict_arguments_part_from_upstream_where_it_was_lenient():
    results = _replay_all(DBConfig(tool_arguments="strict"))
    won = results[("ollama-gemma2-9b", 288)]
    assert not won.agrees and not won.observations_agree and won.reward == 0.0
    assert won.diverged_at == 1 and won.expected == "[]" and "invalid arguments for execute_sql" in won.got
    assert results[("ollama-gemma2-9b", 77)].agrees  # schema-following turns are the same either way


def test_session_database_names_are_compared_as_one():
    upstream = {"role": "tool", "tool_call_id": "call_1",
                "content": "1146 (42S02): Table 'dbbench_2c218e04_f18e_4e43_aad4_54463c98c78b.table' doesn't exist"}
    ours = dict(upstream, content="1146 (42S02): Table 'agrl_0a7c9c_8707_tpix2q_xe.table' doesn't exist")
    assert _answer_key(upstream) == _answer_key(ours)
    assert _answer_key(upstream) != _answer_key(dict(ours, content=ours["content"].replace(".table", ".other")))
