"""The agentrl command: --version, plugins listing with a broken plugin, config errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentrl_core import __version__


def agentrl(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "agentrl_core.cli.main", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def test_version():
    out = agentrl("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"agentrl-core {__version__}"


def test_plugins_lists_a_plugin_built_for_another_core_series(tmp_path):
    info = tmp_path / "agentrl_env_future-9.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: agentrl-env-future\nVersion: 9.0.0\n"
                                   "Requires-Dist: agentrl-core<9.1,>=9.0\n")
    (info / "entry_points.txt").write_text("[agentrl]\nenv_future = future_mod\n")
    (tmp_path / "future_mod.py").write_text("raise SystemExit('imported although incompatible')\n")
    env = {"PYTHONPATH": str(tmp_path)}
    records = {r["name"]: r for r in json.loads(agentrl("plugins", "--json", env=env).stdout)}
    assert records["env_future"]["status"] == "incompatible"
    assert records["env_future"]["error"].startswith(
        f"plugin 'env_future' from agentrl-env-future 9.0.0 was built for agentrl-core >=9.0,<9.1 but agentrl-core "
        f"{__version__} is installed: install a release of agentrl-env-future made for agentrl-core ")
    text = agentrl("plugins", env=env)
    assert text.returncode == 0 and "incompatible: plugin 'env_future'" in text.stdout, text.stdout + text.stderr


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


def make_dist(root, name, entry_point, module, source):
    info = root / f"{name.replace('-', '_')}-0.0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text(f"[agentrl]\n{entry_point} = {module}\n")
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    return {"PYTHONPATH": str(root)}


def test_wrong_factory_is_one_sentence_naming_plugin_and_entry_point(tmp_path):
    env = make_dist(tmp_path, "agentrl-env-typo", "env_typo", "typo_plugin", """
        from agentrl_core import hookimpl
        from agentrl_core.types import EnvironmentSpec

        @hookimpl
        def agentrl_environments():
            yield EnvironmentSpec(name="typo", factory="typo_plugin:TypoEnvironmnet")
    """)
    out = agentrl("worker", "--env", "typo", "--controller", "http://127.0.0.1:9/api", env=env)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr  # no traceback
    message = lines[0]
    assert message.startswith("agentrl: error: environment 'typo' of plugin 'env_typo' (agentrl-env-typo 0.0.1")
    assert "entry point 'env_typo = typo_plugin'" in message
    assert "'typo_plugin:TypoEnvironmnet'" in message and "AttributeError" in message
    assert "install agentrl-env" not in message


def test_plugin_that_fails_to_import_is_named_without_an_install_hint(tmp_path):
    env = make_dist(tmp_path, "agentrl-env-gone", "env_gone", "gone_plugin", "import not_a_real_module_xyz\n")
    out = agentrl("worker", "--env", "gone", "--controller", "http://127.0.0.1:9/api", env=env)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    message = out.stderr.strip().splitlines()[-1]  # after the loader's one-line warning
    assert "unknown environment 'gone'" in message
    assert "'env_gone' (agentrl-env-gone 0.0.1) failed: ModuleNotFoundError: No module named 'not_a_real_module_xyz'" in message
    assert "install agentrl-env-gone?" not in message  # it is installed: the hint would mislead
    assert "agentrl-env-gone is installed, but no loaded plugin provides 'gone'" in message


def test_missing_plugin_hint_names_the_distribution_that_provides_it():
    # core's venv has no plugin: calc is the template plugin's, whose name follows no convention
    out = agentrl("worker", "--env", "calc", "--controller", "http://127.0.0.1:9/api")
    assert out.returncode == 1
    assert "install agentrl-plugin-example?: pip install agentrl-plugin-example, or from a checkout of agentrl, " \
           "pip install -c constraints.txt ./plugins/agentrl-plugin-example" in out.stderr
    for plugin_dir in ("agentrl-plugin-example",):
        assert (Path(__file__).parents[2] / "plugins" / plugin_dir / "pyproject.toml").is_file()
    out = agentrl("worker", "--env", "swebench", "--controller", "http://127.0.0.1:9/api")
    assert out.returncode == 1 and "unknown environment 'swebench'" in out.stderr
    assert "install" not in out.stderr  # no known package provides it: no hint


def test_missing_model_path_is_one_sentence_naming_the_path(tmp_path):
    config = tmp_path / "run.yaml"
    missing = tmp_path / "no_such_model"
    config.write_text(f"model:\n  path: {missing}\ntasks: []\n")
    for command in (["train", str(config)], ["sft", str(config)], ["engine", "serve", "--model", str(missing)]):
        out = agentrl(*command)
        assert out.returncode == 1, (command, out.stderr)
        assert "Traceback" not in out.stderr
        line = out.stderr.strip().splitlines()[-1]
        assert line.startswith("agentrl: error: ") and f"'{missing}' does not exist" in line, (command, line)


def test_eval_models_given_by_urls_need_model_path_as_their_tokenizer(tmp_path):
    config = tmp_path / "eval.yaml"
    missing = tmp_path / "no_such_model"
    config.write_text(f"model:\n  path: {missing}\ntasks: []\n"
                      "eval:\n  models:\n    a: {urls: ['http://127.0.0.1:9']}\n")
    out = agentrl("eval", str(config))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith(f"agentrl: error: model.path '{missing}' does not exist")


def test_evaluated_models_tokenize_with_their_own_folder_not_a_default_model_path(tmp_path):
    from agentrl_core.config import load_config
    from agentrl_core.errors import ConfigError
    from agentrl_core.jobs.evaluation import tokenizer_source

    # a training config's model.path that does not exist (yet): the evaluated models' own folder is used
    base = ["model.path=runs/not_trained_yet/sft_model", "tasks=[]"]
    models = 'eval.models={"rl": {"path": "/m/rl"}, "warmup": {"path": "/m/warmup"}, "served": {"urls": ["http://h:1"]}}'
    assert tokenizer_source(load_config(None, [*base, models], validate_plugins=False)) == ("/m/rl", "eval.models.rl.path")
    assert tokenizer_source(load_config(None, base, validate_plugins=False)) == (
        "runs/not_trained_yet/sft_model", "model.path")
    urls_only = load_config(None, ["tasks=[]", 'eval.models={"served": {"urls": ["http://h:1"]}}'],
                            validate_plugins=False)
    with pytest.raises(ConfigError, match="set model.path to the tokenizer's directory"):
        tokenizer_source(urls_only)


def test_model_folder_without_config_json_is_named(tmp_path):
    folder = tmp_path / "empty_model"
    folder.mkdir()
    out = agentrl("engine", "serve", "--model", str(folder))
    assert out.returncode == 1
    assert out.stderr.strip() == (f"agentrl: error: --model '{folder}' is a folder without config.json, so not a "
                                  "Hugging Face model folder (`agentrl model init --out DIR` writes one; a "
                                  "checkpoint's final model is in <run dir>/final_model)")


def test_model_init_without_torch_is_one_sentence(tmp_path):
    # a torch that is not there: a module of that name first on the path that fails as a missing one does
    fake = tmp_path / "no_torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    out = agentrl("model", "init", "--out", str(tmp_path / "tiny"), env={"PYTHONPATH": str(fake.parent)})
    assert out.returncode == 1
    assert out.stderr.strip() == ("agentrl: error: `agentrl model` needs torch, which is not installed: from a "
                                  "checkout of agentrl, pip install -c constraints.txt './core[torch]' (see the "
                                  "README, section Install)")
