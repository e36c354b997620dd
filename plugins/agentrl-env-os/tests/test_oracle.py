"""The conformance checker, the oracle on a representative std subset, demonstrations, image builds."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import anyio
import pytest

from agentrl_core.env import play_episode, read_demonstrations
from agentrl_core.testing import check_environment

pytestmark = pytest.mark.docker

# ~30 std tasks covering every kind: answer checks (integer, string, size), operation checks,
# match tasks, init lists, start scripts (cd, variables, `su - jack`), apt install/remove from the
# local repository, users and permissions (runuser, SUID, sticky bits), processes (`ps` counts with
# background jobs, `sudo -u`), the `packages` image (npm) and the list-valued "create" quirk.
# std 22 (4/Q09.json) is left out: its init writes to file descriptor 123321, more than this
# sandbox's open-file limit allows (see the README).
STD_SUBSET = [
    0, 5, 7, 9, 11, 12, 13, 14, 16, 17, 18, 19, 21, 23, 29, 30, 31, 33, 35,
    37, 38, 39, 42, 44, 47, 49, 50, 52, 54, 55, 56, 60, 61, 100, 143,
]


def test_conformance(docker_ready):
    report = check_environment("os", oracle_samples=2)
    assert not report.failures


def test_oracle_solves_the_std_subset(make_env):
    env = make_env()
    results: dict[int, tuple] = {}

    async def one(index: int, limiter: anyio.CapacityLimiter) -> None:
        async with limiter:
            episode = await play_episode(env, "std", index, env.oracle("std", index))
            results[index] = (episode.reward, episode.status.value, episode.metrics.get("verdict"))

    async def main():
        limiter = anyio.CapacityLimiter(4)
        async with anyio.create_task_group() as tg:
            for index in STD_SUBSET:
                tg.start_soon(one, index, limiter)

    anyio.run(main)
    # std 56 counts the container's processes (`ps -A | wc -l`), and its check counts them again:
    # on a loaded machine a process of the previous `docker exec` can still be exiting at one of
    # the two counts (seen once in CI at load ~4, 4 episodes at once). Upstream has the same race;
    # the oracle gets one more try for this task alone, on its own.
    if results.get(56, (1.0,))[0] != 1.0:
        limiter_one = anyio.CapacityLimiter(1)
        anyio.run(one, 56, limiter_one)
    missed = {i: r for i, r in results.items() if r[0] != 1.0}
    assert not missed, missed
    assert len(results) == len(STD_SUBSET) and env.resource_count() == 0


def test_oracle_with_errors_fails_some_episodes(make_env):
    env = make_env()

    async def main():
        rewards = []
        for index in (0, 12, 13, 49):  # integer answers and an operation task
            episode = await play_episode(env, "std", index, env.oracle("std", index, error_rate=1.0, seed=1))
            rewards.append(episode.reward)
        return rewards

    assert anyio.run(main) == [0.0, 0.0, 0.0, 0.0]


def test_demonstrations_cli(docker_ready, tmp_path):
    out = tmp_path / "demos.jsonl"
    env = {**os.environ, "AGENTRL_PLUGINS": ""}
    subprocess.run([sys.executable, "-m", "agentrl_core.cli.main", "demos", "--env", "os", "--split", "std",
                    "--limit", "3", "--out", str(out)], check=True, env=env, capture_output=True)
    records = list(read_demonstrations(out))
    assert [r["index"] for r in records] == [0, 1, 2]
    assert all(r["reward"] == 1.0 and r["status"] == "completed" for r in records)
    for record in records:  # std 0-2 (stock logs): run the example, then answer with its output
        messages = record["messages"]
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
        answer = json.loads(messages[4]["tool_calls"][0]["function"]["arguments"])["answer"]
        assert messages[3]["content"] == f"The output of the OS:\n\n{answer}\n" and answer.isdigit()


def test_build_images_skips_existing_images(docker_ready):
    proc = subprocess.run([sys.executable, "-m", "agentrl_env_os.cli", "build-images", "--json"],
                          capture_output=True, text=True, check=True)
    assert "images up to date" in proc.stdout
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(summary["images"]) == {"default", "packages", "ubuntu"} and summary["seconds"] < 30
