"""Child processes that announce their address on stdout: controller, task workers, engines.

:class:`ServiceProcess` starts a command, copies its output to a log file, and waits for
the line that says where it listens (``... listening on http://host:port/...``). Every
child is put in its own process group and is terminated (then killed) on ``stop``, so a
crashed parent run does not leave servers behind.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from agentrl_core.errors import AgentrlError

log = logging.getLogger(__name__)

_URL = re.compile(r"listening on (https?://\S+)")


class ServiceError(AgentrlError):
    """A child service did not start."""


class ServiceProcess:
    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: str | os.PathLike,
        env: Mapping[str, str] | None = None,
        cpus: Sequence[int] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self.env = {**os.environ, **(env or {})}
        self.cpus = list(cpus) if cpus else None
        self.url: str | None = None
        self.proc: subprocess.Popen | None = None
        self._found = threading.Event()
        self._pump: threading.Thread | None = None

    def start(self, timeout: float = 120.0) -> str:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cpus = self.cpus

        def preexec() -> None:  # runs in the child before exec
            detach_and_die_with_parent()
            if cpus and hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, cpus)

        self.proc = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=self.env, preexec_fn=preexec, text=True, bufsize=1,
        )
        self._pump = threading.Thread(target=self._copy_output, name=f"log-{self.name}", daemon=True)
        self._pump.start()
        deadline = time.monotonic() + timeout
        while not self._found.wait(0.1):
            if self.proc.poll() is not None:
                raise ServiceError(
                    f"{self.name} exited with code {self.proc.returncode} before it was ready; "
                    f"see {self.log_path}:\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise ServiceError(f"{self.name} did not report its address within {timeout:.0f} s; see {self.log_path}")
        assert self.url is not None
        return self.url

    def _copy_output(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with open(self.log_path, "a", encoding="utf-8") as out:
            for line in self.proc.stdout:
                out.write(line)
                out.flush()
                if self.url is None:
                    match = _URL.search(line)
                    if match:
                        self.url = match.group(1).rstrip(",.;)")
                        self._found.set()

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group (tests of failure handling use this)."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, grace: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0f s; killing it", self.name, grace)
            self.kill()
        except ProcessLookupError:
            pass


def detach_and_die_with_parent() -> None:
    """``preexec_fn`` for servers: their own process group, and SIGTERM when the parent dies.

    The process group lets ``stop`` signal a server and everything it started; the parent
    death signal (Linux ``PR_SET_PDEATHSIG``) makes sure a parent killed with SIGKILL does
    not leave the server running.
    """
    os.setsid()
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def agentrl_command(*args: str) -> list[str]:
    """The ``agentrl`` CLI of this interpreter (works without the console script on PATH)."""
    return [sys.executable, "-m", "agentrl_core.cli.main", *args]
