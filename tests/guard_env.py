"""Used by nox: fail if this venv holds an agentrl plugin it should not, or a non-editable core.

Usage: python tests/guard_env.py [allowed-distribution ...]
"""

import json
import sys
from importlib import metadata

UPSTREAM = {"agentrl-worker", "agentrl-eval"}  # the upstream packages own another namespace


def main(allowed: list[str]) -> int:
    problems = []
    core = None
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name == "agentrl-core":
            core = dist
        elif name.startswith("agentrl-") and name not in UPSTREAM and name not in allowed:
            problems.append(f"unexpected plugin distribution installed: {name}")
    if core is None:
        problems.append("agentrl-core is not installed")
    else:
        direct = core.read_text("direct_url.json")
        editable = bool(direct and json.loads(direct).get("dir_info", {}).get("editable"))
        if not editable:
            problems.append("agentrl-core is installed but not editable (expected -e core)")
    for p in problems:
        print(f"guard_env: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main([a.lower() for a in sys.argv[1:]]))
