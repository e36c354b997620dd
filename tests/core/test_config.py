"""Config loading: typed sections, clear errors naming the key, plugin sections."""

from __future__ import annotations

import attrs
import pytest

from agentrl_core.config import Config, load_config
from agentrl_core.errors import ConfigError
from agentrl_core.hookspecs import hookimpl
from agentrl_core.structure import in_range
from agentrl_core.testing import register_plugin
from agentrl_core.types import EnvironmentSpec, SamplerSpec


@attrs.frozen
class ToyEnvConfig:
    backend: str = "sqlite"
    rounds: int = attrs.field(default=15, validator=in_range(1))


@attrs.frozen
class ToySamplerConfig:
    stale_ratio: float = attrs.field(default=0.25, validator=in_range(0.0, 1.0))


class ToyPlugin:
    @staticmethod
    @hookimpl
    def agentrl_environments():
        return [EnvironmentSpec(name="toy", factory="builtins:dict", config_schema=ToyEnvConfig)]

    @staticmethod
    @hookimpl
    def agentrl_samplers():
        return [SamplerSpec(name="toycross", factory="builtins:dict", config_schema=ToySamplerConfig)]


@pytest.fixture
def registry():
    return register_plugin(ToyPlugin(), load_entry_points=False)


def write(tmp_path, text):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_defaults_are_the_papers():
    c = Config()
    assert (c.rollout.n_samples, c.rollout.batch_size, c.rollout.concurrency) == (8, 256, 2048)
    assert (c.rollout.max_turns, c.rollout.max_total_len, c.rollout.max_new_tokens) == (20, 8192, 1024)
    assert (c.rollout.temperature, c.rollout.incomplete_punishment) == (0.8, -0.2)
    assert (c.loss.clip_low, c.loss.dual_clip_c, c.loss.kl_coef, c.loss.aggregation) == (0.2, 3.0, 1e-4, "token-mean")
    assert (c.optim.lr, c.optim.grad_clip, c.engine.rollout_ratio) == (1e-6, 1.0, 0.5)
    assert (c.rollout.warmup_factor, c.rollout.buffer_max_factor) == (1.7, 2.0)


def test_misspelled_key_names_key_line_and_suggestion(tmp_path, registry):
    path = write(tmp_path, "run:\n  name: x\nrollout:\n  n_samples: 4\n  temprature: 1.0\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, registry=registry)
    assert str(info.value) == "unknown key 'rollout.temprature' (run.yaml:5); did you mean 'temperature'?"


def test_wrong_type_and_range(tmp_path, registry):
    with pytest.raises(ConfigError, match=r"rollout.n_samples \(run.yaml:2\) must be an integer, got 'eight'"):
        load_config(write(tmp_path, "rollout:\n  n_samples: eight\n"), registry=registry)
    with pytest.raises(ConfigError, match=r"rollout.top_p .*must be > 0.0 and <= 1.0, got 1.5"):
        load_config(write(tmp_path, "rollout:\n  top_p: 1.5\n"), registry=registry)
    with pytest.raises(ConfigError, match=r"train.mode .*must be one of 'async', 'sync', got 'asyn'; did you mean 'async'"):
        load_config(write(tmp_path, "train:\n  mode: asyn\n"), registry=registry)


def test_overrides_apply_and_are_validated(tmp_path, registry):
    path = write(tmp_path, "tasks:\n  - env: toy\n    split: std\n")
    c = load_config(path, ["rollout.temperature=1.0", "tasks.0.weight=2", "environments.toy.rounds=3"], registry=registry)
    assert c.rollout.temperature == 1.0
    assert c.tasks[0].weight == 2.0 and c.tasks[0].task_name == "toy-std"
    assert c.environments["toy"] == ToyEnvConfig(rounds=3)
    with pytest.raises(ConfigError, match=r"environments.toy.rounds \(--set environments.toy.rounds=0\): must be >= 1"):
        load_config(path, ["environments.toy.rounds=0"], registry=registry)
    with pytest.raises(ConfigError, match="must look like key.sub=value"):
        load_config(path, ["rollout.temperature"], registry=registry)


def test_exponent_numbers_without_a_dot_are_numbers(tmp_path, registry):
    # YAML 1.1 reads 1e-6 (no dot) as a string; a float field takes it as the number people mean.
    c = load_config(write(tmp_path, "optim:\n  lr: 1e-6\n"), ["loss.kl_coef=3E-4"], registry=registry)
    assert c.optim.lr == 1e-6 and c.loss.kl_coef == 3e-4
    with pytest.raises(ConfigError, match=r"optim.lr .*must be a number, got '1e-x'"):
        load_config(write(tmp_path, "optim:\n  lr: 1e-x\n"), registry=registry)
    with pytest.raises(ConfigError, match=r"rollout.n_samples .*must be an integer, got '1e3'"):
        load_config(write(tmp_path, "rollout:\n  n_samples: 1e3\n"), registry=registry)


def test_plugin_section_validated_by_plugin_schema(tmp_path, registry):
    c = load_config(write(tmp_path, "tasks:\n  - env: toy\n"), registry=registry)
    assert c.environments["toy"] == ToyEnvConfig()  # defaults filled in for a used environment
    with pytest.raises(ConfigError, match=r"unknown key 'environments.toy.bakend' \(run.yaml:3\); did you mean 'backend'"):
        load_config(write(tmp_path, "environments:\n  toy:\n    bakend: mysql\n"), registry=registry)


def test_section_for_missing_plugin_says_what_to_install(tmp_path, registry, monkeypatch):
    # names no installed distribution has, so the test means the same in every venv
    from agentrl_core import registry as registry_module

    monkeypatch.setattr(registry_module, "KNOWN_PROVIDERS", {
        ("environment", "shopx"): "agentrl-env-shopx", ("sampler", "crossx"): "agentrl-sampler-crossx",
        ("advantage_normalizer", "taskx"): "agentrl-advnorm-taskx"})
    with pytest.raises(ConfigError, match=r"install agentrl-env-shopx\?: pip install agentrl-env-shopx, or from a checkout of agentrl, pip install"):
        load_config(write(tmp_path, "environments:\n  shopx:\n    catalog: x\n"), registry=registry)
    with pytest.raises(ConfigError, match=r"install agentrl-sampler-crossx\?"):
        load_config(write(tmp_path, "sampler: crossx\n"), registry=registry)
    with pytest.raises(ConfigError, match=r"install agentrl-advnorm-taskx\?"):
        load_config(write(tmp_path, "advantage:\n  normalizers: [taskx]\n"), registry=registry)


def test_component_shorthand_and_options(tmp_path, registry):
    c = load_config(write(tmp_path, "sampler:\n  name: toycross\n  toycross:\n    stale_ratio: 0.5\n"), registry=registry)
    assert c.sampler.name == "toycross" and c.sampler.options["toycross"] == ToySamplerConfig(0.5)
    c = load_config(write(tmp_path, "sampler: toycross\n"), ["sampler.toycross.stale_ratio=0.1"], registry=registry)
    assert c.sampler.options["toycross"].stale_ratio == 0.1


def test_yaml_errors_are_clear(tmp_path, registry):
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "rollout: [\n"), registry=registry)
    with pytest.raises(ConfigError, match=r"duplicate key 'rollout' \(run.yaml:2\)"):
        load_config(write(tmp_path, "rollout: {}\nrollout: {}\n"), registry=registry)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml", registry=registry)


