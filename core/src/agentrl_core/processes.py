"""Child processes: the one place core starts, watches and stops them.

* :func:`popen`: ``subprocess.Popen`` with the two things every long-lived child needs:
  ``detach`` (its own session and process group, and SIGTERM when the parent dies, see
  :func:`detach_and_die_with_parent`) and ``cpus`` (CPU affinity);
* :class:`ChildProcess`: a started child, stopped with SIGTERM and, after a grace period,
  SIGKILL, sent to its whole process group (``group=True``: a server and everything it
  started) or to the child alone (``group=False``: a child that stops its own children, or
  one that shares the caller's process group);
* :class:`ServiceProcess`: a child that announces where it listens on stdout (``... listening
  on http://host:port/...``): the controller and task workers of the embedded control plane.
  Its output is copied to a log file; it runs detached and is stopped as a group, so a
  crashed parent run does not leave servers behind;
* :func:`agentrl_command` (the ``agentrl`` CLI of an interpreter) and :func:`tail` (the end
  of a log, for error messages).

Engine drivers keep their processes in :class:`agentrl_core.rollout.drivers.ManagedProcesses`,
and tests start ``agentrl`` services with :func:`agentrl_core.testing.controlplane.spawn`;
both are built on :class:`ChildProcess`.
"""

from __future__ import annotations

import contextlib
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
from typing import Any

from agentrl_core.errors import AgentrlError

log = logging.getLogger(__name__)

_URL = re.compile(r"listening on (https?://\S+)")


class ServiceError(AgentrlError):
    """A child service did not start."""


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


def popen(argv: Sequence[str], *, env: Mapping[str, str] | None = None, detach: bool = True,
          cpus: Sequence[int] | None = None, **kwargs: Any) -> subprocess.Popen:
    """Start ``argv`` with the complete environment ``env`` (``None``: this process's).

    ``detach`` runs :func:`detach_and_die_with_parent` in the child; ``cpus`` pins it to
    those cores. Other keywords go to ``subprocess.Popen`` (``stdout``, ``text``, ...).
    """
    cpus = list(cpus) if cpus else None
    preexec = None
    if detach or cpus:
        def preexec() -> None:  # runs in the child before exec
            if detach:
                detach_and_die_with_parent()
            if cpus and hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, cpus)

    return subprocess.Popen(list(argv), env=dict(env) if env is not None else None, preexec_fn=preexec, **kwargs)


class ChildProcess:
    """A started child process; ``group`` says whether signals go to its process group or to it alone."""

    def __init__(self, name: str, proc: subprocess.Popen, *, group: bool) -> None:
        self.name = name
        self.proc = proc
        self.group = group

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, sig: int) -> None:
        if self.group:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: no chance to clean up (tests of failure handling use this)."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.send(signal.SIGKILL)
        self.proc.wait()

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL if it has not exited after ``grace`` seconds; returns the exit code."""
        if self.proc.poll() is None:
            try:
                self.send(signal.SIGTERM)
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0f s; killing it", self.name, grace)
                self.kill()
            except ProcessLookupError:
                pass
        return self.proc.returncode


class ServiceProcess:
    """A service started as a detached child that reports ``listening on URL`` on stdout."""

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
        self.child: ChildProcess | None = None
        self._found = threading.Event()
        self._pump: threading.Thread | None = None

    @property
    def proc(self) -> subprocess.Popen | None:
        return self.child.proc if self.child else None

    def start(self, timeout: float = 120.0) -> str:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        proc = popen(self.argv, env=self.env, detach=True, cpus=self.cpus, stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, bufsize=1)
        self.child = ChildProcess(self.name, proc, group=True)
        self._pump = threading.Thread(target=self._copy_output, name=f"log-{self.name}", daemon=True)
        self._pump.start()
        deadline = time.monotonic() + timeout
        while not self._found.wait(0.1):
            if proc.poll() is not None:
                raise ServiceError(
                    f"{self.name} exited with code {proc.returncode} before it was ready; "
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
        return tail(self.log_path, lines, missing="")

    @property
    def pid(self) -> int | None:
        return self.child.pid if self.child else None

    def alive(self) -> bool:
        return self.child is not None and self.child.alive()

    def kill(self) -> None:
        """SIGKILL the whole process group (tests of failure handling use this)."""
        if self.child is not None:
            self.child.kill()

    def stop(self, grace: float = 10.0) -> None:
        if self.child is not None:
            self.child.stop(grace)


def tail(path: str | os.PathLike, lines: int = 30, *, missing: str = "(no log)") -> str:
    """The last ``lines`` lines of a log file (``missing`` when it cannot be read)."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return missing


def agentrl_command(*args: str, python: str | None = None) -> list[str]:
    """The ``agentrl`` CLI of ``python`` (default: this interpreter), without the console script on PATH."""
    return [python or sys.executable, "-m", "agentrl_core.cli.main", *args]
