"""The README's tutorial, followed literally in a folder outside the repository.

Every code block of the README that starts with ``# file: PATH`` is written to a fresh
folder; the plugin is installed into a new virtual environment with pip, and its own tests,
``agentrl plugins`` and ``agentrl config`` run there. So the tutorial cannot drift from what
works: a renamed class, a missing oracle or a wrong entry point fails this test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
FILE_BLOCK = re.compile(r"```[a-z]*\n# file: (?P<path>\S+)\n(?P<body>.*?)```", re.S)


def tutorial_files() -> dict[str, str]:
    return {m["path"]: m["body"] for m in FILE_BLOCK.finditer(README.read_text(encoding="utf-8"))}


def test_the_tutorial_gives_every_file_of_the_plugin():
    assert set(tutorial_files()) == {
        "pyproject.toml", "src/agentrl_env_guess/__init__.py", "src/agentrl_env_guess/plugin.py",
        "src/agentrl_env_guess/env.py", "tests/test_plugin.py", "run.yaml",
    }


@pytest.fixture(scope="module")
def tutorial_venv(tmp_path_factory):
    """The tutorial's folder and a fresh venv in which the plugin is pip-installed."""
    root = tmp_path_factory.mktemp("outside") / "agentrl-env-guess"
    for relpath, body in tutorial_files().items():
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_text(body, encoding="utf-8")
    venv = root / ".venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # agentrl-core (and pytest, hatchling) come from this test's environment, as if pip had
    # installed them there: step 1 of the tutorial, without a second copy of the packages.
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # addsitedir, not a plain path line, so that the editable installs' own .pth files apply.
    outer = sysconfig.get_path("purelib")
    (Path(purelib) / "outer_site.pth").write_text(f"import site; site.addsitedir({outer!r})\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    f"{root}[test]"], check=True, cwd=root, env=env)  # not -e: editables needs build isolation
    return root, python, env


def run(tutorial_venv, *args):
    root, python, env = tutorial_venv
    return subprocess.run([str(python), *args], capture_output=True, text=True, cwd=root, env=env)


def test_the_tutorial_plugin_passes_its_own_tests(tutorial_venv):
    out = run(tutorial_venv, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 passed" in out.stdout


def test_the_tutorial_plugin_is_listed_and_its_run_config_validates(tutorial_venv):
    listed = run(tutorial_venv, "-m", "agentrl_core.cli.main", "plugins", "--json")
    assert listed.returncode == 0, listed.stderr
    record = next(r for r in json.loads(listed.stdout) if r["name"] == "env_guess")
    assert record["status"] == "ok" and record["provides"] == {"environment": ["guess"]}
    assert record["distribution"] == "agentrl-env-guess"
    checked = run(tutorial_venv, "-m", "agentrl_core.cli.main", "config", "run.yaml", "--quiet")
    assert checked.returncode == 0, checked.stderr