def test_missing_required_key(tmp_path, registry):
    with pytest.raises(ConfigError, match=r"missing required key 'tasks\[0\].env'"):
        load_config(write(tmp_path, "tasks:\n  - split: std\n"), registry=registry)


def test_dump_and_load_round_trip(tmp_path, registry):
    import yaml

    from agentrl_core.config import config_to_dict

    path = write(tmp_path, "tasks:\n  - env: toy\nsampler:\n  name: toycross\n  toycross: {stale_ratio: 0.5}\n")
    config = load_config(path, registry=registry)
    dumped = tmp_path / "dumped.yaml"
    dumped.write_text(yaml.safe_dump(config_to_dict(config)))
    assert load_config(dumped, registry=registry) == config


@attrs.frozen
class ToyLoggerConfig:
    url: str = "file:/tmp/x"


class ToyLoggerPlugin:
    @staticmethod
    @hookimpl
    def agentrl_loggers():
        from agentrl_core.types import LoggerSpec

        return [LoggerSpec(name="toylog", factory="builtins:dict", config_schema=ToyLoggerConfig)]


def test_logger_sections_are_validated_and_round_trip(tmp_path):
    import yaml

    from agentrl_core.config import config_to_dict

    registry = register_plugin(ToyLoggerPlugin(), load_entry_points=False)
    path = write(tmp_path, "logging:\n  loggers: [jsonl, toylog]\n  toylog: {url: 'http://h:5000'}\n")
    config = load_config(path, registry=registry)
    assert config.logging.options == {"toylog": ToyLoggerConfig(url="http://h:5000")}
    dumped = tmp_path / "dumped.yaml"
    dumped.write_text(yaml.safe_dump(config_to_dict(config)))
    assert load_config(dumped, registry=registry) == config
    with pytest.raises(ConfigError, match=r"unknown key 'logging.toylog.uri'"):
        load_config(write(tmp_path, "logging:\n  toylog: {uri: x}\n"), registry=registry)
    with pytest.raises(ConfigError, match=r"logging.jsonl.*takes no options"):
        load_config(write(tmp_path, "logging:\n  jsonl: {a: 1}\n"), registry=registry)
