"""The documentation site's generated pages (docs/gen_reference.py) and its file collection (docs/hooks.py).

Run by ``nox -s docs`` before the build (no torch needed).
"""

from __future__ import annotations

import sys
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs"))

import gen_reference  # noqa: E402

from agentrl_core import config as config_module  # noqa: E402


@pytest.fixture(scope="module")
def config_page() -> str:
    return gen_reference.config_reference()


def _rows(page: str) -> dict[str, list[str]]:
    rows = {}
    for line in page.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_every_key_of_every_section_is_listed(config_page):
    rows = _rows(config_page)
    expected = []

    def walk(cls, prefix):
        for field in attrs.fields(cls):
            key = f"{prefix}.{field.name}" if prefix else field.name
            expected.append(key)
            child = gen_reference._attrs_class(cls, field)
            item = gen_reference._item(cls, field)
            if child is not None:
                walk(child, key)
            elif item is not None:
                walk(item[0], key + item[1])

    walk(config_module.Config, "")
    # top-level sections (run, model, tasks[], ...) have a table of their own rather than a row
    sections = {f.name for f in attrs.fields(config_module.Config)
                if gen_reference._attrs_class(config_module.Config, f) or gen_reference._item(config_module.Config, f)}
    assert [k for k in expected if k not in rows and k not in sections] == []
    assert set(rows) <= set(expected)
    assert len(rows) > 150


def test_every_key_has_a_description(config_page):
    """A key added without a comment (on its line or just above) fails here, naming the key."""
    undescribed = []

    def walk(cls, prefix):
        comments = gen_reference._field_comments(cls)
        for field in attrs.fields(cls):
            key = f"{prefix}.{field.name}" if prefix else field.name
            child = gen_reference._attrs_class(cls, field)
            item = gen_reference._item(cls, field)
            if child is not None:
                walk(child, key)
            elif item is not None:
                walk(item[0], key + item[1])
            elif not comments.get(field.name, "").strip():
                undescribed.append(key)

    walk(config_module.Config, "")
    assert undescribed == [], f"config keys without a description (add a # comment to the field): {undescribed}"
    # and the page shows a description in every row
    assert [k for k, cells in _rows(config_page).items() if not cells[2].strip()] == []


def test_types_defaults_and_comments_come_from_the_class(config_page):
    rows = _rows(config_page)
    assert rows["rollout.n_samples"][:2] == ["`int`", "`8`"]
    assert rows["loss.clip_high"][:2] == ["`float`", "`0.2`"]
    # a comment at the end of the line
    assert rows["loss.behave_weight_cap"] == ["`float \\| None`", "`5.0`", "decoupled only; None: no cap"]
    # comment lines just above the field, joined
    assert rows["rollout.partial_rollouts"][2].startswith("interruptible generation: a weight sync pauses")
    assert rows["rollout.partial_rollouts"][2].endswith("(docs/architecture.md section 5)")
    # a factory default, a required key, a list item and a dict item
    assert rows["optim.betas"][1] == "`[0.9, 0.999]`"
    assert rows["tasks[].env"][1] == "*required*"
    assert rows["eval.models.<name>.path"][:2] == ["`str \\| None`", "`None`"]
    # a nested section links to its own table, by the anchor MkDocs gives its heading
    assert "[`rollout.dynamic_sampling`](#rolloutdynamic_sampling)" in rows["rollout.dynamic_sampling"][2]
    assert "## `rollout.dynamic_sampling`" in config_page
    # the class docstring heads its section
    assert "DAPO's dynamic sampling" in config_page.split("## `rollout.dynamic_sampling`")[1].split("##")[0]


def test_cli_reference_has_the_help_of_every_command():
    from agentrl_core.cli.main import build_parser

    page = gen_reference.cli_reference()
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # the COMMAND sub-parsers
    for name in commands:
        assert f"## `agentrl {name}`" in page
    assert "### `agentrl engine serve`" in page
    assert "usage: agentrl train" in page


def test_site_files_follow_links_from_the_pages():
    pytest.importorskip("mkdocs", reason="nox -s docs installs MkDocs; other venvs have none")
    import hooks

    files = {p.relative_to(ROOT).as_posix() for p in hooks.repository_files()}
    assert {"README.md", "docs/architecture.md", "core/docs/engine.md", "plugins/agentrl-plugin-example/README.md"} <= files
    # not a Markdown page, but linked from core/docs/gateway.md: copied so the link works on the site
    assert "examples/gateway/train_calc.yaml" in files
    assert not any(".nox" in f for f in files)
