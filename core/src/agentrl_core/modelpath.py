"""Check a model path before anything heavy loads it.

``transformers`` answers a missing folder with a long traceback about the Hub; the commands
check the path first and say in one sentence what is wrong and how to fix it.
"""

from __future__ import annotations

import re
from pathlib import Path

from agentrl_core.errors import ConfigError

__all__ = ["check_model_path"]

# "Qwen/Qwen2.5-7B-Instruct": a Hub repository id, which transformers resolves itself.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def check_model_path(path: str | None, *, key: str = "model.path") -> None:
    """Raise :class:`ConfigError` unless ``path`` is a Hugging Face model folder or a Hub id.

    A folder must hold ``config.json``. A string of the form ``org/name`` that is not an
    existing folder is left to transformers (it downloads from the Hub where one is reachable).
    """
    if not path:
        raise ConfigError(f"{key} is not set: give the folder of a Hugging Face model (e.g. one written by "
                          "`agentrl model init --out tiny`)")
    folder = Path(path).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise ConfigError(f"{key} {str(folder)!r} is a folder without config.json, so not a Hugging Face model "
                              "folder (`agentrl model init --out DIR` writes one; a checkpoint's final model is in "
                              "<run dir>/final_model)")
        return
    if folder.exists():
        raise ConfigError(f"{key} {str(folder)!r} is a file; it must be a Hugging Face model folder")
    if _HUB_ID.match(str(path)):
        return
    raise ConfigError(f"{key} {str(folder)!r} does not exist: give the folder of a Hugging Face model "
                      f"(e.g. `agentrl model init --out {path}` builds a tiny one there)")
