"""The data files this plugin ships (sha256 as recorded in data/PROVENANCE.md)."""

from __future__ import annotations

import os
from pathlib import Path

from agentrl_core.datafiles import locate, verify_sha256

PACKAGE = "agentrl_env_kg"
SUBDIR = "kg"

SHA256 = {
    "agentbench/std.json": "1265d4e35602b126d2bd947fcb1c17722e08ff5076c5282508e3530ede18109c",
    "agentbench/dev.json": "5e28f8504ef98c513fa90090fc9543dbad54990723cc28854e2ba3ce1536d994",
    "agentbench/kg_rl_all.json": "54a1d671f7669898ddc195638efccdd96f3c3baf2fc644d88bcabd31a0d885f4",
    "agentbench/ontology/vocab.json": "6a178fa7f348631d816e37a384a89039b6ef1903c8797c4a20fbe97074ba6453",
    "agentbench/ontology/fb_roles": "052ec0a1083b5cf83cfbf7f56f5d864e363382e3210e9a482da6e52ca37392ba",
    "agentbench/ontology/fb_types": "d7ccacde076ddb2f71de450c5670e279ea0ad4e73d274d08af9e237c765fa8ea",
    "agentbench/ontology/reverse_properties": "8c120e0f7ee074fa528f4732ede588597a9c3df767a59b7c8e02114ed39b35ac",
    "fb15k237/fb15k237_triples.tsv.gz": "7f5e62723b3057d9d09b9653a5833e9cbefeb0e4e7d2c16048be61c405656536",
    "fb15k237/kgbert/entity2text.txt": "16beedcfad3d32696e8b0b98cfa0f5eeb144f5142225f227a64fd9ce37447da5",
}

# AgentBench index sets -> files, in upstream order (index i is upstream's index i).
AGENTBENCH_SPLITS = {"std": "agentbench/std.json", "dev": "agentbench/dev.json", "train": "agentbench/kg_rl_all.json"}

_verified: set[Path] = set()


def data_file(relpath: str, override: str | os.PathLike | None = None) -> Path:
    """Locate a shipped file (config dir, AGENTRL_DATA_DIR, package data), sha256-checked once."""
    path = locate(relpath, package=PACKAGE, subdir=SUBDIR, override=override)
    if path not in _verified:
        verify_sha256(path, SHA256[relpath])
        _verified.add(path)
    return path
