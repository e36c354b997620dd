"""Which graph, store and ontology a config means (blocking; called from a worker thread)."""

from __future__ import annotations

import functools
import shutil
import time
from pathlib import Path
from typing import Any

from agentrl_core.errors import EnvError
from agentrl_env_kg import fb15k237, ontology, store
from agentrl_env_kg.config import KGConfig
from agentrl_env_kg.datafiles import SHA256, data_file
from agentrl_env_kg.ontology import Ontology


@functools.lru_cache(maxsize=4)
def _fb15k237_ontology(data_dir: str | None) -> Ontology:
    paths = {r for _, r, _ in fb15k237.read_triples(data_file(fb15k237.TRIPLES, data_dir))}
    roles = ontology.read_roles(data_file(fb15k237.ROLES, data_dir))
    schema = fb15k237.build_schema(paths, roles, ontology.read_reverse_properties(data_file(fb15k237.REVERSE, data_dir)))
    return Ontology(frozenset(schema), frozenset(), {n: i.range for n, i in schema.items()})


@functools.lru_cache(maxsize=4)
def _agentbench_ontology(data_dir: str | None) -> Ontology:
    return ontology.agentbench_ontology(
        data_file("agentbench/ontology/vocab.json", data_dir), data_file("agentbench/ontology/fb_roles", data_dir)
    )


def ontology_for(cfg: KGConfig) -> Ontology:
    if cfg.source == "agentbench":
        return _agentbench_ontology(cfg.data_dir)
    return _fb15k237_ontology(cfg.data_dir)


def _bundled_key() -> str:
    return store.fingerprint([f"fb15k237-v{fb15k237.GRAPH_VERSION}", *(SHA256[f] for f in fb15k237.SOURCE_FILES)])


def _files_key(files: list[str]) -> str:
    parts = []
    for name in files:
        path = Path(name).expanduser().resolve()
        if not path.is_file():
            raise EnvError(f"environments.kg.graph_files: {name} is not a file")
        stat = path.stat()
        parts.append(f"{path}:{stat.st_size}:{stat.st_mtime_ns}")
    return store.fingerprint(["files-v1", *parts])


def _concatenate(files: list[str]):
    def write(out: Path) -> int:
        n = 0
        with open(out, "wb") as dst:
            for name in files:
                with open(Path(name).expanduser(), "rb") as src:
                    shutil.copyfileobj(src, dst)
                dst.write(b"\n")
                n += 1
        return -1 if n else 0  # statement count unknown without parsing

    return write


def store_spec(cfg: KGConfig) -> tuple[Path, str, Any]:
    """(store directory, content key, writer of the N-Triples to load)."""
    if cfg.graph_files:
        key, writer, stem = _files_key(list(cfg.graph_files)), _concatenate(list(cfg.graph_files)), "files"
    else:
        if cfg.source == "agentbench":
            raise EnvError(
                "environments.kg: the agentbench questions need Freebase; set backend: sparql with an endpoint, "
                "or graph_files with a Freebase dump for the embedded store"
            )
        key, stem = _bundled_key(), "fb15k237"
        writer = lambda path: fb15k237.Graph(cfg.data_dir).write_ntriples(path)  # noqa: E731
    path = Path(cfg.store_path).expanduser() if cfg.store_path else store.cache_root() / f"{stem}-{key}"
    return path, key, writer


def open_embedded(cfg: KGConfig):
    """Open (building on first use) the embedded store; returns (store, info for benchmarks)."""
    path, key, writer = store_spec(cfg)
    start = time.perf_counter()
    marker = store.ensure_store(path, key, writer)
    handle = store.open_read_only(path)
    return handle, {"path": str(path), "seconds": time.perf_counter() - start, **marker}
