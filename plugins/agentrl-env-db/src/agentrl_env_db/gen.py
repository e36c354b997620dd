"""Index set ``gen-train``: tasks generated deterministically over real ``dev`` tables.

Upstream's training file (db_out_new.jsonl) is not available, so training tasks are made
from the tables of ``dev.jsonl`` that ``std`` does not use: a dev table is left out when it
shares any row with any ``std`` table, or when MySQL would reject it (empty or duplicate
column names). That leaves 54 of the 60 tables; no generated task reads or writes a
``std`` table, and each session holds only its own table.

Per table, up to ``per_table`` tasks in a fixed rotation of kinds, as upstream names them:
``other`` (look a value up), ``counting``, ``aggregation-SUM/AVG/MIN/MAX``, ``ranking``,
``comparison``, ``INSERT``, ``UPDATE`` and ``DELETE``. The gold SQL of every task runs on
MySQL and SQLite alike; answers are computed by executing it on an in-memory SQLite copy
of the table, and the expected hash of a modification task is upstream's table MD5 after
executing it. Values are picked so that both engines agree: a lookup value matches its rows
only, also under MySQL's case- and accent-insensitive collations; numeric work uses
columns whose every cell is a plain decimal number (``col + 0`` compares them as numbers
on both engines); values with quotes or backslashes are never used.

With ``rename_seed`` (config ``gen_train_rename_seed``) every task's table gets a made-up name
of its own, drawn with that seed in the styles of dev's names (``Harbor Festival Results``,
``chess_club_roster``, ``Volcano_Survey``, ``RegionalBirdCensus``); the questions, rows, answers
and hashes stay those of the source table. A model trained on the training tables' own names
can write them from memory instead of reading the question; under new names per task and per
seed, only reading works. A made-up name never equals a ``std`` or ``dev`` table's name.

``python -m agentrl_env_db.gen --out tasks.jsonl`` writes the set in upstream's format.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from agentrl_env_db.scoring import table_hash
from agentrl_env_db.sqlite_backend import connect_memory, load_tables
from agentrl_env_db.sqlite_compat import fold
from agentrl_env_db.tasks import DBTask, Table, task_from_record

SPLIT = "gen-train"
_NUMBER = re.compile(r"-?\d+(\.\d+)?")
# The rotation of kinds per table; "numeric" picks one numeric kind, or a lookup without one.
SLOTS = ("other", "INSERT", "UPDATE", "numeric", "counting", "DELETE", "UPDATE", "INSERT",
         "numeric", "other", "DELETE", "numeric", "counting", "UPDATE", "INSERT", "other",
         "numeric", "DELETE", "counting", "numeric")


# Made-up table names: [topic] [qualifier] subject, in one of dev's four styles.
_TOPICS = (
    "Harbor", "Chess", "Cricket", "Hockey", "Tennis", "Rowing", "Cycling", "Boxing", "Marathon", "Volcano",
    "Island", "Lake", "Castle", "Bridge", "Railway", "Airport", "Library", "Museum", "Hospital", "Election",
    "Album", "Novel", "Opera", "Theatre", "Painting", "Satellite", "Comet", "Rocket", "Mineral", "Bird",
    "Orchard", "Garden", "Festival", "Vineyard", "Lighthouse", "Canal", "Glacier", "Desert", "Forest", "Reef",
    "Tram", "Ferry", "Bakery", "Brewery", "Pottery", "Sculpture", "Choir", "Ballet", "Circus", "Rodeo",
    "Sailing", "Archery", "Fencing", "Curling", "Skiing", "Surfing", "Polo", "Lacrosse", "Netball", "Judo",
)
_QUALIFIERS = (
    "", "", "", "Club", "League", "Season", "World", "National", "Regional", "Annual", "City", "County",
    "Junior", "Senior", "Summer", "Winter", "Open", "Cup", "1998", "2004", "2011",
)
_SUBJECTS = (
    "Results", "Records", "Standings", "Statistics", "Scores", "History", "Winners", "Rankings", "Inventory",
    "Table", "Data", "List", "Schedule", "Details", "Members", "Performance", "Attendance", "Achievements",
    "Champions", "Episodes", "Incidents", "Overview", "Registry", "Log", "Catalog", "Roster", "Census",
    "Survey", "Entries", "Fixtures",
)


def made_up_name(rng: random.Random, taken: set[str]) -> str:
    """A table name in one of dev's styles whose case-folded form is not in ``taken``."""
    while True:
        words = [w for w in (rng.choice(_TOPICS), rng.choice(_QUALIFIERS), rng.choice(_SUBJECTS)) if w]
        style = rng.randrange(4)
        if style == 0:
            name = " ".join(words)  # Harbor Festival Results
        elif style == 1:
            name = "_".join(w.lower() for w in words)  # chess_club_roster
        elif style == 2:
            name = "_".join(words)  # Volcano_Survey
        else:
            name = "".join(words)  # RegionalBirdCensus
        if name.casefold() not in taken:
            return name


