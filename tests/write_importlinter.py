"""Write the import-linter config: the import rules of docs/architecture.md section 2.

Core imports no plugin and plugins do not import each other; inside core, the plugin layer
(config, registry, plugins, hookspecs, types, errors) is layered without cycles. The plugin
import names come from plugins/*/src/, so a new plugin is covered automatically.
``TYPE_CHECKING`` imports are not counted: they are annotations, not dependencies.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _contract(key: str, name: str, kind: str, **lists: list[str]) -> list[str]:
    lines = [f"[importlinter:contract:{key}]", f"name = {name}", f"type = {kind}"]
    for option, values in lists.items():
        lines += [f"{option} =", *[f"    {v}" for v in values]]
    return [*lines, ""]


def main(out: str) -> None:
    plugins = sorted(p.name for p in ROOT.glob("plugins/*/src/*") if (p / "__init__.py").exists())
    lines = [
        "[importlinter]",
        "root_packages =",
        "    agentrl_core",
        *[f"    {p}" for p in plugins],
        "exclude_type_checking_imports = True",
        "",
        *_contract(
            "core-imports-no-plugin", "agentrl_core never imports a plugin", "forbidden",
            source_modules=["agentrl_core"], forbidden_modules=plugins,
        ),
        *_contract("plugins-are-independent", "plugins do not import each other", "independence", modules=plugins),
        *_contract(
            "plugin-layer", "the plugin layer is layered (config > registry > plugins > hookspecs > types > errors)",
            "layers",
            layers=[
                "agentrl_core.config",
                "agentrl_core.registry",
                "agentrl_core.plugins",
                "agentrl_core.hookspecs",
                "agentrl_core.types",
                "agentrl_core.errors",
            ],
        ),
        *_contract(
            "env-api-imports-no-service",
            "agentrl_core.env (the plugin-author API) imports only contracts, records and errors",
            "forbidden",
            source_modules=["agentrl_core.env"],
            forbidden_modules=[f"agentrl_core.{m}" for m in (
                "config", "registry", "plugins", "http", "controlplane", "rollout", "train", "eval",
                "launch", "testing", "cli",
            )],
        ),
        *_contract(
            "nothing-imports-testing", "only tests import agentrl_core.testing", "forbidden",
            source_modules=[f"agentrl_core.{m}" for m in (
                "cli", "launch", "train", "eval", "rollout", "controlplane",
            )],
            forbidden_modules=["agentrl_core.testing"],
        ),
    ]
    Path(out).write_text("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1])
