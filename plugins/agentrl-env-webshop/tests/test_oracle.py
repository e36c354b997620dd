"""The oracle on the bundled goals (a subset here; benchmarks/env_webshop.py runs them all)."""

from __future__ import annotations

import os
import subprocess
import sys

import anyio
import pytest

from agentrl_core.env import play_episode, read_demonstrations


def _play(env, pairs, error_rate=0.0):
    async def main():
        episodes = []
        for k, (split, index) in enumerate(pairs):
            agent = env.oracle(split, index, error_rate=error_rate, seed=k)
            episodes.append(await play_episode(env, split, index, agent))
        return episodes

    return anyio.run(main)


def test_oracle_solves_a_subset_of_every_split(bundled_env):
    sets = bundled_env.index_sets()
    # every 5th test goal, every 10th dev and every 20th train goal: 100 + 30 + 146 episodes
    pairs = ([("bundled-test", i) for i in sets["bundled-test"][::5]] + [("bundled-dev", i) for i in sets["bundled-dev"][::10]]
             + [("bundled-train", i) for i in sets["bundled-train"][::20]])
    episodes = _play(bundled_env, pairs)
    failures = [(e.split, e.index, e.reward) for e in episodes if e.reward != 1.0]
    assert not failures
    assert all(e.status.value == "completed" and e.metrics["purchased_target"] == 1.0 for e in episodes)
    with_options = [e for e in episodes if e.metrics.get("r_option") is not None]
    assert len(with_options) > 10 and all(e.metrics["option_clicks"] >= 1 for e in with_options)


def test_oracle_with_errors_scores_less(bundled_env):
    pairs = [("bundled-dev", i) for i in bundled_env.index_sets()["bundled-dev"][:60]]
    episodes = _play(bundled_env, pairs, error_rate=0.5)
    mean = sum(e.reward for e in episodes) / len(episodes)
    solved = sum(e.reward == 1.0 for e in episodes)
    assert 0.2 < mean < 0.95 and 0 < solved < len(episodes)
    assert all(e.status.value in ("completed", "task limit reached") for e in episodes)


def test_cli_writes_demonstrations(tmp_path):
    out = tmp_path / "demos.jsonl"
    env = {**os.environ, "AGENTRL_PLUGINS": ""}
    subprocess.run([sys.executable, "-m", "agentrl_core.cli.main", "demos", "--env", "webshop", "--split", "bundled-test",
                    "--limit", "4", "--out", str(out)], check=True, env=env, capture_output=True)
    records = list(read_demonstrations(out))
    assert len(records) == 4 and all(r["reward"] == 1.0 for r in records)
    assert [t["function"]["name"] for t in records[0]["tools"]] == ["search_action", "click_action"]
    assert records[0]["messages"][2]["tool_calls"][0]["function"]["name"] == "search_action"


@pytest.mark.slow
def test_oracle_solves_every_bundled_goal(bundled_env):
    """The full sweep (about a minute); benchmarks/env_webshop.py records it."""
    pairs = [(split, i) for split, indices in bundled_env.index_sets().items() for i in indices]
    episodes = _play(bundled_env, pairs)
    solved = sum(e.reward == 1.0 for e in episodes)
    assert solved / len(episodes) >= 0.99


def test_worker_memory_stays_far_under_one_gigabyte(tmp_path):
    """A fresh process with the bundled catalog, its index, spaCy and 40 episodes: peak RSS < 1 GB."""
    script = (
        "import anyio\n"
        "from agentrl_core.env import play_episode\n"
        "from agentrl_env_webshop.config import WebShopConfig\n"
        "from agentrl_env_webshop.env import WebShopEnvironment\n"
        f"env = WebShopEnvironment(WebShopConfig(index_cache_dir={str(tmp_path)!r}))\n"
        "async def main():\n"
        "    for i in range(40):\n"
        "        await play_episode(env, 'bundled-test', i, env.oracle('bundled-test', i))\n"
        "anyio.run(main)\n"
        "print([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    peak_mb = int(out.stdout.strip().splitlines()[-1]) / 1024
    assert 50 < peak_mb < 1024
