"""The game worker process: ``python -m agentrl_env_alfworld.worker``.

It speaks JSON lines on stdin/stdout, one request and one reply at a time::

    {"op": "reset", "game": "/cache/.../game.tw-pddl", "logic": ["alfred.pddl", "alfred.twl2"] | null}
        -> {"ok": true, "observation": "-= Welcome ...", "admissible": [...], "won": false}
    {"op": "step", "command": "go to desk 1"}
        -> {"ok": true, "observation": "You arrive at loc 14. ...", "admissible": [...], "won": false}
    {"op": "memory"} -> {"ok": true, "rss_kb": 123456}

A request that fails answers ``{"ok": false, "error": "..."}``. The first line it writes is
``{"ok": true, "ready": true, "pid": N}`` once the engine is imported. It exits at end of input.
Anything the engine prints goes to stderr, so it cannot corrupt the protocol stream.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO


def rss_kb() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return -1


class Worker:
    def __init__(self) -> None:
        from agentrl_env_alfworld.game import Engine

        self.engine = Engine()
        self.game: Any = None
        self._logic: dict[tuple[str, str], tuple[str, str]] = {}

    def logic(self, paths: list[str] | None) -> tuple[str, str] | None:
        if not paths:
            return None
        key = (paths[0], paths[1])
        if key not in self._logic:
            self._logic[key] = (Path(key[0]).read_text(encoding="utf-8"), Path(key[1]).read_text(encoding="utf-8"))
        return self._logic[key]

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        from agentrl_env_alfworld.game import read_game

        op = request.get("op")
        if op == "reset":
            self.game = None  # drop the previous game before building the next one
            self.game = self.engine.load(read_game(request["game"], self.logic(request.get("logic"))))
            return self._reply(self.game.intro)
        if op == "step":
            if self.game is None:
                raise RuntimeError("step before reset")
            return self._reply(self.game.step(str(request["command"])))
        if op == "memory":
            return {"ok": True, "rss_kb": rss_kb()}
        raise ValueError(f"unknown op {op!r}")

    def _reply(self, observation: str) -> dict[str, Any]:
        return {"ok": True, "observation": observation, "admissible": self.game.admissible, "won": self.game.won}


def serve(inp: TextIO, out: TextIO) -> None:
    worker = Worker()
    out.write(json.dumps({"ok": True, "ready": True, "pid": os.getpid()}) + "\n")
    out.flush()
    for line in inp:
        if not line.strip():
            continue
        try:
            reply = worker.handle(json.loads(line))
        except Exception as exc:  # reported to the parent, which ends the episode as task error
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def main() -> None:
    # Keep the protocol on a private copy of stdout; route fd 1 (and sys.stdout) to stderr so
    # prints from TextWorld, fast-downward or C code cannot interleave with replies.
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(sys.stdin, protocol)


if __name__ == "__main__":
    main()
