"""The ``db`` environment: AgentBench DB (dbbench) with AgentBench-FC semantics.

Per episode: a fresh database holding the sample's table; the system prompt and the user
question of upstream; tools ``execute_sql(query)`` and ``commit_final_answer(answers)``;
15 rounds. ``execute_sql`` answers with ``str(rows)`` (or the database's error text) cut at
800 characters. ``commit_final_answer`` ends the episode with reward 1 or 0 and, as upstream,
no further message: SELECT-type answers are compared with the label after upstream's
normalization; INSERT/UPDATE/DELETE tasks compare an MD5 over the whole table with the stored
hash (the answer is ignored).

Tool arguments (``tool_arguments`` in the config): ``upstream`` (default for std and dev) reads
a turn as upstream's task does (:mod:`agentrl_env_db.upstream`: the first argument value
whatever its key); ``strict`` (default for the training sets) checks the arguments against the
schemas and answers a call that breaks them with the reason.

Index sets: ``std`` (standard.jsonl, 300), ``dev`` (dev.jsonl, 60 less one unusable
sample), ``gen-train`` (tasks generated over the dev tables ``std`` does not use) and,
when ``train_file`` is set, ``train`` (upstream's db_out_new.jsonl format).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

import anyio

from agentrl_core.env import BadTurn, Environment, Status, Step, ToolCall, ToolSession, function_tool, tool_result
from agentrl_core.types import Index, Message
from agentrl_env_db import tasks as tasks_mod
from agentrl_env_db import upstream
from agentrl_env_db.backend import Backend, Handle
from agentrl_env_db.config import DBConfig
from agentrl_env_db.scoring import compare_results
from agentrl_env_db.tasks import SYSTEM_PROMPT, DBTask

log = logging.getLogger(__name__)

UPSTREAM_SPLITS = frozenset({"std", "dev"})  # tool_arguments "auto" reads these turns as upstream

TOOLS = [
    function_tool(
        "execute_sql",
        "Executes a given SQL statement on the database and returns the result.",
        {"query": {"type": "string", "description": "The SQL query to be executed."}},
        required=["query"],
    ),
    function_tool(
        "commit_final_answer",
        "Commits the final answer after all operations are completed.",
        {
            "answers": {
                "type": "array",
                "items": {"type": "string"},
                "description": "The list of final answers to commit.",
            }
        },
        required=["answers"],
    ),
]


@functools.lru_cache(maxsize=4)
def _shipped_tasks(data_dir: str | None, per_table: int, seed: int, rename_seed: int | None) -> dict[str, list[DBTask]]:
    """std, dev and gen-train (tasks are frozen, so environments of one process share them)."""
    from agentrl_env_db.gen import generate

    loaded = {split: tasks_mod.load_split(split, data_dir) for split in ("std", "dev")}
    loaded["gen-train"] = generate(loaded["dev"], loaded["std"], per_table=per_table, seed=seed,
                                   rename_seed=rename_seed)
    return loaded


class DBSession(ToolSession):
    def __init__(self, env: DBEnvironment, task: DBTask) -> None:
        super().__init__(TOOLS, max_rounds=env.config.max_rounds)
        self.env = env
        self.task = task
        self.handle: Handle | None = None
        mode = env.config.tool_arguments
        self.upstream = mode == "upstream" or (mode == "auto" and task.split in UPSTREAM_SPLITS)
        self.counts = {"sql_calls": 0, "sql_errors": 0, "sql_timeouts": 0, "capped_reads": 0, "lenient_calls": 0}

    async def on_start(self) -> Step:
        self.handle = await self.env.create_handle(self.task)
        return Step(
            [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": self.task.user_prompt()},
            ]
        )

    async def on_tool_call(self, call: ToolCall, message: Message) -> Step:
        if call.name == "execute_sql":
            return Step([tool_result(call, await self._execute(call.arguments["query"]))])
        return await self._commit(call.arguments["answers"])

    async def on_bad_turn(self, bad: BadTurn, message: Message) -> Step:
        """In upstream mode, the turn as upstream's task reads it (:mod:`agentrl_env_db.upstream`)."""
        if not self.upstream or not isinstance(message, Mapping) or message.get("role", "assistant") != "assistant":
            return Step(bad.observation)
        call = upstream.first_call(message)
        if call is None:
            return Step([{"role": "user", "content": upstream.NO_TOOL_CALL}])

        def reply(content: str) -> Step:
            return Step([{"role": "tool", "tool_call_id": call.call_id, "content": content}])

        if not call.parsed:
            return reply(upstream.PARSE_ERROR)
        if call.name not in ("execute_sql", "commit_final_answer"):
            return reply(upstream.INVALID_FUNCTION)
        try:
            value = upstream.first_value(call.arguments)
        except upstream.Unreadable as exc:
            if call.name == "execute_sql":
                return reply(f"Error executing query: {exc}")
            return self._upstream_task_error(f"commit_final_answer: {exc}")
        if call.name == "execute_sql":
            observation = upstream.driver_answer(value)
            if observation is not None:
                self.counts["sql_errors"] += int(bool(value))
                return reply(observation)
        elif upstream.answer_crashes(value):
            return self._upstream_task_error(f"commit_final_answer: an answer of type {type(value).__name__}")
        # Upstream runs this call as if it had followed the schema: not a bad turn after all.
        self.invalid_turns -= 1
        self.counts["lenient_calls"] += 1
        if call.name == "execute_sql":
            return reply(await self._execute(value))
        return await self._commit(value)

    async def _execute(self, query: Any) -> str:
        assert self.handle is not None
        if self.upstream and query == "":  # upstream's driver runs nothing for an empty statement
            return "[]"
        try:
            query.encode("utf-8")
        except UnicodeEncodeError as exc:  # e.g. a lone surrogate from a JSON "\ud800" escape
            self.counts["sql_errors"] += 1
            return f"Error: the query is not valid text ({exc.reason} at position {exc.start})."
        result = await self.handle.execute(query)
        self.counts["sql_calls"] += 1
        self.counts["sql_errors"] += int(result.error)
        self.counts["sql_timeouts"] += int(result.timed_out)
        self.counts["capped_reads"] += int(result.capped)
        return result.text or "No response from database."

    async def _commit(self, answers: Any) -> Step:
        assert self.handle is not None
        if self.task.is_modification:
            got: Any = await self.handle.table_hash()
        else:
            got = answers
        correct = compare_results(got, self.task.answer, self.task.kind)
        return Step(
            [],  # upstream sends nothing after the final answer
            status=Status.COMPLETED,
            reward=1.0 if correct else 0.0,
            metrics={"correct": correct, "type": self.task.kind},
        )

    def _upstream_task_error(self, why: str) -> Step:
        """A final answer upstream's task crashes on (``task error`` there, reward 0).

        Here the episode ends the same way but as the agent failure it is: in agentrl ``task
        error`` means broken infrastructure, which evaluation leaves out of its denominators.
        """
        return Step(
            [],
            status=Status.AGENT_INVALID_ACTION,
            reward=0.0,
            metrics={"correct": False, "type": self.task.kind, "upstream_status": "task error", "upstream_error": why},
        )

    def metrics(self) -> dict[str, Any]:
        return {**super().metrics(), **self.counts, "result_source": self.result_source()}

    def result_source(self) -> str:
        """Which database produced this episode's result (``agentrl eval`` prints it per task)."""
        if self.task.sqlite_file is not None:
            return "db backend: sqlite (the task's own SQLite file, as upstream)"
        if self.env.config.backend == "mysql":
            return "db backend: mysql (a MySQL/MariaDB server, as upstream's MySQL 8)"
        return ("db backend: sqlite (upstream AgentBench ran MySQL 8; SQLite imitates part of its dialect, so "
                "results can differ: agentrl-env-db README)")

    async def on_close(self) -> None:
        handle, self.handle = self.handle, None
        if handle is not None:
            await handle.close()


