"""The missing-plugin hints' table names distributions that exist in this repository."""

from __future__ import annotations

from pathlib import Path

from agentrl_core.registry import KINDS, KNOWN_PROVIDERS

ROOT = Path(__file__).resolve().parents[2]


def test_every_known_provider_is_a_plugin_folder_here_and_declares_the_name():
    for (kind, name), dist in KNOWN_PROVIDERS.items():
        assert kind in KINDS, kind
        src = ROOT / "plugins" / dist / "src"
        assert (ROOT / "plugins" / dist / "pyproject.toml").is_file(), dist
        plugin_files = "\n".join(p.read_text() for p in src.glob("*/plugin.py"))
        assert f'name="{name}"' in plugin_files, (dist, name)


def test_every_component_of_the_plugins_here_is_in_the_table():
    import re

    declared = set()
    for plugin in (ROOT / "plugins").glob("*/src/*/plugin.py"):
        dist = plugin.parents[2].name
        declared |= {(name, dist) for name in re.findall(r'name="([a-z0-9_]+)"', plugin.read_text())}
    assert declared == {(name, dist) for (_, name), dist in KNOWN_PROVIDERS.items()}
