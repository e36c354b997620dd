"""Find a plugin's data files: config path, ``AGENTRL_DATA_DIR``, package data, or checkout.

Environment plugins ship their data inside the wheel (``<package>/data/...``), so
``pip install agentrl-env-db`` works without a repository. In a development checkout the
same files are read from the repository's ``shared/data`` folder. Lookup order for
``locate("standard.jsonl", package="agentrl_env_db", shared="db")``:

1. ``override`` (a directory from the plugin's config), if given;
2. ``$AGENTRL_DATA_DIR/db/standard.jsonl``;
3. the package data ``agentrl_env_db/data/standard.jsonl``;
4. ``shared/data/db/standard.jsonl`` in a parent folder of the installed package (checkouts).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

from agentrl_core.errors import AgentrlError


class DataFileError(AgentrlError):
    """A data file is missing or does not match its recorded checksum."""


def candidates(relpath: str, *, package: str, shared: str | None = None, override: str | os.PathLike | None = None) -> list[Path]:
    out: list[Path] = []
    if override:
        out.append(Path(override) / relpath)
    env_dir = os.environ.get("AGENTRL_DATA_DIR")
    if env_dir:
        out.append(Path(env_dir) / (shared or "") / relpath)
    spec = importlib.util.find_spec(package)
    if spec is not None and spec.submodule_search_locations:
        pkg_dir = Path(next(iter(spec.submodule_search_locations)))
        out.append(pkg_dir / "data" / relpath)
        if shared is not None:
            for parent in pkg_dir.parents:
                shared_dir = parent / "shared" / "data"
                if shared_dir.is_dir():
                    out.append(shared_dir / shared / relpath)
                    break
    return out


def locate(
    relpath: str,
    *,
    package: str,
    shared: str | None = None,
    override: str | os.PathLike | None = None,
    sha256: str | None = None,
) -> Path:
    """Return the first existing candidate path, checked against ``sha256`` when given."""
    tried = candidates(relpath, package=package, shared=shared, override=override)
    for path in tried:
        if path.exists():
            if sha256 is not None and path.is_file():
                verify_sha256(path, sha256)
            return path
    raise DataFileError(
        f"data file {relpath!r} of {package} not found; looked in: {', '.join(str(p) for p in tried) or 'nowhere'}. "
        "Reinstall the plugin, or set AGENTRL_DATA_DIR to a folder holding it."
    )


def sha256_of(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_sha256(path: str | os.PathLike, expected: str) -> None:
    actual = sha256_of(path)
    if actual != expected:
        raise DataFileError(
            f"{path} has sha256 {actual[:12]}..., expected {expected[:12]}...: the file is corrupt or "
            "a different version; reinstall the plugin or point AGENTRL_DATA_DIR at the right data."
        )
