"""MkDocs hooks (mkdocs.yml): build the site from the Markdown files where they live in the repository.

``on_files`` replaces what MkDocs found in ``docs_dir`` by the repository's pages under their
repository paths (``core/docs/engine.md`` stays ``core/docs/engine.md``), so the relative links
that work on GitHub work on the site, plus every file those pages link to (a Markdown page reached
only by a link, an example YAML, a screenshot) and the two generated reference pages.
``on_config`` lists plugin READMEs missing from the nav (a new plugin) under Plugins.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_reference  # noqa: E402

# The pages the site starts from; pages and files they link to are added as found.
SEEDS = ["README.md", "CONTRIBUTING.md", "CHANGELOG.md", "docs/*.md", "core/README.md", "core/docs/*.md",
         "plugins/*/README.md", "benchmarks/workloads/README.md"]
GENERATED = {"reference/config.md": gen_reference.config_reference, "reference/cli.md": gen_reference.cli_reference}
# [text](target) and ![alt](target); a target with a scheme or only an anchor is not a file
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def _linked_files(page: Path) -> list[Path]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    found = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith(("#", "/")):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if path.is_file() and path.is_relative_to(ROOT) and ".nox" not in path.parts:
            found.append(path)
    return found


def repository_files() -> list[Path]:
    """The seed pages and, transitively through Markdown pages, every repository file they link to."""
    todo = [p for pattern in SEEDS for p in sorted(ROOT.glob(pattern))]
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        if path.suffix == ".md":
            todo.extend(_linked_files(path))
    return sorted(seen)


def on_config(config, **kwargs):
    listed = set()

    def walk(items):
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            if isinstance(value, list):
                walk(value)
            else:
                listed.add(value)

    walk(config.nav or [])
    missing = [p.relative_to(ROOT).as_posix() for p in sorted(ROOT.glob("plugins/*/README.md"))]
    missing = [p for p in missing if p not in listed]
    for item in config.nav or []:
        if isinstance(item, dict) and "Plugins" in item:
            item["Plugins"].extend({p.split("/")[1]: p} for p in missing)
    return config


def on_files(files: Files, config, **kwargs) -> Files:
    site = Files([])
    for path in repository_files():
        site.append(File(path.relative_to(ROOT).as_posix(), str(ROOT), config.site_dir, config.use_directory_urls))
    for uri, generate in GENERATED.items():
        site.append(File.generated(config, uri, content=generate()))
    for file in files:  # the theme's assets (CSS, JavaScript, fonts), not the files of docs_dir
        if not file.abs_src_path or not Path(file.abs_src_path).is_relative_to(Path(config.docs_dir)):
            site.append(file)
    return site
