"""A private, throw-away MariaDB server for tests and benchmarks.

``PrivateMariaDB`` initializes a data directory (on ``/dev/shm`` when it exists, like
upstream's tmpfs-backed MySQL containers), starts ``mariadbd`` on a free loopback port,
waits until it answers, and stops it and deletes the directory on exit::

    with PrivateMariaDB() as server:
        env = DBEnvironment(DBConfig(backend="mysql", url=server.url))

It never touches a system service. The server is tuned for throw-away data (no binary
log, no fsync), which is also what a training server wants.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from agentrl_core.errors import EnvError

SERVER_BINARIES = ("mariadbd", "mysqld")
INSTALL_BINARIES = ("mariadb-install-db", "mysql_install_db")
MISSING = (
    "MariaDB server binaries not found (mariadbd and mariadb-install-db): install the "
    "mariadb-server package, e.g. run plugins/agentrl-env-db/tests/ci_setup.sh as root."
)
SERVER_OPTIONS = (
    "--skip-log-bin",
    "--skip-name-resolve",
    "--innodb-buffer-pool-size=128M",
    "--innodb-log-file-size=16M",
    "--innodb-flush-log-at-trx-commit=0",
    "--innodb-doublewrite=0",
    "--innodb-flush-method=nosync",
    "--max-connections=2000",
    "--table-open-cache=4000",
    "--performance-schema=OFF",
)


def _which(names: tuple[str, ...]) -> str | None:
    extra = os.pathsep.join(["/usr/sbin", "/usr/local/sbin", "/usr/bin"])
    for name in names:
        found = shutil.which(name, path=os.environ.get("PATH", "") + os.pathsep + extra)
        if found:
            return found
    return None


def _roomy(path: str, need_mb: int = 512) -> bool:
    """A writable folder with room for a small server (containers often have a 64 MB /dev/shm)."""
    if not (os.path.isdir(path) and os.access(path, os.W_OK)):
        return False
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize >= need_mb << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateMariaDB:
    def __init__(self, *, base_dir: str | None = None, startup_timeout: float = 60.0) -> None:
        self.server_bin = _which(SERVER_BINARIES)
        self.install_bin = _which(INSTALL_BINARIES)
        if self.server_bin is None or self.install_bin is None:
            raise EnvError(MISSING)
        if base_dir is None and _roomy("/dev/shm"):
            base_dir = "/dev/shm"
        self.base_dir = base_dir
        self.startup_timeout = startup_timeout
        self.root: Path | None = None
        self.process: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"mysql://root@127.0.0.1:{self.port}"

    def __enter__(self) -> PrivateMariaDB:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="agentrl-mariadb-", dir=self.base_dir))
        datadir = self.root / "data"
        user = ["--user=root"] if os.geteuid() == 0 else []
        install = subprocess.run(
            [self.install_bin, "--no-defaults", f"--datadir={datadir}", *user,
             "--auth-root-authentication-method=normal", "--skip-test-db", "--innodb-log-file-size=16M"],
            capture_output=True, text=True,
        )
        if install.returncode != 0:
            self.stop()
            raise EnvError(f"mariadb-install-db failed: {(install.stderr or install.stdout).strip()[-500:]}")
        for _attempt in range(3):  # another process may grab the free port before the server does
            self.port = free_port()
            log = self.root / "error.log"
            self.process = subprocess.Popen(
                [self.server_bin, "--no-defaults", f"--datadir={datadir}", *user, f"--port={self.port}",
                 "--bind-address=127.0.0.1", f"--socket={self.root / 'mysqld.sock'}",
                 f"--pid-file={self.root / 'mysqld.pid'}", f"--log-error={log}", *SERVER_OPTIONS],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            if self._wait_ready(log):
                return
        tail = (self.root / "error.log").read_text(errors="replace")[-800:] if self.root else ""
        self.stop()
        raise EnvError(f"the private MariaDB server did not start; its log ends with: {tail}")

    def _wait_ready(self, log: Path) -> bool:
        import pymysql

        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False  # exited (e.g. the port was taken): the caller retries
            try:
                pymysql.connect(host="127.0.0.1", port=self.port, user="root", connect_timeout=2).close()
                return True
            except pymysql.err.OperationalError:
                time.sleep(0.05)  # poll readiness; bounded by the deadline above
        self.process.kill()
        self.process.wait()
        return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
