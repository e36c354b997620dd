"""The learning benchmark's plumbing, end to end on a very short run (not its +25 point target).

``benchmarks/learning.py --quick`` runs the real command line: ``agentrl demos`` -> ``agentrl
sft`` -> ``agentrl eval`` -> ``agentrl train`` (Ray, embedded control plane, hf engine, FSDP2
learner) -> ``agentrl eval``, and writes its JSON and PNG. This test runs one arm, the
sign-flipped control ``grpo_negated`` (each arm is the same code path; the GRPO arm trains in
the other integration tests), and checks that every stage ran, that the control really
trained with the negated estimator, and that the curves and evaluations are recorded.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.processes, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_quick_learning_benchmark_runs_every_stage(tmp_path, tiny_model_dir):
    out = tmp_path / "learning_quick.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "learning.py"), "--quick", "--work", str(tmp_path / "work"),
         "--out", str(out), "--model", str(tiny_model_dir), "--arms", "grpo_negated"],
        capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 10_000

    sft = result["sft"]
    assert sft["demos"] == result["params"]["demos"] and 0 < sft["demo_success"] < 1  # a mix of right and wrong
    assert sft["sft_steps"] >= 1 and sft["sft_final_nll"] > 0
    before = result["before"]
    assert before["tasks"]["calc-test"]["episodes"] == result["params"]["eval_limit"]
    assert 0.0 <= before["success"] <= 1.0

    assert set(result["runs"]) == {"grpo_negated"}
    for arm in ("grpo_negated",):
        run = result["runs"][arm]
        train = run["train"]
        assert train["steps"] == result["params"]["total_steps"] and not train["interrupted"]
        assert [p["step"] for p in train["curve"]] == list(range(1, train["steps"] + 1))
        assert all(0.0 <= p["reward"] <= 1.0 and p["trajectories"] > 0 for p in train["curve"])
        assert Path(train["model"]).name == "final_model" and train["model_step"] == train["steps"]
        assert run["after"]["tasks"]["calc-test"]["episodes"] == result["params"]["eval_limit"]
        assert run["improvement"] == pytest.approx(run["after"]["success"] - before["success"])
        config = yaml.safe_load((tmp_path / "work" / arm / "config.yaml").read_text())
        assert config["advantage"]["estimator"] == arm  # the control really trained with the flipped sign
    assert result["passed"] is None  # --quick checks the plumbing, never claims the target


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stopping_the_benchmark_stops_its_agentrl_command(tmp_path, signum):
    # agentrl() runs each command in a session of its own; a SIGTERM (kill, a CI timeout) or a
    # Ctrl-C meant for the benchmark must still stop it, not leave it running (a controller
    # here: it serves until interrupted, as `agentrl train` runs until its budget)
    token = f"stop-test-{uuid.uuid4().hex}"
    script = tmp_path / "bench.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r})\n"
        "from pathlib import Path\n"
        "from learning import agentrl\n"
        f"agentrl(['controller', '--port', '0', '--token', {token!r}], Path({str(tmp_path / 'controller.log')!r}))\n"
        "print('agentrl returned')\n"
    )
    bench = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def controllers() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except (OSError, ValueError):
                continue
            if token.encode() in cmdline and b"controller" in cmdline:
                found.append(int(entry.name))
        return found

    try:
        _stop_and_check(bench, signum, tmp_path / "controller.log", controllers)
    finally:  # whatever failed, leave no controller behind
        bench.kill()
        for pid in controllers():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _stop_and_check(bench, signum, log, controllers):
    deadline = time.monotonic() + 60
    while not (log.exists() and "listening" in log.read_text().lower()):
        assert bench.poll() is None and time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
        time.sleep(0.2)
    [controller] = controllers()
    bench.send_signal(signum)
    out, _ = bench.communicate(timeout=90)
    # SIGTERM: SystemExit(143); Ctrl-C: an uncaught KeyboardInterrupt, which Python ends with SIGINT
    assert bench.returncode == (128 + signum if signum == signal.SIGTERM else -signal.SIGINT), out
    assert "stopping: interrupting agentrl controller" in out and "agentrl returned" not in out
    assert controllers() == [] and not Path(f"/proc/{controller}").exists()  # stopped and reaped
