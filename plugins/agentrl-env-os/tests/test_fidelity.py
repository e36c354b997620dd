"""The containers against upstream's: image content, the shell's start, the open-file limit,
and the helpers that compare recorded runs (agentrl_env_os.fidelity)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import anyio
import pytest
from agentrl_env_os import fidelity
from agentrl_env_os.config import OSConfig
from agentrl_env_os.docker_backend import DockerUnavailable
from agentrl_env_os.env import USER_PROMPT
from agentrl_env_os.recipes import DEFAULT_DISTRO, recipe_hashes
from agentrl_env_os.tasks import load_split

from agentrl_core.env import assistant_tool_call

# -- without Docker ---------------------------------------------------------------------------------


def test_the_debian_recipe_keeps_its_hashes_and_ubuntu_is_the_default():
    # The earlier images (Debian bookworm) are found again under their old tags.
    assert recipe_hashes("debian") == {
        "base": "e3816a76d0af", "default": "69ca581e6cf8", "packages": "90f1a929dd46", "ubuntu": "7a0e73b1e43f",
    }
    assert DEFAULT_DISTRO == "ubuntu" and OSConfig().distro == "ubuntu"
    assert not set(recipe_hashes("ubuntu").values()) & set(recipe_hashes("debian").values())
    with pytest.raises(ValueError, match="unknown image distribution 'arch'"):
        recipe_hashes("arch")


def test_open_files_config():
    assert OSConfig().open_files is None
    assert OSConfig(open_files=200_000).open_files == 200_000
    with pytest.raises(ValueError, match="must be >= 64"):
        OSConfig(open_files=8)


@pytest.mark.parametrize(
    ("upstream", "ours", "expected"),
    [
        ("The output of the OS:\n\n3\r\n", "The output of the OS:\n\n3\n", "same"),
        # upstream's terminal echoed the tail of a long command, then a CR, then the output
        ("The output of the OS:\n\n> ' | wc -l)\r\n\r9\r\n", "The output of the OS:\n\n9\n", "same_but_echo"),
        ("The output of the OS:\n\n1413\r\n", "The output of the OS:\n\n3\n", "different"),
        ("The output of the OS:\n\na\r\nb" + "\n[truncated because the output is too long]",
         "The output of the OS:\n\na\nbc" + "\n[truncated because the output is too long]", "truncated_same"),
    ],
)
def test_compare_output(upstream, ours, expected):
    assert fidelity.compare_output(upstream, ours) == expected


def test_std_indices_are_the_tasks_upstreams_runs_numbered_so():
    """Every std index sends the first message that upstream's recorded runs show for that index
    (data/4 in upstream's glob order, tasks.UPSTREAM_FILE_ORDER; sorted names would differ at 18-36)."""
    recorded = json.loads((Path(__file__).parent / "data" / "upstream_std_prompts.json").read_text())["sha256_by_index"]
    tasks = load_split("std")
    ours = {str(t.index): hashlib.sha256(USER_PROMPT.format(description=t.description).encode()).hexdigest()
            for t in tasks}
    assert len(recorded) == 144
    assert [i for i in recorded if recorded[i] != ours[i]] == []


def test_a_custom_data_4_folder_is_numbered_in_sorted_order(tmp_path):
    from agentrl_env_os.tasks import _files

    (tmp_path / "data" / "4").mkdir(parents=True)
    for name in ("Q49.json", "N11.json", "A.json"):
        (tmp_path / "data" / "4" / name).write_text("[]")
    assert _files(tmp_path, "data/4/*.json") == ["data/4/A.json", "data/4/N11.json", "data/4/Q49.json"]


def test_replays_leave_out_episodes_whose_first_message_is_another_task(tmp_path):
    tasks = load_split("std")
    records = []
    for upstream_index, task in ((18, tasks[18]), (19, tasks[20]), (13, tasks[13])):  # 19 is sent 20's message
        messages = [{"role": "system", "content": "s"},
                    {"role": "user", "content": USER_PROMPT.format(description=task.description)}]
        records.append({"index": upstream_index, "output": {
            "index": upstream_index, "status": "completed", "result": {"reward": 1, "messages": messages}}})
    folder = tmp_path / "model-a" / "os-std"
    folder.mkdir(parents=True)
    (folder / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    episodes = fidelity.read_runs(tmp_path)
    assert [(e.model, e.index) for e in episodes] == [("model-a", 18), ("model-a", 19), ("model-a", 13)]

    class Tasks:
        def tasks(self, split):
            return tasks

    assert fidelity.prompt_mismatches(Tasks(), episodes) == [("model-a", 19)]


# -- with Docker -------------------------------------------------------------------------------------


@pytest.mark.docker
def test_the_agents_shell_starts_after_the_init_scripts(make_env):
    """std 26/27 (4/Q30.json): the init writes a ~/.bashrc that adds three PATH entries (one
    existing); upstream's agents saw 9 entries, 7 of them directories."""
    env = make_env()

    async def ask(index: int, script: str) -> str:
        session = await env.open("std", index)
        try:
            await session.start()
            step = await session.step(assistant_tool_call("bash_action", {"script": script}))
            return step.messages[0]["content"]
        finally:
            await session.close()

    async def main():
        return (await ask(26, "echo $PATH | tr ':' '\\n' | wc -l"),
                await ask(27, fidelity.PROBES["path_existing_dirs"]))

    assert anyio.run(main) == ("The output of the OS:\n\n9\n", "The output of the OS:\n\n7\n")


@pytest.mark.docker
def test_default_image_prints_what_upstreams_printed(make_env):
    """Upstream's own check commands of six std tasks, after their init scripts: the values the
    upstream runs printed (Ubuntu 24.04 with upstream's packages, built long before the run).
    The count of executables in PATH (std 7) depends on the exact package versions of the day
    upstream's image was built; it comes within 1 % (the earlier Debian image: 2 of 6 values)."""
    env = make_env()
    outputs = anyio.run(lambda: fidelity.example_outputs(env, fidelity.UPSTREAM_OBSERVED, concurrency=3))
    rows = fidelity.upstream_agreement(outputs)["tasks"]
    assert all(row["same"] for index, row in rows.items() if index != 7), rows
    assert abs(int(rows[7]["ours"]) - 556) <= 5, rows[7]


@pytest.mark.docker
def test_default_image_probes(make_env):
    probes = anyio.run(fidelity.probe, make_env())
    assert probes["os_release"].startswith("Ubuntu 24.04")
    assert probes["usr_files_changed_last_day"] == "0"  # every file is older than a day
    assert probes["path"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert probes["home"] == "ubuntu"
    assert probes["own_name_resolves"] == "yes"  # else sudo warns "unable to resolve host" on every call
    # Upstream's agents found no file, bc, sudo, setfacl or ping, but ps, free and a compiler.
    assert probes["missing_commands"].split() == ["file", "bc", "sudo", "killall", "setfacl", "ping"]


@pytest.mark.docker
def test_open_files_limit(make_env):
    async def limit(env) -> str:
        session = await env.open("std", fidelity.PROBE_TASK)
        try:
            await session.start()
            step = await session.step(assistant_tool_call("bash_action", {"script": "ulimit -n"}))
            return step.messages[0]["content"]
        finally:
            await session.close()

    assert anyio.run(limit, make_env(open_files=4096, warm_pool=0)) == "The output of the OS:\n\n4096\n"
    # std 22 needs more than 123321; a host that forbids raising the limit says which key to change.
    try:
        high = anyio.run(limit, make_env(open_files=200_000, warm_pool=0))
    except DockerUnavailable as exc:
        assert "environments.os.open_files=200000" in str(exc)
    else:
        assert high == "The output of the OS:\n\n200000\n"
