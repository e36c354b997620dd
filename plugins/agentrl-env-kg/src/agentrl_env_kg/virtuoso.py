"""A private Virtuoso instance for tests and benchmarks (Debian's ``virtuoso-opensource``).

It runs ``virtuoso-t`` in the foreground with its own ini and database folder on free
ports, bulk-loads N-Triples files with the standard loader (``ld_dir`` +
``rdf_loader_run``), serves SPARQL at ``http://127.0.0.1:<port>/sparql`` (the endpoint
upstream's Freebase image serves), and is stopped and its folder left to the caller::

    with VirtuosoServer(tmp_path) as server:
        server.load(["graph.nt"])
        env = KGEnvironment(KGConfig(backend="sparql", endpoint=server.endpoint))
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

log = logging.getLogger(__name__)

GRAPH = "http://rdf.freebase.com"
INSTALL_HINT = "install Debian's virtuoso-opensource-7-bin (apt-get install virtuoso-opensource-7-bin; tests/ci_setup.sh does it)"


class VirtuosoError(RuntimeError):
    """Virtuoso is missing, did not start, or failed to load data."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ini(root: Path, sql_port: int, http_port: int, buffers: int) -> str:
    return f"""[Database]
DatabaseFile = {root}/virtuoso.db
ErrorLogFile = {root}/virtuoso.log
LockFile = {root}/virtuoso.lck
TransactionFile = {root}/virtuoso.trx
xa_persistent_file = {root}/virtuoso.pxa
ErrorLogLevel = 7
FileExtend = 200
MaxCheckpointRemap = 2000
Striping = 0
TempStorage = TempDatabase

[TempDatabase]
DatabaseFile = {root}/virtuoso-temp.db
TransactionFile = {root}/virtuoso-temp.trx
MaxCheckpointRemap = 2000
Striping = 0

[Parameters]
ServerPort = 127.0.0.1:{sql_port}
NumberOfBuffers = {buffers}
MaxDirtyBuffers = {buffers * 3 // 4}
DirsAllowed = ., {root}
CheckpointInterval = 0
ThreadsPerQuery = 2
MaxClientConnections = 16

[HTTPServer]
ServerPort = 127.0.0.1:{http_port}
ServerRoot = {root}
MaxClientConnections = 16
ServerThreads = 16

[SPARQL]
ResultSetMaxRows = 1000000
MaxQueryExecutionTime = 120
MaxQueryCostEstimationTime = 0
"""


class VirtuosoServer:
    def __init__(self, root: str | Path, *, buffers: int = 20_000, startup_timeout: float = 60.0) -> None:
        self.root = Path(root).resolve()
        self.buffers = buffers
        self.startup_timeout = startup_timeout
        self.server_bin = shutil.which("virtuoso-t")
        self.isql_bin = shutil.which("isql-vt") or shutil.which("isql")
        if not self.server_bin or not self.isql_bin:
            raise VirtuosoError(f"the Virtuoso server binaries (virtuoso-t, isql-vt) are not on PATH: {INSTALL_HINT}")
        self.sql_port = self.http_port = 0
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/sparql"

    def start(self) -> VirtuosoServer:
        self.root.mkdir(parents=True, exist_ok=True)
        self.sql_port, self.http_port = _free_port(), _free_port()
        ini = self.root / "virtuoso.ini"
        ini.write_text(_ini(self.root, self.sql_port, self.http_port, self.buffers))
        log_file = open(self.root / "server.out", "wb")  # noqa: SIM115 - owned by the process
        self.process = subprocess.Popen(
            [self.server_bin, "+foreground", "+configfile", str(ini)], cwd=self.root, stdout=log_file, stderr=subprocess.STDOUT
        )
        log_file.close()
        deadline = time.monotonic() + self.startup_timeout
        with httpx.Client(timeout=2.0) as client:
            while True:
                if self.process.poll() is not None:
                    raise VirtuosoError(f"virtuoso-t exited with code {self.process.returncode}: {self._tail()}")
                try:
                    if client.get(self.endpoint, params={"query": "ASK {}"}).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise VirtuosoError(f"virtuoso-t did not serve SPARQL within {self.startup_timeout:g} s: {self._tail()}")
                try:  # waits on the process itself: returns early if it dies
                    self.process.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass
        log.info("Virtuoso serving %s (sql port %d, pid %d)", self.endpoint, self.sql_port, self.process.pid)
        return self

    def _tail(self) -> str:
        text = ""
        for name in ("server.out", "virtuoso.log"):
            path = self.root / name
            if path.exists():
                text += path.read_text(errors="replace")[-800:]
        return text.strip().replace("\n", " | ")[-800:] or "no log output"

    def sql(self, statements: str, timeout: float = 600.0) -> str:
        """Run SQL through isql (``dba``/``dba`` is the private instance's admin login)."""
        result = subprocess.run(
            [self.isql_bin, str(self.sql_port), "dba", "dba", f"exec={statements}"],
            capture_output=True, text=True, timeout=timeout,
        )
        if result.returncode != 0 or "*** Error" in result.stdout + result.stderr:
            raise VirtuosoError(f"isql failed: {(result.stdout + result.stderr).strip()[-500:]}")
        return result.stdout

    def load(self, files: Sequence[str | Path], graph: str = GRAPH) -> float:
        """Bulk-load N-Triples files into ``graph``; returns the seconds it took."""
        start = time.perf_counter()
        for f in files:
            path = Path(f).resolve()
            if path.parent != self.root:
                target = self.root / path.name
                if target != path:
                    shutil.copyfile(path, target)
                path = target
            self.sql(f"ld_dir('{self.root}', '{path.name}', '{graph}');")
        self.sql("rdf_loader_run(); checkpoint;")
        errors = self.sql("SELECT ll_file, ll_error FROM DB.DBA.load_list WHERE ll_error IS NOT NULL;")
        if "0 Rows" not in errors:
            raise VirtuosoError(f"bulk load reported errors: {errors.strip()[-500:]}")
        return time.perf_counter() - start

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def __enter__(self) -> VirtuosoServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