def safe(value: str) -> bool:
    return (
        0 < len(value) <= 60
        and value == value.strip()
        and not any(c in value for c in "'\"\\`")
        and value.isprintable()
    )


def sql_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def number_text(value: Any) -> str:
    if isinstance(value, float):
        if value.is_integer():
            return str(int(value))
        return repr(round(value, 4))
    return str(value)


def usable_tables(dev: Sequence[DBTask], std: Sequence[DBTask]) -> list[DBTask]:
    """Dev tasks whose table std does not use and MySQL accepts, in dev order."""
    std_rows = {row for t in std for table in t.tables for row in table.rows}
    out = []
    for task in dev:
        (table,) = task.tables
        folded = [c.casefold() for c in table.columns]
        if any(not c.strip() for c in table.columns) or len(set(folded)) != len(folded):
            continue
        if any(row in std_rows for row in table.rows) or len(table.rows) < 3:
            continue
        out.append(task)
    return out


class _TableGen:
    """Candidate tasks for one table."""

    def __init__(self, table: Table, rng: random.Random) -> None:
        self.table = table
        self.rng = rng
        self.cols = list(table.columns)
        self.values = {c: [r[i] for r in table.rows] for i, c in enumerate(self.cols)}
        self.numeric_cols = [
            c for c in self.cols
            if all(_NUMBER.fullmatch(v) for v in self.values[c]) and len({float(v) for v in self.values[c]}) > 2
        ]
        # Columns whose every value is safe and distinct even under MySQL's collation.
        self.names = [
            c for c in self.cols
            if c not in self.numeric_cols and all(safe(v) for v in self.values[c])
            and len({fold(v) for v in self.values[c]}) == len(self.values[c])
        ]

    # -- helpers ----------------------------------------------------------------------

    def exact_groups(self, col: str) -> dict[str, int]:
        """Values whose collation-equal cells are all identical to them: value -> count."""
        by_fold: dict[str, set[str]] = {}
        for v in self.values[col]:
            by_fold.setdefault(fold(v), set()).add(v)
        counts = Counter(self.values[col])
        return {v: counts[v] for vs in by_fold.values() if len(vs) == 1 for v in vs if safe(v)}

    def unique_keys(self) -> list[tuple[str, str, int]]:
        """(column, value, row index) for cells that identify exactly one row."""
        out = []
        for c in self.cols:
            for v, n in sorted(self.exact_groups(c).items()):
                if n == 1:
                    out.append((c, v, self.values[c].index(v)))
        return out

    def pick(self, items: Sequence[Any]) -> Any:
        return items[self.rng.randrange(len(items))] if items else None

    @property
    def t(self) -> str:
        return ident(self.table.name)

    # -- question kinds -----------------------------------------------------------------

    def other(self) -> tuple[str, str, str] | None:
        keys = [(c, v, i) for c, v, i in self.unique_keys() if any(safe(r) for r in self.table.rows[i])]
        key = self.pick(keys)
        if key is None:
            return None
        col, value, row = key
        targets = [c for j, c in enumerate(self.cols) if c != col and safe(self.table.rows[row][j])]
        target = self.pick(targets)
        if target is None:
            return None
        q = f"What is the {target} when the {col} is {value}?"
        return "other", q, f"SELECT {ident(target)} FROM {self.t} WHERE {ident(col)} = {sql_literal(value)}"

    def counting(self) -> tuple[str, str, str] | None:
        options = [(c, v, n) for c in self.cols for v, n in sorted(self.exact_groups(c).items()) if n >= 2]
        if not options:
            options = [(c, v, n) for c in self.cols for v, n in sorted(self.exact_groups(c).items())]
        choice = self.pick(options)
        if choice is None:
            return None
        col, value, _ = choice
        q = f"How many rows have {col} equal to {value}?"
        return "counting", q, f"SELECT COUNT(*) FROM {self.t} WHERE {ident(col)} = {sql_literal(value)}"

    def numeric(self) -> tuple[str, str, str] | None:
        if not self.numeric_cols:
            return self.other()
        kinds = ["aggregation-SUM", "aggregation-AVG", "aggregation-MIN", "aggregation-MAX", "ranking",
                 "comparison", "counting"]
        for kind in self.rng.sample(kinds, len(kinds)):
            made = self._numeric(kind, self.pick(self.numeric_cols))
            if made is not None:
                return made
        return self.other()

    def _numeric(self, kind: str, col: str) -> tuple[str, str, str] | None:
        n = ident(col)
        numbers = [float(v) for v in self.values[col]]
        if kind.startswith("aggregation-"):
            fn = kind.split("-")[1]
            word = {"SUM": "total", "AVG": "average", "MIN": "lowest", "MAX": "highest"}[fn]
            expr = f"{fn}({n})" if fn in ("SUM", "AVG") else f"{fn}({n} + 0)"
            return kind, f"What is the {word} {col} in the table?", f"SELECT {expr} FROM {self.t}"
        if kind == "counting":
            threshold = sorted(numbers)[len(numbers) // 2]
            q = f"How many rows have a {col} greater than {number_text(threshold)}?"
            return kind, q, f"SELECT COUNT(*) FROM {self.t} WHERE {n} + 0 > {number_text(threshold)}"
        names = [c for c in self.names if c != col]
        name = self.pick(names)
        if name is None:
            return None
        if kind == "ranking":
            highest = self.rng.random() < 0.5
            best = max(numbers) if highest else min(numbers)
            if numbers.count(best) != 1:
                return None
            word, order = ("highest", "DESC") if highest else ("lowest", "ASC")
            q = f"Which {name} has the {word} {col}?"
            return kind, q, f"SELECT {ident(name)} FROM {self.t} ORDER BY {n} + 0 {order} LIMIT 1"
        rows = self.rng.sample(range(len(numbers)), 2)
        if numbers[rows[0]] == numbers[rows[1]]:
            return None
        a, b = (self.values[name][i] for i in rows)
        q = f"Which {name} has a higher {col}, {a} or {b}?"
        sql = (f"SELECT {ident(name)} FROM {self.t} WHERE {ident(name)} IN ({sql_literal(a)}, {sql_literal(b)}) "
               f"ORDER BY {n} + 0 DESC LIMIT 1")
        return kind, q, sql

    # -- modification kinds -----------------------------------------------------------

    def insert(self) -> tuple[str, str, str] | None:
        pools = [sorted({v for v in self.values[c] if safe(v)}) for c in self.cols]
        if any(not p for p in pools):
            return None
        existing = set(self.table.rows)
        for _ in range(20):
            row = tuple(self.pick(p) for p in pools)
            if row not in existing:
                break
        else:
            return None
        pairs = ", ".join(f"{c} '{v}'" for c, v in zip(self.cols, row, strict=True))
        q = f"Insert a new row into the {self.table.name} table with {pairs}."
        cols = ", ".join(ident(c) for c in self.cols)
        sql = f"INSERT INTO {self.t} ({cols}) VALUES ({', '.join(sql_literal(v) for v in row)})"
        return "INSERT", q, sql

    def update(self) -> tuple[str, str, str] | None:
        key = self.pick(self.unique_keys())
        if key is None:
            return None
        col, value, row = key
        options = []
        for j, c in enumerate(self.cols):
            current = self.table.rows[row][j]
            if c == col:
                continue
            new = sorted({v for v in self.values[c] if safe(v) and fold(v) != fold(current)})
            if new:
                options.append((c, new))
        choice = self.pick(options)
        if choice is None:
            return None
        target, new_values = choice
        new = self.pick(new_values)
        q = f"Update the {target} to '{new}' for the row whose {col} is '{value}'."
        sql = f"UPDATE {self.t} SET {ident(target)} = {sql_literal(new)} WHERE {ident(col)} = {sql_literal(value)}"
        return "UPDATE", q, sql

    def delete(self) -> tuple[str, str, str] | None:
        options = [(c, v) for c in self.cols for v, n in sorted(self.exact_groups(c).items())
                   if n <= max(1, len(self.table.rows) // 4)]
        choice = self.pick(options)
        if choice is None:
            return None
        col, value = choice
        q = f"Delete every row whose {col} is '{value}' from the table."
        return "DELETE", q, f"DELETE FROM {self.t} WHERE {ident(col)} = {sql_literal(value)}"

    def make(self, slot: str) -> tuple[str, str, str] | None:
        makers: dict[str, Callable[[], tuple[str, str, str] | None]] = {
            "other": self.other, "counting": self.counting, "numeric": self.numeric,
            "INSERT": self.insert, "UPDATE": self.update, "DELETE": self.delete,
        }
        return makers[slot]()


def _execute(table: Table, sql: str) -> list[tuple[Any, ...]] | str:
    """Run ``sql`` on a fresh in-memory copy; rows for a SELECT, else the table's hash."""
    conn = connect_memory()
    try:
        load_tables(conn, (table,))
        rows = conn.execute(sql).fetchall()
        if sql.lstrip().upper().startswith("SELECT"):
            return rows
        cols = ", ".join('"' + c.replace('"', '""') + '"' for c in table.columns)
        after = conn.execute(f'SELECT {cols} FROM "{table.name.replace(chr(34), chr(34) * 2)}"').fetchall()
        return table_hash(after) or "None"
    finally:
        conn.close()


def _record(source: DBTask, table: Table, kind: str, question: str, sql: str, result: Any) -> dict[str, Any] | None:
    record: dict[str, Any] = {
        "description": question,
        "create": {"database": "gen-train", "init": ""},
        "table": {
            "table_name": table.name,
            "table_info": {"columns": [{"name": c, "type": "TEXT"} for c in table.columns],
                           "rows": [list(r) for r in table.rows]},
        },
        "evaluation": "",
        "example": "",
        "type": [kind],
        "heads": list(table.columns),
        "add_description": (f"The name of this table is {table.name}, and the headers of this table are "
                            f"{','.join(table.columns)}."),
        "source": f"gen-train:dev/{source.index}",
        "gold_sql_runs": True,
    }
    if kind in ("INSERT", "UPDATE", "DELETE"):
        record["label"] = [sql]
        record["answer_md5"] = f"[('{result}',)]"
    else:
        values = [row[0] for row in result]
        if not values or any(v is None for v in values):
            return None
        record["label"] = [number_text(v) for v in values]
        record["sql"] = {"query": sql, "length": len(sql)}
    return record


def generate_records(dev: Sequence[DBTask], std: Sequence[DBTask], *, per_table: int = 8, seed: int = 0,
                     rename_seed: int | None = None) -> list[dict]:
    """The set's records; with ``rename_seed``, each task's table under a made-up name of its own."""
    taken = {table.name.casefold() for task in (*dev, *std) for table in task.tables}
    names = random.Random(f"{SPLIT}/{seed}/names/{rename_seed}")
    records = []
    for source in usable_tables(dev, std):
        rng = random.Random(f"{SPLIT}/{seed}/dev/{source.index}")
        gen = _TableGen(source.tables[0], rng)
        seen: set[str] = set()
        for slot in SLOTS[:per_table]:
            if rename_seed is not None:  # the same rows, columns and draws; only the name differs
                gen.table = attrs.evolve(source.tables[0], name=made_up_name(names, taken))
            made = gen.make(slot)
            if made is None:
                continue
            kind, question, sql = made
            if question in seen:
                continue
            record = _record(source, gen.table, kind, question, sql, _execute(gen.table, sql))
            if record is not None:
                seen.add(question)
                records.append(record)
    return records


def generate(dev: Sequence[DBTask], std: Sequence[DBTask], *, per_table: int = 8, seed: int = 0,
             rename_seed: int | None = None) -> list[DBTask]:
    records = generate_records(dev, std, per_table=per_table, seed=seed, rename_seed=rename_seed)
    return [task_from_record(r, SPLIT, i) for i, r in enumerate(records)]


def main(argv: list[str] | None = None) -> int:
    from agentrl_env_db.tasks import load_split

    p = argparse.ArgumentParser(description="write the gen-train DB tasks as JSONL (upstream's format)")
    p.add_argument("--out", required=True)
    p.add_argument("--per-table", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rename-seed", type=int, default=None, help="give every task's table a made-up name (this seed)")
    args = p.parse_args(argv)
    records = generate_records(load_split("dev"), load_split("std"), per_table=args.per_table, seed=args.seed,
                               rename_seed=args.rename_seed)
    with open(args.out, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {len(records)} tasks to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
