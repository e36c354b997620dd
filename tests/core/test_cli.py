"""The agentrl command: --version, plugins listing with a broken plugin, config errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from agentrl_core import __version__


def agentrl(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "agentrl_core.cli.main", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def test_version():
    out = agentrl("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"agentrl-core {__version__}"


def make_broken_dist(root):
    info = root / "agentrl_env_broken-0.0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: agentrl-env-broken\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[agentrl]\nenv_broken = broken_mod\n")
    (root / "broken_mod.py").write_text("import not_a_real_module_xyz\n")
    return {"PYTHONPATH": str(root)}


def test_plugins_lists_broken_plugin_and_strict_mode_fails(tmp_path):
    env = make_broken_dist(tmp_path)
    out = agentrl("plugins", "--json", env=env)
    assert out.returncode == 0, out.stderr
    records = {r["name"]: r for r in json.loads(out.stdout)}
    assert records["env_broken"]["status"] == "failed"
    assert "not_a_real_module_xyz" in records["env_broken"]["error"]
    assert records["env_broken"]["distribution"] == "agentrl-env-broken"
    text = agentrl("plugins", env=env)
    assert text.returncode == 0 and "failed: ModuleNotFoundError" in text.stdout
    strict = agentrl("plugins", "--json", env={**env, "AGENTRL_STRICT_PLUGINS": "1"})
    assert strict.returncode != 0
    assert "env_broken" in strict.stderr and "AGENTRL_STRICT_PLUGINS" in strict.stderr


def test_plugins_all_shows_core_builtins():
    out = agentrl("plugins", "--json", "--all")
    core = next(r for r in json.loads(out.stdout) if r["name"] == "core")
    assert core["provides"]["advantage_estimator"] == ["grpo", "grpo_negated", "reinforce_pp_baseline", "rloo"]


def test_config_error_exit_code(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent("""
        optim:
          lrr: 1e-6
    """))
    out = agentrl("config", str(path))
    assert out.returncode == 1
    assert out.stderr.strip() == "agentrl: error: unknown key 'optim.lrr' (c.yaml:3); did you mean 'lr'?"


def test_core_install_does_not_pull_torch(tmp_path):
    """`pip install ./core` resolves without torch (the train extra is opt-in)."""
    from pathlib import Path

    core = Path(__file__).resolve().parents[2] / "core"
    report = tmp_path / "report.json"
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--report", str(report), str(core)],
        capture_output=True, text=True,
    )
    assert out.returncode == 0, out.stderr
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert "agentrl-core" in names and "pluggy" in names
    assert not names & {"torch", "transformers", "ray"}, names
