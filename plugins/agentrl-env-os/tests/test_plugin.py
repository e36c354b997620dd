"""Discovery first, then everything that needs no Docker: tasks, config, observations, matching."""

from __future__ import annotations

import shutil

import pytest
from agentrl_env_os.config import DEFAULT_CAPABILITIES, OSConfig, size_bytes
from agentrl_env_os.env import TOOLS, format_observation
from agentrl_env_os.evaluate import match_answer, script_argv
from agentrl_env_os.images import recipe_hashes
from agentrl_env_os.oracle import OSOracle, output_of
from agentrl_env_os.shell import ShellResult, clean_output
from agentrl_env_os.tasks import Script, data_root, load_split

from agentrl_core.datafiles import DataFileError
from agentrl_core.env import assistant_tool_call
from agentrl_core.errors import ConfigError
from agentrl_core.plugins import get_plugin_manager
from agentrl_core.registry import Registry


def test_entry_point_is_discovered_by_a_fresh_plugin_manager():
    pm = get_plugin_manager(environ={})
    record = pm.records["env_os"]
    assert record.status == "ok" and record.distribution == "agentrl-env-os"
    spec = Registry(pm).get_environment("os")
    assert spec.factory == "agentrl_env_os.env:OSEnvironment"
    assert Registry(pm).config_schema("environment", "os") is OSConfig


def test_index_sets_have_upstream_sizes_and_order():
    std, dev, train = load_split("std"), load_split("dev"), load_split("train")
    assert (len(std), len(dev), len(train)) == (144, 26, 1000)
    # data/1/stock.json (7) + data/2/environment.json (5) + data/3/ac.json (6) come first.
    assert [t.source for t in std[:7]] == ["data/1/stock.json"] * 7
    assert std[16].source == "data/3/ac.json" and std[16].index_in_file == 4 and std[16].image == "packages"
    # data/4 in upstream's glob order: Q49 (2 tasks), N225, N11, Q09, Q30 (6), Q19, Q47, N41 (4), N4, N37.
    assert [std[i].source.removeprefix("data/4/") for i in (18, 20, 21, 22, 23, 29, 30, 31, 35, 36)] == [
        "Q49.json", "N225.json", "N11.json", "Q09.json", "Q30.json", "Q19.json", "Q47.json", "N41.json", "N4.json", "N37.json"
    ]
    assert std[35].start is not None and std[35].start.code.endswith("su - jack")
    assert std[35].match == {"answer": "love", "strip": True}
    assert [t.source for t in std[56:]] == ["data/7/bootstrap.json"] * 88
    assert all(t.index == i for i, t in enumerate(std))


def test_parsing_follows_upstream_quirks():
    std = load_split("std")
    listed = std[44]  # data/5/new.json #7: "create" is a list -> default image, no init
    assert listed.source == "data/5/new.json" and listed.index_in_file == 7
    assert listed.image == "default" and listed.init == ()
    assert std[11].init[1] == Script("bash", "echo '' > ~/.bashrc")  # a list of two init scripts
    sudo = std[55]  # data/6/new.json #8: `apt remove sudo` (without -y), one check script
    assert sudo.init == (Script("bash", "apt remove sudo"),) and len(sudo.check) == 1
    # data/6/new.json #0: the example sits outside "evaluation", so upstream never loads it.
    assert std[47].match == {"answer": "a3b0c7", "strip": True} and std[47].example is None
    assert std[0].check[0] is None and std[0].asks_for_answer
    assert std[0].check[1].language == "python" and "int(argv[1])" in std[0].check[1].code
    train = load_split("train")
    assert all(t.check[0] is None and t.example is not None for t in train)


def test_corrupt_data_is_rejected(tmp_path):
    root = data_root()
    copy = tmp_path / "os"
    shutil.copytree(root / "data", copy / "data")
    shutil.copytree(root / "scripts", copy / "scripts")
    (copy / "data" / "dev.json").write_text("[]")
    with pytest.raises(DataFileError, match="sha256"):
        load_split("dev", str(copy))


def test_config_is_validated_by_the_registry():
    registry = Registry(get_plugin_manager(environ={}))
    config = registry.make_config("environment", "os", {"command_timeout_s": 5, "memory": "512m"})
    assert config.command_timeout_s == 5.0 and config.round_limit == 8
    with pytest.raises(ConfigError, match="memory"):
        registry.make_config("environment", "os", {"memory": "lots"})
    with pytest.raises(ConfigError, match="did you mean 'round_limit'"):
        registry.make_config("environment", "os", {"round_limt": 3})


