"""The scripted agent that solves a DB task through the same tools a model uses.

Modification tasks: replay the gold SQL (``label[0]``) with ``execute_sql``, then commit.
Question tasks: commit the gold answer (the label). Upstream's gold ``sql.query`` mostly
does not run on MySQL (double-quoted identifiers, missing spaces), so it is executed first
only for generated tasks, whose SQL is known to run; demonstrations then show the query and
its result before the answer.

With ``error_rate`` > 0 each episode goes wrong with that probability: a wrong answer, or a
modification that is never made. An episode that does not go wrong slips with the same
probability when its gold SQL runs: it first sends the statement with its first keyword
misspelled (``SELEC``, ``UPDAT``: a syntax error that changes nothing), reads the error and
then sends the right statement, so demonstrations also show a recovery.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from agentrl_core.env import assistant_tool_call
from agentrl_core.types import Message
from agentrl_env_db.scoring import is_float
from agentrl_env_db.tasks import DBTask


def wrong_answer(label: Sequence[str], rng: random.Random) -> list[str]:
    """An answer that upstream's comparison rejects."""
    if len(label) == 1 and is_float(str(label[0]).replace(",", "").rstrip("%")):
        value = float(str(label[0]).replace(",", "").rstrip("%"))
        return [f"{value + rng.choice([-3, -2, -1, 1, 2, 3]):g}"]
    if len(label) > 1 and rng.random() < 0.5:
        return list(label[:-1])
    return [f"{label[0] if label else 'none'} (not sure)"]


def misspelled(query: str) -> str:
    """``query`` with its first keyword missing its last letter: ``SELEC x FROM t``, a syntax error."""
    head, _, rest = query.partition(" ")
    return f"{head[:-1]} {rest}"


class DBOracle:
    def __init__(self, task: DBTask, *, error_rate: float = 0.0, seed: int = 0) -> None:
        self.task = task
        rng = random.Random(f"db-oracle/{task.split}/{task.index}/{seed}")
        mistake = error_rate > 0 and rng.random() < error_rate
        self.plan: list[Message] = []
        if task.is_modification:
            if not mistake and task.gold_sql:
                self.plan.append(assistant_tool_call("execute_sql", {"query": task.gold_sql}, call_id="call_0"))
            answers: list[str] = []
        else:
            if task.gold_sql_runs and task.gold_sql:
                self.plan.append(assistant_tool_call("execute_sql", {"query": task.gold_sql}, call_id="call_0"))
            label = [str(x) for x in (task.answer or [])]
            answers = wrong_answer(label, rng) if mistake else label
        # an episode that executes its gold SQL may slip first and recover
        self.slip = bool(self.plan) and not mistake and error_rate > 0 and rng.random() < error_rate
        if self.slip:
            assert task.gold_sql is not None
            self.plan = [assistant_tool_call("execute_sql", {"query": misspelled(task.gold_sql)}, call_id="call_0"),
                         assistant_tool_call("execute_sql", {"query": task.gold_sql}, call_id="call_1")]
        self.plan.append(
            assistant_tool_call("commit_final_answer", {"answers": answers}, call_id=f"call_{len(self.plan)}")
        )

    def act(self, messages: Sequence[Message]) -> Message:
        done = sum(1 for m in messages if m.get("role") == "assistant")
        return self.plan[min(done, len(self.plan) - 1)]
