"""Find a plugin's data files: config path, ``AGENTRL_DATA_DIR``, or the package's own data.

Environment plugins ship their data inside their package (``<package>/data/...``), so a
wheel, an sdist and a repository checkout all carry it and nothing outside the installed
package is read. Lookup order for
``locate("standard.jsonl", package="agentrl_env_db", subdir="db")``:

1. ``override`` (a directory from the plugin's config), if given;
2. ``$AGENTRL_DATA_DIR/db/standard.jsonl`` (one folder holding every plugin's data, one
   sub-folder per environment);
3. the package data ``agentrl_env_db/data/standard.jsonl``.

With ``sha256`` the file found is checked, so a stale or corrupt copy fails loudly instead of
producing different tasks.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

from agentrl_core.errors import AgentrlError

__all__ = ["DataFileError", "candidates", "locate", "package_data_dir", "sha256_of", "verify_sha256"]


class DataFileError(AgentrlError):
    """A data file is missing or does not match its recorded checksum."""


def package_data_dir(package: str) -> Path | None:
    """``<package>/data`` of an importable package (without importing it), or None."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def candidates(
    relpath: str, *, package: str, subdir: str | None = None, override: str | os.PathLike | None = None
) -> list[Path]:
    """Where :func:`locate` looks for ``relpath``, in order."""
    out: list[Path] = []
    if override:
        out.append(Path(override) / relpath)
    env_dir = os.environ.get("AGENTRL_DATA_DIR")
    if env_dir:
        out.append(Path(env_dir) / (subdir or "") / relpath)
    data_dir = package_data_dir(package)
    if data_dir is not None:
        out.append(data_dir / relpath)
    return out


def locate(
    relpath: str,
    *,
    package: str,
    subdir: str | None = None,
    override: str | os.PathLike | None = None,
    sha256: str | None = None,
) -> Path:
    """Return the first existing candidate path, checked against ``sha256`` when given."""
    tried = candidates(relpath, package=package, subdir=subdir, override=override)
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
