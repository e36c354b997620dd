"""DB tasks: the upstream JSONL records, their index sets and the prompts built from them.

A record (``standard.jsonl``, ``dev.jsonl``, upstream ``db_out_new.jsonl``, or one that
:mod:`agentrl_env_db.gen` generates) holds ``description``, ``table`` (``table_name`` and
``table_info`` with ``columns`` and ``rows``), ``type`` (``[kind]``), ``add_description``,
and the answer: ``answer_md5`` for INSERT/UPDATE/DELETE, ``label`` (a list) otherwise.
Index ``i`` of a set is the ``i``-th line of its file, as upstream.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attrs import frozen

from agentrl_core.datafiles import locate
from agentrl_core.errors import EnvError

PACKAGE = "agentrl_env_db"
MODIFY_TYPES = ("INSERT", "DELETE", "UPDATE")

# sha256 of the shipped files (data/PROVENANCE.md lists the same sums).
SHIPPED = {
    "standard.jsonl": "cf8dec6fb8051f46e6171136824aaa8b8707c3affbb3185c0bad2b39bc6b71e2",
    "dev.jsonl": "eb941c58a7a5651357b19e46aa05070f6cd5a7d83ce70cefd24aa3581e1e1130",
}
SPLIT_FILES = {"std": "standard.jsonl", "dev": "dev.jsonl"}

# Samples no database accepts; left out of their index set (the other indices keep their
# upstream numbers). dev #5 has a column with an empty name: CREATE TABLE fails on MySQL.
EXCLUDED = {("dev", 5): "a column has an empty name, so CREATE TABLE fails on MySQL and MariaDB"}

SYSTEM_PROMPT = """I will ask you a question, then you should help me operate a MySQL database with SQL to answer the question.
You have to explain the problem and your solution to me and write down your thoughts.
After thinking and explaining thoroughly, every round you can choose to operate or to answer with the two specific tools provided.
If you should execute a SQL query, use the `execute_sql` function, Your SQL should be in one line.
Every time you can only execute one SQL statement. I will only execute the statement in the first SQL code block. Every time you write a SQL, I will execute it for you and give you the output.
If you are done operating, and you want to commit your final answer, then use the `commit_final_answer` function.
DO NOT use this tool unless you are sure about your answer. I expect an accurate and correct answer.
Your answer should be accurate. Your answer must be exactly the same as the correct answer.
If the question is about modifying the database, then after done operation, your answer field can be anything.
If your response cannot match any pattern I mentioned earlier, you will be judged as FAIL immediately.
You should always use the tools provided to submit your answer. Be careful not to write it in the content field.
Your input will be raw MySQL response, you have to deal with it by yourself."""


@frozen
class Table:
    name: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]  # every cell as str (upstream inserts str(cell))


@frozen
class DBTask:
    """One sample. ``answer`` is the label list (SELECT types) or the stored table hash."""

    split: str
    index: int
    kind: str  # type[0]: INSERT, UPDATE, DELETE, other, counting, aggregation-SUM, ...
    description: str
    add_description: str
    evidence: str
    tables: tuple[Table, ...]
    answer: Any
    gold_sql: str | None  # label[0] for modification tasks, sql.query otherwise
    source: str = ""
    sqlite_file: str | None = None  # upstream "user_sqlite" rows: <train_db_dir>/<database>/<init>
    gold_sql_runs: bool = False  # True when gold_sql is known to run (generated tasks)

    @property
    def is_modification(self) -> bool:
        return self.kind in MODIFY_TYPES

    def user_prompt(self) -> str:
        """The user message, built exactly as upstream's ``start_sample``."""
        text = ""
        if self.evidence:
            text += "Evidence about the question: " + self.evidence + "\n"
        if self.add_description:
            text += "Additional table information about the question: " + self.add_description + "\n"
        return text + "Question: " + self.description + "\n"


def task_from_record(record: Mapping[str, Any], split: str, index: int, *, db_dir: str | None = None) -> DBTask:
    """Build a task from one upstream record; a malformed record fails with its position."""
    where = f"db/{split}/{index}"
    try:
        kind = record["type"][0]
        raw_tables = record["table"] if isinstance(record["table"], list) else [record["table"]]
        tables = tuple(
            Table(
                name=str(t["table_name"]),
                columns=tuple(str(c["name"]) for c in t["table_info"]["columns"]),
                rows=tuple(tuple(str(cell) for cell in row) for row in t["table_info"]["rows"]),
            )
            for t in raw_tables
        )
        if kind in MODIFY_TYPES:
            answer = record.get("answer_md5")
            label = record.get("label") or [None]
            gold = label[0] if isinstance(label, list) else label
        else:
            answer = record.get("label")
            gold = (record.get("sql") or {}).get("query")
        sqlite_file = None
        if record.get("user_sqlite"):
            create = record["create"]
            sqlite_file = str(Path(db_dir or ".") / create["database"] / create["init"])
        return DBTask(
            split=split,
            index=index,
            kind=str(kind),
            description=str(record["description"]),
            add_description=str(record.get("add_description") or ""),
            evidence=str(record.get("evidence") or ""),
            tables=tables,
            answer=answer,
            gold_sql=gold,
            source=str(record.get("source") or ""),
            sqlite_file=sqlite_file,
            gold_sql_runs=bool(record.get("gold_sql_runs", False)),
        )
    except (KeyError, IndexError, TypeError) as exc:
        raise EnvError(f"{where}: malformed task record ({type(exc).__name__}: {exc})") from None


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSONL (or, for a ``.json`` file, a JSON list) file as upstream does."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        data = json.loads(text)
        if not isinstance(data, list):
            raise EnvError(f"{path}: expected a JSON list of task records")
        return data
    records = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise EnvError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
    return records


def shipped_path(split: str, data_dir: str | None = None) -> Path:
    name = SPLIT_FILES[split]
    return locate(name, package=PACKAGE, subdir="db", override=data_dir, sha256=SHIPPED[name])


def load_split(split: str, data_dir: str | None = None) -> list[DBTask]:
    """All tasks of ``std`` or ``dev`` in upstream order (excluded ones included)."""
    records = read_jsonl(shipped_path(split, data_dir))
    return [task_from_record(r, split, i) for i, r in enumerate(records)]


def load_train(path: str | Path, db_dir: str | None = None) -> list[DBTask]:
    """The upstream training file (``db_out_new.jsonl`` format) as index set ``train``."""
    path = Path(path)
    if not path.is_file():
        raise EnvError(
            f"environments.db.train_file {str(path)!r} does not exist; point it at upstream's db_out_new.jsonl"
        )
    return [task_from_record(r, "train", i, db_dir=db_dir) for i, r in enumerate(read_jsonl(path))]


def usable_indices(split: str, tasks: Sequence[DBTask]) -> list[int]:
    return [t.index for t in tasks if (split, t.index) not in EXCLUDED]
