"""``agentrl train --address``: a real two-node Ray cluster on one machine.

The head node and a second node (``--node-ip-address 127.0.0.2``, a loopback alias on
Linux) are started with ``ray start``; custom resources put the learner on the head and
the engine on the second node (``launch.learner_resources`` / ``engine_resources``). The run
trains two steps of the tiny model on calc. Checked: the engine runs on the second node and
is reached at that node's address, the learner's rank 0 (which hosts the rendezvous and the
weight-update group) on the head, and every process of the cluster is gone afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.processes, pytest.mark.slow]

RAY = str(Path(sys.executable).with_name("ray"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cluster_processes(marker: str) -> list[int]:
    """Processes of this test's cluster: they all carry its private RAY_TMPDIR."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker.encode() in environ:
                found.append(int(entry.name))
    return found


def stop_cluster(marker: str, timeout: float = 3.0) -> list[int]:
    """SIGTERM every process of the cluster, SIGKILL what is left; returns the survivors (none)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in cluster_processes(marker):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _alive(cluster_processes(marker)):
            time.sleep(0.2)
    return _alive(cluster_processes(marker))


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.append(pid)
    return alive


@pytest.fixture
def two_node_cluster():
    tmp = tempfile.mkdtemp(prefix="agentrl-ray-", dir="/tmp")  # short: Ray's socket paths must fit
    marker = f"RAY_TMPDIR={tmp}"
    env = {**os.environ, "RAY_TMPDIR": tmp, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    port = free_port()
    common = ["--num-cpus", "1", "--num-gpus", "0", "--object-store-memory", str(100 * 2**20), "--disable-usage-stats"]
    try:
        subprocess.run([RAY, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
                        "--include-dashboard=false", "--resources", json.dumps({"trainer": 1}), *common],
                       env=env, check=True, capture_output=True, timeout=180)
        subprocess.run([RAY, "start", "--address", f"127.0.0.1:{port}", "--node-ip-address", "127.0.0.2",
                        "--resources", json.dumps({"rollout": 1}), *common],
                       env=env, check=True, capture_output=True, timeout=180)
        yield f"127.0.0.1:{port}"
    finally:
        survivors = stop_cluster(marker)
        subprocess.run(["rm", "-rf", tmp], check=False)
        assert not survivors, f"processes of the test cluster survived: {survivors}"


def test_train_on_a_two_node_cluster(tmp_path, tiny_model_dir, two_node_cluster):
    run_dir = tmp_path / "two_nodes"
    config = {
        "run": {"name": "two_nodes", "output_dir": str(run_dir), "seed": 1},
        "model": {"path": str(tiny_model_dir)},
        "tasks": [{"env": "calc", "split": "train", "limit": 8}],
        "rollout": {"n_samples": 2, "batch_size": 2, "concurrency": 8, "max_turns": 2, "max_total_len": 512,
                    "max_new_tokens": 16, "temperature": 1.0},
        "loss": {"kl_coef": 0.0},
        "train": {"mode": "async", "total_steps": 2, "device": "cpu", "checkpoint_every": 0},
        "launch": {"learner_resources": {"trainer": 1}, "engine_resources": {"rollout": 1}},
        "logging": {"loggers": ["jsonl"], "sample_rollouts": 0, "progress": False},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    out = subprocess.run([sys.executable, "-m", "agentrl_core.cli.main", "train", str(path),
                          "--address", two_node_cluster], capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and not summary["interrupted"]
    setup = next(line for line in out.stdout.splitlines() if line.startswith("set-up done"))
    # the engine binds and is reached at the second node's address (it used to bind 127.0.0.1
    # wherever it ran), and learner rank 0 hosts the groups on its own node, not the driver's
    assert "'current': ['http://127.0.0.2:" in setup, setup
    assert "learner rank 0 at 127.0.0.2" not in setup, setup
