"""Write the import-linter config: the import rules of docs/architecture.md section 2.

Core imports no plugin and plugins do not import each other. Inside core: the packages are
layered (CORE_LAYERS), the plugin-author API (agentrl_core.env) imports no service, train
does not import launch, nothing but tests imports agentrl_core.testing, and no sibling
packages or modules import each other in a cycle. The plugin import names come from
plugins/*/src/, so a new plugin is covered automatically. ``TYPE_CHECKING`` imports are not
counted: they are annotations, not dependencies.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Core's layers, highest first: a layer may import the layers below it, never one above;
# "a | b" are independent siblings (neither imports the other).
CORE_LAYERS = [
    "cli",
    "jobs | testing | view",
    "launch",
    "train | eval",
    "gateway",
    "rollout",
    "engine | controlplane",
    "env | http | processes | tinymodel",
    "config",
    "registry",
    "plugins | builtins",
    "hookspecs",
    "protocols | structure | datafiles | modelpath",
    "types",
    "errors | _version",
]

# What plugin packages may not import (their tests may: they test against core's internals).
# Public: agentrl_core, env, types, hookspecs, protocols, structure, datafiles, errors,
# plugins, registry, config, testing (in tests), eval.metrics/runner, rollout.*; the kits
# for engine drivers (rollout.drivers, http, processes) and for weight-sync transports
# (train.weight_sync: buckets, drain, WeightSyncError), and for loggers (train.loggers:
# flatten_metrics, so a tracker gets metrics.jsonl's keys). Everything else is core's own.
_TRAIN = sorted(p.stem for p in (ROOT / "core/src/agentrl_core/train").glob("*.py") if p.stem != "__init__")
PLUGIN_FORBIDDEN = [
    *[f"agentrl_core.controlplane.{m}" for m in ("state", "upkeep", "wire", "metrics", "openapi")],
    *[f"agentrl_core.{m}" for m in ("engine", "jobs", "launch", "testing", "tinymodel", "cli")],
    *[f"agentrl_core.train.{m}" for m in _TRAIN if m not in ("weight_sync", "loggers")],
]


def _contract(key: str, name: str, kind: str, **options: list[str] | str) -> list[str]:
    lines = [f"[importlinter:contract:{key}]", f"name = {name}", f"type = {kind}"]
    for option, value in options.items():
        lines += [f"{option} = {value}"] if isinstance(value, str) else [f"{option} =", *[f"    {v}" for v in value]]
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
            "core-layers", "core is layered (docs/architecture.md section 2)", "layers",
            containers=["agentrl_core"], layers=CORE_LAYERS,
        ),
        *_contract(
            "env-api-imports-no-service",
            "agentrl_core.env (the plugin-author API) imports only contracts, records and errors",
            "forbidden",
            source_modules=["agentrl_core.env"],
            forbidden_modules=[f"agentrl_core.{m}" for m in (
                "config", "registry", "plugins", "http", "processes", "controlplane", "engine", "rollout",
                "gateway", "train", "eval", "launch", "jobs", "testing", "tinymodel", "cli",
            )],
        ),
        *_contract(
            "nothing-imports-testing", "only tests import agentrl_core.testing", "forbidden",
            source_modules=[f"agentrl_core.{m}" for m in (
                "cli", "jobs", "launch", "train", "eval", "gateway", "rollout", "engine", "controlplane",
            )],
            forbidden_modules=["agentrl_core.testing"],
        ),
        *_contract(
            "train-does-not-import-launch", "train does not import launch, jobs or eval", "forbidden",
            source_modules=["agentrl_core.train"],
            forbidden_modules=["agentrl_core.launch", "agentrl_core.jobs", "agentrl_core.eval"],
        ),
        *_contract(
            "plugins-use-public-api", "plugins import only core's public modules and documented kits", "forbidden",
            source_modules=plugins, forbidden_modules=PLUGIN_FORBIDDEN, allow_indirect_imports="True",
        ),
        *_contract(
            "no-cycles", "no import cycles between sibling packages or modules anywhere in core",
            "acyclic_siblings", ancestors=["agentrl_core"],
        ),
    ]
    Path(out).write_text("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1])
