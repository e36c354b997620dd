"""Discovery first, then the contract, the config section, the dependencies and the CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata

import pytest
from agentrl_env_alfworld.config import AlfworldConfig

from agentrl_core.config import load_config
from agentrl_core.env import read_demonstrations
from agentrl_core.errors import ConfigError
from agentrl_core.plugins import get_plugin_manager
from agentrl_core.registry import Registry
from agentrl_core.testing import check_environment


def test_entry_point_is_discovered_by_a_fresh_plugin_manager():
    pm = get_plugin_manager(environ={})
    record = pm.records["env_alfworld"]
    assert record.status == "ok"
    assert record.distribution == "agentrl-env-alfworld"
    spec = Registry(pm).get_environment("alfworld")
    assert spec.factory == "agentrl_env_alfworld.env:AlfworldEnvironment"
    assert Registry(pm).config_schema("environment", "alfworld") is AlfworldConfig


def test_discovery_imports_nothing_heavy():
    code = (
        "import sys; from agentrl_core.registry import Registry; Registry().get_environment('alfworld'); "
        "print(sorted(m for m in ('textworld', 'alfworld', 'fast_downward', 'agentrl_env_alfworld.env') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_conformance():
    report = check_environment(
        "alfworld", {"start_timeout": 600, "reset_timeout": 300, "step_timeout": 120}, oracle_samples=3
    )
    assert not report.failures


def test_index_sets_keep_upstream_numbering(env):
    sets = env.index_sets()
    assert {k: len(v) for k, v in sets.items()} == {"std": 93, "dev": 20, "train": 2714, "train-extra": 839}
    missing = [i for i, _ in env.library.missing("std")]
    assert missing == [24, 35, 36, 37, 41, 42, 43, 56, 57, 58, 59, 60, 97, 100, 101, 105]
    assert set(sets["std"]) | set(missing) == set(range(109))
    assert env.library.ref("std", 108).path == (
        "json_2.1.1/valid_unseen/pick_two_obj_and_place-PepperShaker-None-Drawer-10/trial_T20190908_010306_215435/game.tw-pddl"
    )
    assert env.check_index("std", "0") == 0
    with pytest.raises(KeyError, match="not in alfworld/std"):
        env.check_index("std", 24)
    assert env.game("train-extra", 0).archive == "train"


def test_config_section_is_validated(tmp_path):
    config_file = tmp_path / "run.yaml"
    config_file.write_text(
        "tasks:\n  - {env: alfworld, split: std}\n"
        "environments:\n  alfworld: {max_steps: 10, wording: native, step_timeout: 5}\n"
    )
    config = load_config(str(config_file))
    section = config.environment_config("alfworld")
    assert isinstance(section, AlfworldConfig) and section.max_steps == 10 and section.wording == "native"
    registry = Registry()
    with pytest.raises(ConfigError, match="wording"):
        registry.make_config("environment", "alfworld", {"wording": "0.2.2"})
    with pytest.raises(ConfigError, match="step_timeout"):
        registry.make_config("environment", "alfworld", {"step_timeout": 0})
    with pytest.raises(ConfigError, match="max_stpes"):
        registry.make_config("environment", "alfworld", {"max_stpes": 3})


def _requirement_closure(dist_name: str) -> set[str]:
    """Installed distributions our plugin pulls in (ignoring extras)."""
    seen: set[str] = set()
    todo = [dist_name]
    while todo:
        name = re.split(r"[\s<>=!~;\[(]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for req in requires:
            if "extra ==" in req and "pddl" not in req:
                continue
            todo.append(req)
    return seen


def test_installs_without_torch():
    closure = _requirement_closure("agentrl-env-alfworld")
    assert {"textworld", "alfworld", "fast-downward-textworld"} <= closure
    assert "torch" not in closure and "ai2thor" not in closure
    code = (
        "import sys, anyio; from agentrl_env_alfworld.env import AlfworldEnvironment; from agentrl_core.env import play_episode\n"
        "from agentrl_env_alfworld.config import AlfworldConfig\n"
        "async def main():\n"
        "    env = AlfworldEnvironment(AlfworldConfig(reset_timeout=300, step_timeout=120))\n"
        "    try:\n"
        "        ep = await play_episode(env, 'dev', 0, env.oracle('dev', 0))\n"
        "    finally:\n"
        "        await env.aclose()\n"
        "    print(ep.reward, 'torch' in sys.modules)\n"
        "anyio.run(main)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=dict(os.environ))
    assert out.stdout.split() == ["1.0", "False"]


def test_cli_writes_demonstrations(tmp_path):
    out = tmp_path / "demos.jsonl"
    config = tmp_path / "demos.yaml"
    config.write_text("environments:\n  alfworld: {reset_timeout: 300, step_timeout: 120}\n")
    env = {**os.environ, "AGENTRL_PLUGINS": ""}
    subprocess.run(
        [sys.executable, "-m", "agentrl_core.cli.main", "demos", "--env", "alfworld", "--split", "dev",
         "--limit", "3", "--out", str(out), "--config", str(config)],
        check=True, env=env, capture_output=True, text=True,
    )
    records = list(read_demonstrations(out))
    assert [r["index"] for r in records] == [0, 1, 2]
    assert {r["status"] for r in records} == {"completed"} and all(r["reward"] == 1.0 for r in records)
    assert records[0]["tools"][0]["function"]["name"] == "take_action"
    assert [m["role"] for m in records[0]["messages"][:3]] == ["system", "user", "assistant"]
