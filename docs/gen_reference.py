"""Generate the documentation site's reference pages from the code itself.

``config_reference()`` walks the attrs classes of ``agentrl_core.config`` from ``Config`` down:
every key with its type, default and description (the class docstring and the comments on or
just above the field). ``cli_reference()`` prints the help of every ``agentrl`` command from the
argparse parser. ``docs/hooks.py`` calls both while MkDocs builds; run this file to print them.
"""

from __future__ import annotations

import inspect
import io
import sys
import textwrap
import tokenize
import typing

import attrs


def _field_comments(cls: type) -> dict[str, str]:
    """Field name -> its comment: the ``#`` lines just above it and the one at the end of its line."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    found: dict[str, str] = {}
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        name, sep, _ = stripped.partition(":")
        if not sep or not name.isidentifier() or line[: len(line) - len(line.lstrip())] != "    ":
            continue
        above = []
        previous = number - 1
        while previous >= 1 and lines[previous - 1].strip().startswith("#"):
            above.insert(0, comments.get(previous, ""))
            previous -= 1
        parts = [*above]
        if number in comments and not stripped.startswith("#"):
            parts.append(comments[number])
        found[name] = " ".join(p for p in parts if p)
    return found


def _type_name(field: attrs.Attribute) -> str:
    return str(field.type).replace("typing.", "")


def _attrs_class(cls: type, field: attrs.Attribute) -> type | None:
    hints = typing.get_type_hints(cls)
    hint = hints.get(field.name)
    return hint if isinstance(hint, type) and attrs.has(hint) else None


def _item(cls: type, field: attrs.Attribute) -> tuple[type, str] | None:
    """A list or dict of attrs objects: the item class and its key suffix (``[]`` or ``.<name>``)."""
    hint = typing.get_type_hints(cls).get(field.name)
    for arg in typing.get_args(hint):
        if isinstance(arg, type) and attrs.has(arg):
            return arg, (".<name>" if typing.get_origin(hint) is dict else "[]")
    return None


def _anchor(key: str) -> str:
    return "".join(c for c in key if c.isalnum() or c in "_-")


def _default(field: attrs.Attribute) -> str:
    default = field.default
    if default is attrs.NOTHING:
        return "*required*"
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        if default.takes_self:
            return "*computed*"
        value = default.factory()
        if attrs.has(type(value)):
            return ""
        default = value
    return f"`{default!r}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _section(cls: type, prefix: str, out: list[str], nested: list[tuple[type, str]]) -> None:
    out.append(f"## `{prefix}`\n")
    doc = inspect.getdoc(cls)
    if doc and doc != inspect.getdoc(object) and not doc.startswith(cls.__name__ + "("):
        out.append(doc + "\n")
    extra = getattr(cls, "__extra_sections__", None)
    if extra:
        out.append(f"Sub-sections named after a plugin component are collected in `{prefix}.{extra}` "
                   "and validated by that plugin's schema.\n")
    out.append("| Key | Type | Default | Description |")
    out.append("|---|---|---|---|")
    comments = _field_comments(cls)
    for field in attrs.fields(cls):
        key = f"{prefix}.{field.name}"
        child = _attrs_class(cls, field)
        description = comments.get(field.name, "")
        if child is not None:
            description = (description + " " if description else "") + f"See [`{key}`](#{_anchor(key)})."
            nested.append((child, key))
        item = _item(cls, field) if child is None else None
        if item is not None:
            item_key = key + item[1]
            description = (description + " " if description else "") + f"Each item: see [`{item_key}`](#{_anchor(item_key)})."
            nested.append((item[0], item_key))
        out.append(f"| `{key}` | `{_cell(_type_name(field))}` | {_cell(_default(field))} | {_cell(description)} |")
    out.append("")


def config_reference() -> str:
    from agentrl_core import config as config_module

    out = [
        "# Configuration reference\n",
        "Generated from the attrs classes in `core/src/agentrl_core/config.py` when the site is built "
        "(`docs/gen_reference.py`): every key of a run's YAML file, its type, default and description. "
        "Override any key on the command line with `--set key=value`; `agentrl config FILE` prints the "
        "resolved configuration. How sections and plugins fit together: "
        "[Plugins and configuration](../core/docs/plugins_and_config.md).\n",
    ]
    doc = inspect.getdoc(config_module)
    if doc:
        out.append("```text\n" + doc + "\n```\n")
    seen: set[str] = set()
    queue: list[tuple[type, str]] = []
    top = []
    for field in attrs.fields(config_module.Config):
        child = _attrs_class(config_module.Config, field)
        item = _item(config_module.Config, field)
        comments = _field_comments(config_module.Config)
        if child is not None:
            queue.append((child, field.name))
        elif item is not None:
            queue.append((item[0], field.name + item[1]))
        else:
            top.append(f"| `{field.name}` | `{_cell(_type_name(field))}` | {_cell(_default(field))} | "
                       f"{_cell(comments.get(field.name, ''))} |")
    if top:
        out += ["## Top-level keys\n", "| Key | Type | Default | Description |", "|---|---|---|---|", *top,
                "\n`environments.<env>` sections are validated by the environment plugin's own schema "
                "(see its README).\n"]
    while queue:
        cls, prefix = queue.pop(0)
        if prefix in seen:
            continue
        seen.add(prefix)
        nested: list[tuple[type, str]] = []
        _section(cls, prefix, out, nested)
        queue[0:0] = nested
    return "\n".join(out)


def _walk(parser, path: list[str], out: list[str]) -> None:
    import argparse

    name = " ".join(path)
    out.append(f"{'#' * min(len(path) + 1, 4)} `{name}`\n")
    out.append("```text\n" + parser.format_help().rstrip() + "\n```\n")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub_parser in action.choices.items():
                _walk(sub_parser, [*path, sub_name], out)


def cli_reference() -> str:
    import os

    from agentrl_core.cli.main import build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps help at the terminal width: the same page everywhere
    parser = build_parser()
    parser.prog = "agentrl"
    out = [
        "# Command-line reference\n",
        "Generated from the argparse definitions in `core/src/agentrl_core/cli/` when the site is built "
        "(`docs/gen_reference.py`): the `--help` of `agentrl` and of every command.\n",
    ]
    _walk(parser, ["agentrl"], out)
    return "\n".join(out)


if __name__ == "__main__":
    page = sys.argv[1] if len(sys.argv) > 1 else "config"
    print(config_reference() if page == "config" else cli_reference())
