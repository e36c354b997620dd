"""Where WebShop's data files are found, and their checksums.

Shipped files (the package's ``data/`` folder, see its PROVENANCE.md) are found by
:func:`agentrl_core.datafiles.locate`: the config's ``data_dir``, ``$AGENTRL_DATA_DIR/webshop``,
then the package's ``data/`` folder. Each is checked against its sha256.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from agentrl_core.datafiles import locate, verify_sha256

PACKAGE = "agentrl_env_webshop"
SUBDIR = "webshop"

SHIPPED_SHA256 = {
    "human_goals.json": "b68746ed66cd31fdc5f70eb3f5831a46b38163563b57a66ddcab8fd60ee0cbdc",
    "goal_query_map.json": "1524f438ffbc51c7e308e635d7d9e14fa696b08f5d4300922d454ef0105cea86",
    "reference_runs/std_observed_products.json": "dd23f2c9db4ef7f88f75aa41e6d7292a4ce0c3f459cb16ece40b88a5771e4b20",
}
BUNDLED_DIR = "bundled"


def locate_shipped(relpath: str, data_dir: str | os.PathLike | None = None) -> Path:
    """A shipped data file (``human_goals.json``, ...), checked against its sha256."""
    return locate(relpath, package=PACKAGE, subdir=SUBDIR, override=data_dir, sha256=SHIPPED_SHA256[relpath])


def bundled_manifest(data_dir: str | os.PathLike | None = None) -> tuple[Path, dict[str, Any]]:
    """The bundled catalog's folder and its manifest."""
    path = locate(f"{BUNDLED_DIR}/manifest.json", package=PACKAGE, subdir=SUBDIR, override=data_dir)
    return path.parent, json.loads(path.read_text(encoding="utf-8"))


def bundled_file(name: str, folder: Path, manifest: dict[str, Any]) -> Path:
    path = folder / name
    verify_sha256(path, manifest["files"][name])
    return path


def default_cache_dir() -> Path:
    root = os.environ.get("AGENTRL_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "agentrl")
    return Path(root) / "webshop"
