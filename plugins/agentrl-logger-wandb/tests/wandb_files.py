"""Read what an offline W&B run wrote: the records of its ``run-<id>.wandb`` file.

The file is W&B's transaction log: a 7-byte header (``:W&B``, magic ``0xBEE1``, version),
then LevelDB's log format (32 KiB blocks of records, each with a 7-byte header: checksum,
length, type FULL/FIRST/MIDDLE/LAST), every record a ``wandb_internal_pb2.Record``. This is
what ``wandb sync`` uploads.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def raw_records(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:HEADER])
    assert ident == b":W&B" and magic == 0xBEE1, f"{path} is not a W&B transaction log"
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        space = BLOCK - pos % BLOCK
        if space < HEADER:  # a block's tail too short for a record header is padding
            pos += space
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0:  # zeros to the end of the block
            pos += space
            continue
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
            pending = b""


def records(path: Path) -> Iterator[Any]:
    for raw in raw_records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        yield record


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def wait_written(folder: Path, timeout: float = 60.0) -> Path:
    """The run's log file once its ``exit`` record is there.

    ``run.finish()`` returns before W&B's service process has written the offline file (it
    is a 7-byte header for a moment, then complete a second or two later).
    """
    deadline = time.monotonic() + timeout
    while True:
        files = list(folder.glob("run-*.wandb"))
        if files and any(r.WhichOneof("record_type") == "exit" for r in records(files[0])):
            return files[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"{folder}: no complete run-*.wandb file within {timeout:.0f} s")
        time.sleep(0.2)


def read_run(folder: Path) -> dict[str, Any]:
    """``{"run_id", "name", "config", "history", "tables"}`` of one ``offline-run-*`` folder.

    ``config``: the run record's config, decoded (W&B's ``_wandb`` entry left out), with later
    config records applied; ``history``: one dict per ``run.log`` call; ``tables``: the table
    files W&B wrote, decoded, by file name.
    """
    log_file = wait_written(folder)
    out: dict[str, Any] = {"config": {}, "history": [], "tables": {}}
    for record in records(log_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["run_id"] = record.run.run_id
            out["name"] = record.run.display_name
            out["config"].update({_key(i): json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            out["config"].update({_key(i): json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            out["history"].append({_key(i): json.loads(i.value_json) for i in record.history.item})
    out["config"].pop("_wandb", None)
    for path in sorted((folder / "files" / "media" / "table").glob("*.table.json")):
        out["tables"][path.name] = json.loads(path.read_text())
    return out
