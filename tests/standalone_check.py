"""Run by ``nox -s standalone`` inside a venv holding only wheels built from ``git archive``.

Checks that every installed agentrl plugin loads and that the environments pass the
conformance check with their packaged data. Run from a folder outside any checkout, so that
nothing can be imported or read from a repository.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

ENVIRONMENTS = {  # name -> config: the embedded backends, no external service
    "calc": None,
    "db": {"backend": "sqlite"},
    "kg": {"backend": "embedded"},
    "webshop": None,
    "alfworld": {"start_timeout": 600, "reset_timeout": 300, "step_timeout": 120},
}


def main() -> int:
    import agentrl_core

    listing = subprocess.run(["agentrl", "plugins", "--json"], capture_output=True, text=True, check=True)
    records = json.loads(listing.stdout)
    failed = [r for r in records if r["status"] != "ok"]
    print(f"agentrl plugins: {', '.join(r['name'] + ' ' + r['status'] for r in records)}")
    if failed:
        print(f"plugins that failed to load: {failed}", file=sys.stderr)
        return 1
    if "site-packages" not in agentrl_core.__file__:
        print(f"agentrl_core was imported from {agentrl_core.__file__}, not from an installed wheel", file=sys.stderr)
        return 1

    from agentrl_core.testing import check_environment

    for name, config in ENVIRONMENTS.items():
        started = time.perf_counter()
        report = check_environment(name, config, oracle_samples=2)
        print(f"check_environment({name!r}): {len(report.checks)} checks passed in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
