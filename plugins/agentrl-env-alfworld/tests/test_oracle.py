"""The walkthrough oracle on 20 games of every index set (the full run is benchmarks/env_alfworld.py)."""

from __future__ import annotations

import anyio
import pytest
from agentrl_env_alfworld.oracle import miss_cause, play_oracle, to_command

from agentrl_core.env import Status

pytestmark = pytest.mark.slow

GAMES_PER_SPLIT = 20


def spread(indices: list[int], n: int) -> list[int]:
    """``n`` indices spread evenly over the set (so every task type is represented)."""
    step = len(indices) / n
    return [indices[int(i * step)] for i in range(n)]


@pytest.mark.parametrize("split", ["std", "dev", "train", "train-extra"])
def test_oracle_wins_20_games(env, split):
    indices = spread(env.index_sets()[split], GAMES_PER_SPLIT)
    episodes = anyio.run(lambda: play_oracle(env, split, indices, concurrency=2))
    misses = {i: miss_cause(e) for i, e in zip(indices, episodes, strict=True) if isinstance(e, Exception) or e.reward != 1.0}
    assert not misses, misses
    assert all(e.status is Status.COMPLETED for e in episodes)
    task_types = {env.game(split, i).task_type for i in indices}
    assert len(task_types) == 6


def test_oracle_with_mistakes_loses_some_games(env):
    indices = env.index_sets()["dev"]
    episodes = anyio.run(lambda: play_oracle(env, "dev", indices, concurrency=2, error_rate=0.5, seed=11))
    rewards = [e.reward for e in episodes]
    statuses = {e.status for e in episodes}
    assert 0 < sum(rewards) < len(rewards)
    assert statuses <= {Status.COMPLETED, Status.TASK_LIMIT_REACHED, Status.AGENT_INVALID_ACTION}
    assert any(e.metrics["nothing_happens"] > 0 for e in episodes)


def test_walkthrough_wording():
    admissible = ["go to shelf 5", "put pencil 2 in/on shelf 5"]
    assert to_command("move pencil 2 to shelf 5", admissible, "agentbench") == "put pencil 2 in/on shelf 5"
    assert to_command("move pencil 2 to shelf 5", admissible, "native") == "move pencil 2 to shelf 5"
    assert to_command("go to shelf 5", admissible, "agentbench") == "go to shelf 5"