def test_sandbox_config_keys():
    registry = Registry(get_plugin_manager(environ={}))
    config = registry.make_config("environment", "os", {
        "capabilities": ["CHOWN", "SETUID"], "disk_limit": None, "tmpfs": {"/tmp": "size=64m,exec"},
        "read_only_root": True,
    })
    assert config.capabilities == ("CHOWN", "SETUID") and config.disk_limit is None and config.read_only_root
    default = OSConfig()
    assert default.capabilities == DEFAULT_CAPABILITIES and "NET_RAW" not in default.capabilities
    assert (default.disk_limit, default.no_new_privileges, default.read_only_root, default.tmpfs) == ("2g", True, False, {})
    assert (size_bytes("2g"), size_bytes("64m"), size_bytes("3k"), size_bytes("10")) == (2 * 2**30, 64 * 2**20, 3072, 10)
    with pytest.raises(ConfigError, match="capability names"):
        registry.make_config("environment", "os", {"capabilities": ["CAP_CHOWN"]})
    with pytest.raises(ConfigError, match="capability names"):
        registry.make_config("environment", "os", {"capabilities": ["ALL"]})
    with pytest.raises(ConfigError, match="disk_limit"):
        registry.make_config("environment", "os", {"disk_limit": "big"})
    with pytest.raises(ConfigError, match="tmpfs"):
        registry.make_config("environment", "os", {"tmpfs": {"/tmp": "mode=1777"}})  # no size=


def test_tools_are_upstreams_function_schemas():
    names = [t["function"]["name"] for t in TOOLS]
    assert names == ["bash_action", "finish_action", "answer_action"]
    assert TOOLS[0]["function"]["parameters"]["required"] == ["script"]


def test_observation_truncates_like_upstream():
    config = OSConfig()
    long = ("abcdefghij" * 90).encode()  # 900 characters > 800
    text = format_observation(ShellResult(long, 0), config)
    assert text == "The output of the OS:\n\n" + "abcdefghij" * 78 + "\n[truncated because the output is too long]"
    exactly = format_observation(ShellResult(b"x" * 800, 0), config)
    assert exactly == "The output of the OS:\n\n" + "x" * 800
    assert format_observation(ShellResult(b"", 0), config) == "The output of the OS is empty."
    assert format_observation(ShellResult(b"\xff\xfe", 0), config).endswith("cannot be decoded as UTF-8")
    timed = format_observation(ShellResult(b"", None, timed_out=True, stopped_by="interrupt"), config)
    assert timed == "The output of the OS is empty.\n[The command did not finish within 30 seconds and was interrupted with Ctrl-C.]"


def test_terminal_output_is_cleaned():
    raw = b"\x1b]0;root@abc: ~\x07\x1b[01;34mdir\x1b[0m  file\r\nline2\r\n\x1b[?2004h"
    assert clean_output(raw) == "dir  file\nline2\n"


def test_match_and_script_argv():
    assert match_answer("  love\n", {"answer": "love", "strip": True}).success
    assert not match_answer(" love", {"answer": "love", "strip": False}).success
    assert match_answer("pid 1234 ok", {"regex": r"\d{4}"}).success
    assert not match_answer(None, {"answer": "x", "strip": True}).success
    assert script_argv(Script("bash", "echo"), ["a", "b"]) == ["bash", "-c", "echo", "--", "a", "b"]
    assert script_argv(Script("bash", "echo")) == ["bash", "-c", "echo"]
    assert script_argv(Script("python", "print(1)"), ["a"]) == ["python3", "-c", "print(1)", "a"]


def test_oracle_plans():
    std = load_split("std")
    # An answer task: the example runs as the checker runs it, then its output is the answer.
    oracle = OSOracle(std[0])
    first = oracle.act([{"role": "system", "content": ""}, {"role": "user", "content": ""}])
    script = first["tool_calls"][0]["function"]["arguments"]
    assert "bash -c" in script and "</dev/null 2>/dev/null" in script
    second = oracle.act([{"role": "assistant"}, {"role": "tool", "content": "The output of the OS:\n\n42\n"}])
    assert second == assistant_tool_call("answer_action", {"answer": "42"}, call_id="call_1")
    # An operation task (check chain without the example's output): finish after the work.
    done = OSOracle(std[49]).act([{"role": "assistant"}, {"role": "tool", "content": "The output of the OS is empty."}])
    assert done["tool_calls"][0]["function"]["name"] == "finish_action"
    # A match task without example: the expected answer at once.
    assert OSOracle(std[31]).act([])["tool_calls"][0]["function"]["arguments"] == '{"answer": "no"}'
    # error_rate=1 always errs: a wrong integer.
    wrong = OSOracle(std[0], error_rate=1.0, seed=3).act([{"role": "assistant"}, {"role": "tool", "content": "The output of the OS:\n\n42"}])
    assert wrong["tool_calls"][0]["function"]["arguments"] == '{"answer": "43"}'
    assert output_of("The output of the OS:\n\n7\n\n[The command did not finish within 30 seconds and was killed.]") == "7"


@pytest.mark.parametrize("distro", ["ubuntu", "debian"])
def test_image_recipe_hashes_chain(distro):
    hashes = recipe_hashes(distro)
    assert set(hashes) == {"base", "default", "packages", "ubuntu"}
    assert len(set(hashes.values())) == 4 and all(len(h) == 12 for h in hashes.values())


def test_the_package_ships_exactly_the_checked_data_files():
    """Every file the tasks read is in the package (so in the wheel), and nothing unchecked is."""
    from pathlib import Path

    import agentrl_env_os
    from agentrl_env_os.checksums import SHA256

    root = Path(agentrl_env_os.__file__).parent / "data"
    shipped = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    assert shipped - {"PROVENANCE.md", "tokenizer_corpus.json"} == set(SHA256)
