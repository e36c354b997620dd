"""One version for every package, from the root VERSION file (README: Versioning).

The packages read ``VERSION`` at build time (hatchling's version source); what a test can
check is that none has drifted: each pyproject takes its version from that file, each plugin
pins the core series of that version, the changelog has its section and every package
ships the licence.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from agentrl_core import __version__

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - pytest brings tomli on 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
VERSION = (ROOT / "VERSION").read_text().strip()
MAJOR, MINOR = (int(part) for part in VERSION.split(".")[:2])
SERIES_PIN = {f">={MAJOR}.{MINOR}", f"<{MAJOR}.{MINOR + 1}"}
PACKAGES = [ROOT / "core", *sorted(p.parent for p in (ROOT / "plugins").glob("*/pyproject.toml"))]


def _pyproject(package: Path) -> dict:
    return tomllib.loads((package / "pyproject.toml").read_text())


def test_version_is_a_plain_release_number():
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?", VERSION), VERSION


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_each_package_takes_its_version_from_the_version_file(package):
    data = _pyproject(package)
    assert "version" not in data["project"], f"{package.name}: remove the static version; VERSION is the only one"
    assert "version" in data["project"]["dynamic"]
    source = data["tool"]["hatch"]["version"]
    assert (package / source["path"]).resolve() == ROOT / "VERSION"
    assert re.search(source["pattern"], VERSION + "\n", re.MULTILINE)["version"] == VERSION


@pytest.mark.parametrize("package", PACKAGES[1:], ids=lambda p: p.name)
def test_each_plugin_pins_the_core_series_of_the_version(package):
    pins = [Requirement(r) for r in _pyproject(package)["project"]["dependencies"]]
    core = [r for r in pins if r.name == "agentrl-core"]
    assert len(core) == 1, f"{package.name} must depend on agentrl-core once"
    assert {str(s) for s in core[0].specifier} == SERIES_PIN, (
        f"{package.name} pins agentrl-core{core[0].specifier}; VERSION {VERSION} wants "
        f">={MAJOR}.{MINOR},<{MAJOR}.{MINOR + 1} (nox -s bump_version -- X.Y.Z rewrites both)"
    )


def test_the_tutorial_pins_the_same_series():
    readme = (ROOT / "plugins" / "agentrl-plugin-example" / "README.md").read_text()
    assert f'"agentrl-core>={MAJOR}.{MINOR},<{MAJOR}.{MINOR + 1}"' in readme


def test_the_installed_core_is_this_version():
    assert __version__ == VERSION, (
        f"agentrl-core {__version__} is installed but VERSION says {VERSION}: reinstall core (an editable install "
        "keeps the version it was installed with)"
    )


def test_the_changelog_has_a_section_for_this_version():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert changelog.startswith("# Changelog\n")
    assert "## [Unreleased]" in changelog
    assert re.search(rf"^## \[{re.escape(VERSION)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.MULTILINE), VERSION


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_each_package_ships_the_licence(package):
    assert (package / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()
    assert _pyproject(package)["project"]["license"] == "Apache-2.0"


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_no_package_writes_its_version_in_code(package):
    for init in (package / "src").glob("*/__init__.py"):
        assert not re.search(r"__version__\s*=\s*['\"]", init.read_text()), f"{init}: read it from the metadata"