class DBEnvironment(Environment):
    name = "db"
    tools = TOOLS

    def __init__(self, config: DBConfig | None = None) -> None:
        super().__init__(config or DBConfig())
        self.concurrency = self.config.concurrency
        self.backend: Backend = self._make_backend()

    def _make_backend(self) -> Backend:
        if self.config.backend == "mysql":
            from agentrl_env_db.mysql_backend import MySQLBackend

            return MySQLBackend(self.config)
        from agentrl_env_db.sqlite_backend import SQLiteBackend

        return SQLiteBackend(self.config)

    # -- tasks ----------------------------------------------------------------------------

    @cached_property
    def _tasks(self) -> dict[str, list[DBTask]]:
        c = self.config
        loaded = dict(_shipped_tasks(c.data_dir, c.gen_train_per_table, c.gen_train_seed, c.gen_train_rename_seed))
        if c.train_file:
            loaded["train"] = tasks_mod.load_train(c.train_file, c.train_db_dir)
        return loaded

    @cached_property
    def _index_sets(self) -> dict[str, list[int]]:
        return {split: tasks_mod.usable_indices(split, ts) for split, ts in self._tasks.items()}

    def index_sets(self) -> dict[str, Sequence[Index]]:
        return dict(self._index_sets)

    def task(self, split: str, index: Index) -> DBTask:
        index = self.check_index(split, index)
        return self._tasks[split][int(index)]

    # -- sessions -------------------------------------------------------------------------

    async def open(self, split: str, index: Index) -> DBSession:
        return DBSession(self, self.task(split, index))

    async def create_handle(self, task: DBTask) -> Handle:
        if task.sqlite_file is not None and self.config.backend != "sqlite":
            return await self._sqlite_for_files.create(task)
        return await self.backend.create(task)

    @cached_property
    def _sqlite_for_files(self) -> Backend:
        # Upstream runs "user_sqlite" training rows on SQLite files whatever the main backend.
        from agentrl_env_db.sqlite_backend import SQLiteBackend

        return SQLiteBackend(self.config)

    def oracle(self, split: str, index: Index, *, error_rate: float = 0.0, seed: int = 0) -> Any:
        from agentrl_env_db.oracle import DBOracle

        return DBOracle(self.task(split, index), error_rate=error_rate, seed=seed)

    def resource_count(self) -> int:
        extra = self.__dict__["_sqlite_for_files"].live() if "_sqlite_for_files" in self.__dict__ else 0
        return self.backend.live() + extra

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self.backend.aclose()
            if "_sqlite_for_files" in self.__dict__:
                await self._sqlite_for_files.aclose()
