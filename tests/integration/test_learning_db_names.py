"""The DB learning benchmark's diagnostic: which table the model's SQL names, by hand.

``benchmarks/learning_db.py`` reports, per evaluation task, the share of episodes whose SQL
names the question's own table, a training table instead (written from memory), some other
name, or no SQL at all; the README explains a missed target with it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from learning_db import FULL, sql_queries, table_names  # noqa: E402


def sql(query: str) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "execute_sql", "arguments": json.dumps({"query": query})}}]}


def episode(task: str, index: int, *messages: dict, status: str = "completed") -> dict:
    return {"task": task, "index": index, "status": status, "messages": [{"role": "user", "content": "q"}, *messages]}


def test_sql_queries_reads_execute_sql_calls_only():
    broken = {"role": "assistant", "tool_calls": [{"function": {"name": "execute_sql", "arguments": "{not json"}}]}
    commit = {"role": "assistant", "tool_calls": [{"function": {"name": "commit_final_answer",
                                                                "arguments": {"answers": ["x"]}}}]}
    as_dict = {"role": "assistant", "tool_calls": [{"function": {"name": "execute_sql", "arguments": {"query": "B"}}}]}
    tool = {"role": "tool", "tool_calls": [{"function": {"name": "execute_sql", "arguments": {"query": "C"}}}]}
    assert sql_queries([sql("A"), broken, commit, as_dict, tool]) == ["A", "B"]


def test_table_names_sorts_episodes_by_the_table_their_sql_names():
    # dev #1's table is race_results; dev #0's is "US Ambassadors and Envoy Extraordinary to Colombia";
    # race_results is also a training table (gen-train is generated over dev's tables).
    episodes = [
        episode("dev", 1, sql("SELECT COUNT(*) FROM `Race_Results`")),  # its own table, in another case
        episode("dev", 0, sql("SELECT * FROM `race_results`")),  # a training table, not its own
        episode("dev", 0, sql("SELEC x"), sql("SELECT x FROM `US Ambassadors and Envoy Extraordinary to Colombia`")),
        episode("gen-heldout", 350, sql("SELECT * FROM `Zorp`")),  # a name that is no table
        episode("gen-heldout", 351, {"role": "assistant", "content": "no tool call"}),
        episode("gen-heldout", 352, sql("SELECT * FROM `Zorp`"), status="task error"),  # not counted
        episode("calc", 3, sql("SELECT 1")),  # another task: not counted
    ]
    assert table_names(episodes, FULL) == {
        "dev": {"episodes": 3, "own_table": 2 / 3, "training_table": 1 / 3, "other_name": 0.0, "no_sql": 0.0},
        "gen-heldout": {"episodes": 2, "own_table": 0.0, "training_table": 0.0, "other_name": 0.5, "no_sql": 0.5},
    }
