"""The bundled ALFWorld games: split lists, index sets, archives unpacked to a cache.

Files (in the package under ``agentrl_env_alfworld/data/``; see its PROVENANCE.md):

* ``agentbench/{new_std,dev,train_valid}.json``: AgentBench's split lists (upstream paths);
* ``games_valid_unseen.tar.xz``, ``games_train.tar.xz``: the ``game.tw-pddl`` files;
* ``games_manifest.tsv``: one row per bundled game with its sha256;
* ``agentbench/logic/alfred.{pddl,twl2}``: the ALFWorld 0.2.2 domain and grammar AgentBench uses.

Index sets keep upstream's numbering (index i is position i of the flattened upstream list),
so a game missing from the bundle leaves a gap: ``std`` has 93 of new_std's 109 indices,
``train`` 2,714 of train_valid's 3,150, ``dev`` all 20. ``train-extra`` numbers the 839
bundled train games that train_valid does not list (in manifest order).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import tarfile
import tempfile
import threading
from pathlib import Path

from attrs import frozen

from agentrl_core.datafiles import DataFileError, locate, sha256_of

PACKAGE = "agentrl_env_alfworld"
SUBDIR = "alfworld"

SHA256 = {
    "games_valid_unseen.tar.xz": "952a110a334e0c486da8e9f87f4c3383a59270b7811bf34cdb47a6c46955246b",
    "games_train.tar.xz": "9bf7c9f5969786c1147f6512182bf06171f2cd2cac632825f6aed06b13017cfe",
    "games_manifest.tsv": "b8c597f4194a20d3ec031cfe332acf3f3d15fb274229a672a77baf520712d860",
    "agentbench/new_std.json": "679592b9e5c2ff26ebfe5b7556ef1b6c0ba60d1f0b172c7420b11c86d83b9bbf",
    "agentbench/dev.json": "20b8f28be96aa2c011edd5a43653c5ee8089d51442e42cc8f361ce9866cc6ce0",
    "agentbench/train_valid.json": "504c5725346d7588b1b1a5afe4b1a18c2d5cf5f9520a212c9fd45cc6c42f5bf8",
    "agentbench/logic/alfred.pddl": "e64e8c0002648c403e05adedc25be5ea8b9863924f32cc7611051bed1f386e46",
    "agentbench/logic/alfred.twl2": "d955e6db384c68ac5797e881b795fd36d788e87a03547f9a87e48fbd7c5b361b",
}

SPLIT_LISTS = {"std": "agentbench/new_std.json", "dev": "agentbench/dev.json", "train": "agentbench/train_valid.json"}
EXTRA_SPLIT = "train-extra"
ARCHIVES = {"valid_unseen": "games_valid_unseen.tar.xz", "train": "games_train.tar.xz"}
LOGIC = ("agentbench/logic/alfred.pddl", "agentbench/logic/alfred.twl2")
_COMPLETE = ".complete"


@frozen
class GameRef:
    """One bundled game: where it sits in an index set and in its archive."""

    split: str
    index: int
    path: str  # the upstream relative path, e.g. json_2.1.1/valid_unseen/<task>/<trial>/game.tw-pddl
    archive: str  # archive_split of the manifest: valid_unseen or train
    sha256: str

    @property
    def task_type(self) -> str:
        return self.path.split("/")[2].split("-")[0]


def default_cache_dir() -> Path:
    """``$AGENTRL_CACHE_DIR/alfworld``, else ``$XDG_CACHE_HOME/agentrl/alfworld`` or ``~/.cache/agentrl/alfworld``."""
    if os.environ.get("AGENTRL_CACHE_DIR"):
        return Path(os.environ["AGENTRL_CACHE_DIR"]) / "alfworld"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agentrl" / "alfworld"


class GameLibrary:
    """Index sets over the bundled games and their files (unpacked on first use, thread-safe)."""

    def __init__(self, data_dir: str | None = None, cache_dir: str | None = None) -> None:
        self.data_dir = data_dir
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self._lock = threading.Lock()
        self._unpacked: dict[str, Path] = {}
        self.manifest = self._read_manifest()
        self.upstream: dict[str, list[str]] = {split: self._read_list(rel) for split, rel in SPLIT_LISTS.items()}
        self._refs: dict[str, dict[int, GameRef]] = {}
        for split, paths in self.upstream.items():
            self._refs[split] = {
                i: GameRef(split, i, p, *self.manifest[p]) for i, p in enumerate(paths) if p in self.manifest
            }
        listed = {p for paths in self.upstream.values() for p in paths}
        extra = [p for p, (archive, _) in self.manifest.items() if archive == "train" and p not in listed]
        self._refs[EXTRA_SPLIT] = {i: GameRef(EXTRA_SPLIT, i, p, *self.manifest[p]) for i, p in enumerate(extra)}

    # -- files -------------------------------------------------------------------------

    def locate(self, relpath: str) -> Path:
        return locate(relpath, package=PACKAGE, subdir=SUBDIR, override=self.data_dir, sha256=SHA256[relpath])

    def _read_manifest(self) -> dict[str, tuple[str, str]]:
        path = self.locate("games_manifest.tsv")
        with open(path, encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
        return {r["path"]: (r["archive_split"], r["sha256"]) for r in rows if r["archive_split"] in ARCHIVES}

    def _read_list(self, relpath: str) -> list[str]:
        content = json.loads(self.locate(relpath).read_text(encoding="utf-8"))
        # Upstream flattens the per-task-type lists in file order; index i is position i.
        return [p for paths in content.values() for p in paths]

    def logic_files(self) -> tuple[Path, Path]:
        """The AgentBench (ALFWorld 0.2.2) domain and grammar files."""
        return self.locate(LOGIC[0]), self.locate(LOGIC[1])

    # -- index sets --------------------------------------------------------------------

    def index_sets(self) -> dict[str, list[int]]:
        return {split: sorted(refs) for split, refs in self._refs.items()}

    def ref(self, split: str, index: int) -> GameRef:
        return self._refs[split][index]

    def missing(self, split: str) -> list[tuple[int, str]]:
        """Upstream indices of ``split`` whose games are not bundled."""
        return [(i, p) for i, p in enumerate(self.upstream.get(split, [])) if i not in self._refs[split]]

    # -- game files --------------------------------------------------------------------

    def game_file(self, ref: GameRef) -> Path:
        """The unpacked game file (unpacks its archive on first use; blocking)."""
        return self.unpacked(ref.archive) / ref.path

    def unpacked(self, archive: str) -> Path:
        with self._lock:
            if archive not in self._unpacked:
                self._unpacked[archive] = self._unpack(archive)
            return self._unpacked[archive]

    def _unpack(self, archive: str) -> Path:
        relpath = ARCHIVES[archive]
        target = self.cache_dir / f"{archive}-{SHA256[relpath][:16]}"
        if (target / _COMPLETE).exists():
            return target
        source = self.locate(relpath)  # checks the archive's sha256
        expected = {p: sha for p, (a, sha) in self.manifest.items() if a == archive}
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{archive}-", dir=self.cache_dir))
        try:
            seen = set()
            with tarfile.open(source, "r:xz") as tar:
                for member in tar:
                    # Only manifest paths are written, so no member can escape the staging folder.
                    if not member.isfile() or member.name not in expected:
                        continue
                    out = staging / member.name
                    out.parent.mkdir(parents=True, exist_ok=True)
                    with tar.extractfile(member) as src, open(out, "wb") as dst:
                        shutil.copyfileobj(src, dst)
                    if sha256_of(out) != expected[member.name]:
                        raise DataFileError(f"{relpath}: {member.name} does not match games_manifest.tsv; the archive is corrupt")
                    seen.add(member.name)
            if seen != set(expected):
                raise DataFileError(f"{relpath} lacks {len(set(expected) - seen)} games listed in games_manifest.tsv")
            (staging / _COMPLETE).write_text("ok\n")
            try:
                os.rename(staging, target)
            except OSError:
                if not (target / _COMPLETE).exists():  # another process finished first, else a real error
                    raise
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        return target
