"""The persisted embedded store: built once from shipped files, then opened read-only.

A store directory holds an Oxigraph (RocksDB) database and a ``agentrl-kg-store.json``
marker written last. Building happens in a temporary sibling directory under an exclusive
file lock and is renamed into place, so concurrent workers build once, a crash leaves no
half-built store, and every opener afterwards gets a read-only handle (many processes may
read one store at once; RocksDB keeps memory bounded by its caches, not by the graph).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

MARKER = "agentrl-kg-store.json"


class StoreError(RuntimeError):
    """The embedded store could not be built or opened."""


def cache_root() -> Path:
    """``$AGENTRL_CACHE_DIR/kg``, else ``$XDG_CACHE_HOME/agentrl/kg`` or ``~/.cache/agentrl/kg``."""
    if os.environ.get("AGENTRL_CACHE_DIR"):
        return Path(os.environ["AGENTRL_CACHE_DIR"]) / "kg"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agentrl" / "kg"


def fingerprint(parts: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # blocks only while another process builds
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_marker(path: Path) -> dict | None:
    try:
        return json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None


def ensure_store(path: Path, key: str, write_ntriples: Callable[[Path], int]) -> dict:
    """Build the store at ``path`` unless a complete one for ``key`` is there; return its marker."""
    marker = read_marker(path)
    if marker and marker.get("key") == key:
        return marker
    with _locked(path.with_name(path.name + ".lock")):
        marker = read_marker(path)
        if marker and marker.get("key") == key:
            return marker  # another process built it while we waited
        return _build(path, key, write_ntriples)


def _build(path: Path, key: str, write_ntriples: Callable[[Path], int]) -> dict:
    import pyoxigraph

    start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=path.name + ".build-", dir=path.parent))
    try:
        nt = tmp / "graph.nt"
        statements = write_ntriples(nt)
        store = pyoxigraph.Store(str(tmp / "db"))
        store.bulk_load(path=str(nt), format=pyoxigraph.RdfFormat.N_TRIPLES)
        store.flush()
        del store  # closes the database
        nt.unlink()
        marker = {"key": key, "statements": statements, "build_seconds": round(time.perf_counter() - start, 2)}
        (tmp / "db" / MARKER).write_text(json.dumps(marker))
        if path.exists():
            shutil.rmtree(path)  # an outdated store (different key)
        os.replace(tmp / "db", path)
    except Exception as exc:
        raise StoreError(f"building the knowledge-graph store at {path} failed: {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("built knowledge-graph store %s (%d statements) in %.1fs", path, statements, marker["build_seconds"])
    return marker


def open_read_only(path: Path):
    import pyoxigraph

    if read_marker(path) is None:
        raise StoreError(f"{path} is not a complete knowledge-graph store; delete it and it will be rebuilt")
    try:
        return pyoxigraph.Store.read_only(str(path))
    except OSError as exc:
        raise StoreError(f"cannot open the knowledge-graph store {path}: {exc}") from exc
