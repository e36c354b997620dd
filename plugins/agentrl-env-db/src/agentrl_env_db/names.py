"""Names of session databases and users, and whether their owner is still alive.

A name is ``<prefix><host>_<pid>_<created>_<n>`` (at most 32 characters, MySQL's limit for
user names): ``host`` is 6 hex digits of the machine's host name, ``pid`` the worker
process, ``created`` the session's creation time (epoch seconds, base 36) and ``n`` a
counter. The sweeper removes a name when its process is gone: on this host when the pid
does not exist or belongs to a process started after the session was created (pid reuse);
for other hosts, whose processes it cannot see, when the session is older than
``sweep_max_age``.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import socket
import time

from attrs import frozen

_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def base36(n: int) -> str:
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = _DIGITS[r] + out
        if n == 0:
            return out


def host_tag(hostname: str | None = None) -> str:
    return hashlib.sha1((hostname or socket.gethostname()).encode()).hexdigest()[:6]


@frozen
class SessionName:
    prefix: str
    host: str
    pid: int
    created: int
    n: int

    def __str__(self) -> str:
        return f"{self.prefix}{self.host}_{self.pid}_{base36(self.created)}_{base36(self.n)}"


def parse(name: str, prefix: str) -> SessionName | None:
    m = re.fullmatch(re.escape(prefix) + r"([0-9a-f]{6})_(\d+)_([0-9a-z]+)_([0-9a-z]+)", name)
    if m is None:
        return None
    return SessionName(prefix, m.group(1), int(m.group(2)), int(m.group(3), 36), int(m.group(4), 36))


class NameFactory:
    """Fresh names for this process."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.host = host_tag()
        self._counter = itertools.count()

    def new(self) -> SessionName:
        name = SessionName(self.prefix, self.host, os.getpid(), int(time.time()), next(self._counter))
        if len(str(name)) > 32:  # only with a pid past 7 digits and a huge counter
            raise ValueError(f"session name {name} is longer than MySQL's 32-character limit")
        return name


def _boot_time() -> float | None:
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def process_start_time(pid: int) -> float | None:
    """Epoch seconds at which ``pid`` started (Linux), or None if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    boot = _boot_time()
    if boot is None:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name may contain spaces
    ticks = int(fields[19])  # field 22 of stat(5); fields[0] is field 3
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_orphan(name: SessionName, *, max_age: float, now: float | None = None, host: str | None = None) -> bool:
    """True when no live process can own the session ``name`` any more."""
    now = time.time() if now is None else now
    if name.host != (host or host_tag()):
        return now - name.created > max_age
    if not pid_alive(name.pid):
        return True
    started = process_start_time(name.pid)
    # Names carry whole seconds; a process started 2 s after the session cannot own it.
    return started is not None and started > name.created + 2
