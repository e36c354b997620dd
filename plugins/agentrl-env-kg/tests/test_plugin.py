"""Discovery first, then the environment contract, config validation and packaging."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from agentrl_env_kg.config import KGConfig
from agentrl_env_kg.env import KGEnvironment

from agentrl_core.config import config_from_dict
from agentrl_core.errors import ConfigError, EnvError
from agentrl_core.plugins import get_plugin_manager
from agentrl_core.registry import Registry
from agentrl_core.testing import check_environment


def test_entry_point_is_discovered_by_a_fresh_plugin_manager():
    pm = get_plugin_manager(environ={})
    record = pm.records["env_kg"]
    assert record.status == "ok" and record.distribution == "agentrl-env-kg"
    spec = Registry(pm).get_environment("kg")
    assert spec.factory == "agentrl_env_kg.env:KGEnvironment"


def test_conformance():
    report = check_environment("kg", oracle_samples=5)
    assert not report.failures


def test_index_sets_of_both_sources():
    fb = KGEnvironment().index_sets()
    assert {k: len(v) for k, v in fb.items()} == {"fb-train": 3000, "fb-dev": 200, "fb-test": 500}
    ab = KGEnvironment(KGConfig(source="agentbench", backend="sparql", endpoint="http://127.0.0.1:9/sparql")).index_sets()
    assert {k: len(v) for k, v in ab.items()} == {"std": 150, "dev": 20, "train": 1214}


def test_config_section_is_validated_by_the_plugin_schema():
    base = {"model": {"path": "m"}, "tasks": [{"env": "kg", "split": "fb-train"}]}
    cfg = config_from_dict({**base, "environments": {"kg": {"backend": "sparql", "endpoint": "http://h:3001/sparql"}}})
    section = cfg.environments["kg"]
    assert isinstance(section, KGConfig) and section.backend == "sparql" and section.max_rounds == 15
    with pytest.raises(ConfigError, match="backend"):
        config_from_dict({**base, "environments": {"kg": {"backend": "virtuoso"}}})
    with pytest.raises(ConfigError, match="endpoint"):
        config_from_dict({**base, "environments": {"kg": {"backend": "sparql", "endpoint": "localhost:3001"}}})
    with pytest.raises(ConfigError, match="did you mean 'max_rounds'"):
        config_from_dict({**base, "environments": {"kg": {"max_round": 10}}})


def test_misconfigurations_fail_with_one_sentence():
    with pytest.raises(EnvError, match="needs an endpoint URL"):
        KGEnvironment(KGConfig(backend="sparql"))
    from agentrl_env_kg.graphs import store_spec

    with pytest.raises(EnvError, match="agentbench questions need Freebase"):
        store_spec(KGConfig(source="agentbench"))
    with pytest.raises(EnvError, match="is not a file"):
        store_spec(KGConfig(graph_files=["/nonexistent/graph.nt"]))


def test_installs_and_runs_without_torch():
    code = (
        "import sys, anyio\n"
        "from agentrl_core.testing import check_environment\n"
        "check_environment('kg', oracle_samples=1)\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "AGENTRL_PLUGINS": ""})
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_cli_writes_demonstrations(tmp_path):
    demos = tmp_path / "demos.jsonl"
    subprocess.run([sys.executable, "-m", "agentrl_core.cli.main", "demos", "--env", "kg", "--split", "fb-dev",
                    "--limit", "5", "--out", str(demos)], check=True, env={**os.environ, "AGENTRL_PLUGINS": ""})
    records = [json.loads(line) for line in demos.read_text().splitlines()]
    assert len(records) == 5 and {r["reward"] for r in records} == {1.0}
    assert records[0]["messages"][-1]["content"].startswith("Final Answer: #")
