"""``agentrl plugins``: list installed plugins and what they provide."""

from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plugins", help="list installed plugins, their versions and status")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--all", action="store_true", help="include core's built-in components and disabled plugins")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from agentrl_core.plugins import get_plugin_manager
    from agentrl_core.registry import list_plugins

    records = list_plugins(get_plugin_manager(), include_core=args.all)
    if not args.all:
        records = [r for r in records if r.status != "disabled"]
    if args.json:
        print(json.dumps([r.to_json() for r in records], indent=2))
        return 0
    if not records:
        print("no agentrl plugins installed (agentrl plugins --all shows core's built-ins)")
        return 0
    rows = [("NAME", "DISTRIBUTION", "VERSION", "STATUS", "PROVIDES")]
    for r in records:
        provides = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in sorted(r.provides.items()))
        status = r.status if r.ok else f"{r.status}: {r.error}"
        rows.append((r.name, r.distribution, r.version, status, provides or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4])
    return 0
