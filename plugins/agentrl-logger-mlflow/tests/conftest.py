"""A real MLflow tracking server (sqlite backend, local artifact store) for the session."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory):
    """The URL of an ``mlflow server`` this fixture starts and stops; fails if it does not come up."""
    root = tmp_path_factory.mktemp("mlflow_server")
    port = _free_port()
    log_path = root / "server.log"
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
           "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
           "--artifacts-destination", str(root / "artifacts"), "--workers", "1"]
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=root)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 150  # a migrated SQLite schema: ~75 s at load 28 on 2 cores
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"mlflow server exited with {proc.returncode} before answering: "
                            f"{_tail(log_path)}", pytrace=False)
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not answer {url}/health within 150 s: {_tail(log_path)}",
                            pytrace=False)
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _tail(path: Path) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-2000:] or "(no output)"
