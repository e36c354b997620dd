"""gen-train: deterministic, over dev tables std does not use; and the upstream train loader."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from collections import Counter

import anyio
from agentrl_env_db.config import DBConfig
from agentrl_env_db.env import DBEnvironment
from agentrl_env_db.gen import generate_records, usable_tables
from agentrl_env_db.scoring import compare_results
from agentrl_env_db.tasks import load_split

from agentrl_core.env import play_episode


def test_generation_is_deterministic_and_seeded():
    dev, std = load_split("dev"), load_split("std")
    first = generate_records(dev, std)
    again = generate_records(load_split("dev"), load_split("std"))
    assert first == again
    digest = hashlib.sha256(json.dumps(first, sort_keys=True).encode()).hexdigest()
    other = generate_records(dev, std, seed=1)
    assert hashlib.sha256(json.dumps(other, sort_keys=True).encode()).hexdigest() != digest
    assert len(first) == len(DBEnvironment().index_sets()["gen-train"]) == 426
    kinds = Counter(r["type"][0] for r in first)
    assert {"other", "counting", "INSERT", "UPDATE", "DELETE"} <= set(kinds)
    assert any(k.startswith("aggregation-") for k in kinds)


def test_never_touches_a_std_table():
    dev, std = load_split("dev"), load_split("std")
    used = usable_tables(dev, std)
    # The six dev tables left out: #5 (empty column name) and five that share rows with std.
    assert sorted(set(range(60)) - {t.index for t in used}) == [5, 12, 23, 43, 53, 58]
    assert len(used) == 54
    std_rows = {row for t in std for table in t.tables for row in table.rows}
    std_tables = {(t.tables[0].name, t.tables[0].rows) for t in std}
    env = DBEnvironment()
    for task in env._tasks["gen-train"]:
        (table,) = task.tables
        assert not std_rows & set(table.rows), task.index
        assert (table.name, table.rows) not in std_tables
        assert re.search(r"(FROM|INTO|UPDATE) `([^`]*)`", task.gold_sql).group(2) == table.name
        assert task.source.startswith("gen-train:dev/") and int(task.source.split("/")[1]) in {t.index for t in used}


def test_answers_come_from_executing_the_gold_sql():
    env = DBEnvironment()
    for task in env._tasks["gen-train"][:80]:
        if task.is_modification:
            continue
        conn = sqlite3.connect(":memory:")
        table = task.tables[0]
        conn.execute(f"CREATE TABLE `{table.name}` ({', '.join(f'`{c}` TEXT' for c in table.columns)})")
        conn.executemany(f"INSERT INTO `{table.name}` VALUES ({', '.join('?' * len(table.columns))})", table.rows)
        rows = conn.execute(task.gold_sql).fetchall()
        assert compare_results(str(rows), task.answer, task.kind), (task.index, rows, task.answer)


def test_renamed_tables_keep_questions_and_answers():
    dev, std = load_split("dev"), load_split("std")
    plain = generate_records(dev, std)
    renamed = generate_records(dev, std, rename_seed=0)
    assert renamed == generate_records(dev, std, rename_seed=0)  # deterministic
    assert len(renamed) == len(plain)
    real = {t.tables[0].name.casefold() for t in (*dev, *std)}
    names = [r["table"]["table_name"] for r in renamed]
    assert not {n.casefold() for n in names} & real  # never a real table's name
    assert len(set(names)) > 0.9 * len(names)  # a name per task, not per table
    styles = {(" " in n, "_" in n, n.islower()) for n in names}
    # dev's four styles: Title Words, snake_case, Title_Snake, CamelCase
    assert styles == {(True, False, False), (False, True, True), (False, True, False), (False, False, False)}
    for a, b in zip(plain, renamed, strict=True):
        old, new = a["table"]["table_name"], b["table"]["table_name"]
        assert b["table"]["table_info"] == a["table"]["table_info"] and b["type"] == a["type"]
        # the same question, answer and hash under the new name
        assert b["description"] == a["description"].replace(f"the {old} table", f"the {new} table")
        assert b["add_description"] == a["add_description"].replace(f"table is {old},", f"table is {new},")
        assert b.get("answer_md5") == a.get("answer_md5")
        if "sql" in a:
            assert b["label"] == a["label"] and b["sql"]["query"] == a["sql"]["query"].replace(f"`{old}`", f"`{new}`")
        else:
            assert b["label"] == [a["label"][0].replace(f"`{old}`", f"`{new}`")]
    other = [r["table"]["table_name"] for r in generate_records(dev, std, rename_seed=1)]
    assert sum(x == y for x, y in zip(names, other, strict=True)) < 0.05 * len(names)


def test_oracle_solves_renamed_tasks_and_the_config_key_reaches_them(tmp_path):
    from agentrl_core.config import load_config
    from agentrl_core.registry import Registry

    path = tmp_path / "db.yaml"
    path.write_text("tasks: [{env: db, split: gen-train}]\nenvironments:\n  db: {gen_train_rename_seed: 7}\n")
    registry = Registry()
    config = load_config(str(path), registry=registry)
    assert config.environment_config("db").gen_train_rename_seed == 7

    async def main():
        env = DBEnvironment(config.environment_config("db"))
        plain = DBEnvironment()
        rewards = []
        for index in range(0, 426, 17):  # every kind, modifications included
            task = env.task("gen-train", index)
            assert task.tables[0].name != plain.task("gen-train", index).tables[0].name
            assert f"`{task.tables[0].name}`" in task.gold_sql
            rewards.append((await play_episode(env, "gen-train", index, env.oracle("gen-train", index))).reward)
        await env.aclose()
        await plain.aclose()
        return rewards

    assert anyio.run(main) == [1.0] * len(range(0, 426, 17))


TRAIN_ROWS = [
    {"index": 0, "description": "What is the Score when the Team is Lions?", "label": ["21"],
     "create": {"database": "wikisql", "init": "wikisql_init.sql"},
     "table": {"table_name": "scores", "table_info": {"columns": [{"name": "Team", "type": "TEXT"},
                                                                 {"name": "Score", "type": "TEXT"}],
                                                     "rows": [["Lions", "21"], ["Bears", 14]]}},
     "evaluation": "", "example": "", "type": ["other"], "heads": ["Team", "Score"],
     "add_description": "The name of this table is scores, and the headers of this table are Team,Score.",
     "sql": {"query": "SELECT Score FROM scores WHERE Team = 'Lions'", "length": 44}, "source": "wikisql"},
    {"index": 1, "description": "Set the Score of the Bears to 17.", "label": ["UPDATE scores SET Score = '17' WHERE Team = 'Bears'"],
     "create": {"database": "wikisql", "init": "wikisql_init.sql"},
     "table": {"table_name": "scores", "table_info": {"columns": [{"name": "Team", "type": "TEXT"},
                                                                 {"name": "Score", "type": "TEXT"}],
                                                     "rows": [["Lions", "21"], ["Bears", "14"]]}},
     "evaluation": "", "example": "", "type": ["UPDATE"], "heads": ["Team", "Score"],
     "add_description": "", "source": "wikisql",
     # Filled in below: upstream's hash of the table after the update.
     "answer_md5": "[('%s',)]"},
]


def test_train_loader_reads_upstream_format(tmp_path):
    from agentrl_env_db.scoring import table_hash

    rows = [dict(r) for r in TRAIN_ROWS]
    rows[1]["answer_md5"] = rows[1]["answer_md5"] % table_hash([("Lions", "21"), ("Bears", "17")])
    path = tmp_path / "db_out_new.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    async def main():
        env = DBEnvironment(DBConfig(train_file=str(path)))
        assert env.index_sets()["train"] == [0, 1]
        task = env.task("train", 0)
        assert task.tables[0].rows[1] == ("Bears", "14")  # cells are str(cell), as upstream inserts them
        assert task.user_prompt().endswith("Question: What is the Score when the Team is Lions?\n")
        return [(await play_episode(env, "train", i, env.oracle("train", i))).reward for i in (0, 1)]

    assert anyio.run(main) == [1.0, 1.0]


def test_train_rows_on_sqlite_files(tmp_path):
    db_dir = tmp_path / "db_train" / "bird"
    db_dir.mkdir(parents=True)
    conn = sqlite3.connect(db_dir / "shop.sqlite")
    conn.execute("CREATE TABLE items (name TEXT, price TEXT)")
    conn.executemany("INSERT INTO items VALUES (?, ?)", [("pen", "2"), ("ink", "5")])
    conn.commit()
    conn.close()
    record = {"description": "What is the price of ink?", "label": ["5"], "user_sqlite": True,
              "create": {"database": "bird", "init": "shop.sqlite"},
              "table": {"table_name": "items", "table_info": {"columns": [{"name": "name"}, {"name": "price"}],
                                                              "rows": []}},
              "type": ["other"], "add_description": ""}
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(record) + "\n")

    async def main():
        env = DBEnvironment(DBConfig(train_file=str(path), train_db_dir=str(tmp_path / "db_train")))
        session = await env.open("train", 0)
        await session.start()
        from agentrl_core.env import assistant_tool_call

        step = await session.step(assistant_tool_call("execute_sql", {"query": "UPDATE items SET price = '6'"}))
        assert step.messages[0]["content"] == "[]"
        step = await session.step(assistant_tool_call("execute_sql", {"query": "SELECT price FROM items WHERE name = 'ink'"}))
        assert step.messages[0]["content"] == "[('6',)]"
        await session.close()

    anyio.run(main)
    # The session worked on a copy: the file is unchanged.
    assert sqlite3.connect(db_dir / "shop.sqlite").execute("SELECT price FROM items").fetchall() == [("2",), ("5",)]
