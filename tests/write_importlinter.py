"""Write the import-linter config: core must import no plugin package (docs/architecture.md section 2).

The plugin import names come from plugins/*/src/, so a new plugin is covered automatically.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(out: str) -> None:
    plugins = sorted(p.name for p in ROOT.glob("plugins/*/src/*") if (p / "__init__.py").exists())
    lines = [
        "[importlinter]",
        "root_packages =",
        "    agentrl_core",
        *[f"    {p}" for p in plugins],
        "",
        "[importlinter:contract:core-imports-no-plugin]",
        "name = agentrl_core never imports a plugin",
        "type = forbidden",
        "source_modules =",
        "    agentrl_core",
        "forbidden_modules =",
        *[f"    {p}" for p in plugins],
        "",
        "[importlinter:contract:plugins-are-independent]",
        "name = plugins do not import each other",
        "type = independence",
        "modules =",
        *[f"    {p}" for p in plugins],
        "",
    ]
    Path(out).write_text("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1])
