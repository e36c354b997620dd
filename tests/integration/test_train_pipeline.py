"""agentrl train end to end: a killed run resumes with the same groups; a killed worker and engine
are survived, and Ctrl-C then stops the run cleanly.

Everything is real: the CLI, a local Ray, the embedded controller and task workers, the hf
engine and the FSDP2 learner, on the tiny model and the calc example environment.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.processes, pytest.mark.slow]


def write_config(tmp_path: Path, model: Path, name: str, **overrides) -> Path:
    config = {
        "run": {"name": name, "output_dir": str(tmp_path / name), "seed": 3},
        "model": {"path": str(model)},
        "tasks": [{"env": "calc", "split": "train", "limit": 12}],
        "rollout": {"n_samples": 2, "batch_size": 2, "concurrency": 16, "max_turns": 3, "max_total_len": 768,
                    "max_new_tokens": 24, "temperature": 1.0},
        "loss": {"kl_coef": 0.0},
        "optim": {"lr": 1.0e-4},
        "train": {"mode": "async", "total_steps": 6, "device": "cpu", "checkpoint_every": 2},
        "logging": {"loggers": ["jsonl"], "sample_rollouts": 0, "progress": True},
    }
    for key, value in overrides.items():
        section, _, field = key.partition(".")
        config[section][field] = value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def agentrl(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "agentrl_core.cli.main", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, **kwargs)


def trained(run_dir: Path) -> list[list[str]]:
    lines = (run_dir / "trained_groups.jsonl").read_text().splitlines()
    return [json.loads(line)["groups"] for line in lines if line.strip()]


def epoch0(steps: list[list[str]]) -> list[str]:
    return [g for step in steps for g in step if "-e0-" in g]


def finish(proc: subprocess.Popen, timeout: float = 900) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-4000:]
    return out


def wait_for_steps(proc: subprocess.Popen, run_dir: Path, steps: int, timeout: float = 900) -> None:
    """Wait until the run has logged ``steps`` trained steps (1: the first one)."""
    deadline = time.monotonic() + timeout
    while not (run_dir / "trained_groups.jsonl").exists() or len(trained(run_dir)) < steps:
        assert proc.poll() is None, proc.stdout.read()[-4000:]
        assert time.monotonic() < deadline
        time.sleep(0.5)


def metrics_of(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def wait_for_metric(proc: subprocess.Popen, run_dir: Path, predicate, by_step: int, timeout: float = 600) -> int | None:
    """The first logged step whose metrics satisfy ``predicate``; None once ``by_step`` passed without."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = metrics_of(run_dir)
        hit = next((int(m["step"]) for m in metrics if "step" in m and predicate(m)), None)
        if hit is not None or any(int(m.get("step", 0)) >= by_step for m in metrics):
            return hit
        assert proc.poll() is None, proc.stdout.read()[-4000:]
        time.sleep(0.5)
    raise AssertionError(f"no step {by_step} within {timeout} s")


def assert_no_processes_left(run_dir: Path, timeout: float = 60) -> None:
    leftovers = _processes_of(run_dir)
    deadline = time.monotonic() + timeout
    while leftovers and time.monotonic() < deadline:
        time.sleep(1)
        leftovers = _processes_of(run_dir)
    assert not leftovers, f"processes of the run are still alive: {leftovers}"


def test_sigkill_and_resume_trains_the_same_groups(tmp_path, tiny_model_dir):
    # 12 tasks, 2 groups a step, 6 steps: one epoch. Killed once step 3 is logged (the last
    # checkpoint is step 2's), the resumed run must train each of the 12 tasks of the epoch
    # exactly once. (tests/core/test_checkpoint.py compares group ids with an uninterrupted
    # run at the learner level; here the whole CLI, Ray and the services are killed.)
    config = write_config(tmp_path, tiny_model_dir, "killed")
    run_dir = tmp_path / "killed"
    proc = agentrl("train", str(config))
    wait_for_steps(proc, run_dir, 3)
    os.kill(proc.pid, signal.SIGKILL)  # the driver only: its controller, workers and engines must follow
    proc.wait()
    assert_no_processes_left(run_dir)
    assert (run_dir / "checkpoints" / "step_00000002").is_dir()
    # the killed run's trajectory store opens, with at least the steps up to the checkpoint
    with sqlite3.connect(run_dir / "trajectories.sqlite") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert {1, 2} <= {s for (s,) in conn.execute("SELECT DISTINCT step FROM trajectories")}

    out = finish(agentrl("train", str(config), "--resume"))
    assert "resumed from" in out and "at step 2" in out and "training, per task" in out
    # the trained policy is exported as a Hugging Face folder, and summary.json points at it
    final = Path(json.loads((run_dir / "summary.json").read_text())["final_model"])
    assert final == (run_dir / "final_model").resolve() and (final / "config.json").is_file()
    assert (final / "model.safetensors").is_file() and f"agentrl eval {run_dir}" in out
    groups = epoch0(trained(run_dir))
    assert len(groups) == len(set(groups)), "a group was trained twice"
    indices = sorted(int(g.rsplit("-e0-", 1)[1]) for g in groups)
    assert indices == list(range(12)), f"the resumed run skipped or repeated tasks of the epoch: {indices}"
    assert_store_matches_the_logs(run_dir, steps=6)


def assert_store_matches_the_logs(run_dir: Path, steps: int) -> None:
    """The trajectory store holds, for every step, the groups trained_groups.jsonl lists, and numbers
    that agree with metrics.jsonl (the last line of a step counts: a resumed run logs its steps again)."""
    from agentrl_core.train.trajstore import read_tokens

    metrics = {int(m["step"]): m for m in metrics_of(run_dir) if "task/calc-train/reward" in m}
    groups = {i + 1: g for i, g in enumerate(trained(run_dir))}
    conn = sqlite3.connect(run_dir / "trajectories.sqlite")
    assert [s for (s,) in conn.execute("SELECT DISTINCT step FROM trajectories WHERE kind = 'train' ORDER BY step")] \
        == list(range(1, steps + 1))
    assert conn.execute("SELECT count(*) FROM trajectories t LEFT JOIN tokens k ON k.trajectory_id = t.id "
                        "WHERE k.trajectory_id IS NULL").fetchone() == (0,)
    for step in range(1, steps + 1):
        m = metrics[step]
        assert m["time/trajectory_store_s"] >= 0.0
        rows = conn.execute("SELECT id, group_id, reward, status, advantage FROM trajectories WHERE step = ?",
                            (step,)).fetchall()
        assert sorted({r[1] for r in rows}) == sorted(groups[step])
        assert len(rows) == m["trajectories"]
        assert sum(r[2] for r in rows) / len(rows) == pytest.approx(m["reward"])
        ratios = []
        for traj_id, *_ in rows:
            tokens = read_tokens(conn, traj_id)
            mask = tokens["loss_mask"]
            assert len(tokens["input_ids"]) == len(mask) == len(tokens["versions"]) == len(tokens["ratios"])
            for p, on in enumerate(mask):
                assert (tokens["learner_logprobs"][p] is not None) == bool(on)
                if on:
                    assert tokens["ratios"][p] == pytest.approx(
                        math.exp(tokens["learner_logprobs"][p] - tokens["logprobs"][p]), rel=1e-4)
                    assert 0 <= tokens["versions"][p] <= step - 1
                    ratios.append(tokens["ratios"][p])
        # the learner's ratio metric is the token-mean of exactly these ratios
        assert sum(ratios) / len(ratios) == pytest.approx(m["learner/ratio"], rel=1e-3)
    conn.close()


def _processes_of(run_dir: Path) -> list[str]:
    """Command lines of live processes that belong to a run (they mention its folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(run_dir) in cmdline and "pytest" not in cmdline:
                found.append(cmdline[:160])
    return found


def _is_child_worker(pid: int, run_dir: Path) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    text = b" ".join(cmdline).decode(errors="replace")
    return "worker" in text and str(run_dir) in text


def test_faults_are_survived_and_sigint_stops_after_the_step_saving_everything(tmp_path, tiny_model_dir):
    # One run, three events: a task worker is SIGKILLed after step 1 (its sessions become
    # infrastructure failures, the other worker carries on), the engine after step 3 (the
    # watchdog restarts it), and after step 5 Ctrl-C (or SIGTERM from a scheduler), once: the
    # step in progress completes, a checkpoint and the final model are written, every process
    # goes away, and the exit code is 130.
    config = write_config(tmp_path, tiny_model_dir, "faults", **{"train.total_steps": 50, "train.save_hf_model": True})
    cfg = yaml.safe_load(config.read_text())
    cfg["controller"] = {"workers_per_env": 2, "heartbeat_interval": 1.0, "unresponsive_after": 3.0}
    cfg["engine"] = {"health_check_interval": 1.0, "unhealthy_checks": 2}
    cfg["rollout"]["max_infra_retries"] = 5
    config.write_text(yaml.safe_dump(cfg))
    run_dir = tmp_path / "faults"
    proc = agentrl("train", str(config))
    wait_for_steps(proc, run_dir, 1)
    victims = subprocess.run(["pgrep", "-f", "worker --env calc"], capture_output=True, text=True).stdout.split()
    workers = [int(p) for p in victims if _is_child_worker(int(p), run_dir)]
    assert len(workers) == 2
    os.kill(workers[0], signal.SIGKILL)

    # its sessions fail when the controller next reaches it. If it had none in flight (the
    # rollout can be waiting on the staleness bound right after a step), no session fails: the
    # controller finds it gone at its next contact (a start is then placed on the other worker),
    # which its log says; the run carries on either way.
    infra_at = wait_for_metric(proc, run_dir, lambda m: m.get("rollout/failure/infra", 0.0) > 0, by_step=6)
    if infra_at is None:
        controller_log = (run_dir / "logs" / "controller.log").read_text()
        assert "of task 'calc-train'" in controller_log and "is unreachable" in controller_log, \
            "the killed worker's sessions should show up as infrastructure failures, or the controller should lose it"
        infra_at = max(int(m["step"]) for m in metrics_of(run_dir) if "step" in m)
    engines = [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit() and _mentions(e, "engine", run_dir)]
    assert len(engines) == 1
    os.kill(engines[0], signal.SIGKILL)

    wait_for_steps(proc, run_dir, infra_at + 2)
    os.kill(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 130, out[-4000:]
    assert "restarted as" in out
    assert "SIGINT: stopping after the current step" in out and "Traceback" not in out
    metrics = metrics_of(run_dir)
    assert max(m["engine/restarts"] for m in metrics) >= 1
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = summary["steps"]
    assert summary["interrupted"] is True and infra_at + 2 <= steps < 50
    assert len(trained(run_dir)) == steps == max(m["step"] for m in metrics)
    assert (run_dir / "checkpoints" / f"step_{steps:08d}").is_dir()
    assert (run_dir / "final_model" / "config.json").exists()
    assert_no_processes_left(run_dir)


def _mentions(entry: Path, word: str, run_dir: Path) -> bool:
    try:
        cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return f" {word} serve" in cmdline and str(run_dir) in cmdline


def test_a_lora_run_syncs_the_adapter_alone_and_samples_with_its_versions(tmp_path, tiny_model_dir):
    # model.lora end to end: the engines serve policy@vN; each sync sends the adapter only (rank 4 on
    # the seven projections of the tiny model: 155,648 bytes in fp32, of the 3.5-5.3 MB of its full
    # weights: the vocabulary depends on the plugins whose data trained the tokenizer), at most
    # staleness_bound + 1 = 2 versions stay loaded, and the tokens carry the adapter versions (the
    # base weights never change, so a token of version 1 or 2 was sampled with that adapter)
    config = write_config(tmp_path, tiny_model_dir, "lora", **{
        "model.lora": {"enabled": True, "rank": 4, "alpha": 8.0},
        "train.total_steps": 3, "train.checkpoint_every": 0, "rollout.staleness_bound": 1})
    run_dir = tmp_path / "lora"
    finish(agentrl("train", str(config)))
    from transformers import AutoModelForCausalLM

    full = 4 * sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tiny_model_dir).parameters())
    syncs = [m for m in metrics_of(run_dir) if "weight_sync/current/bytes" in m]
    assert len(syncs) == 3
    for m in syncs:
        assert m["weight_sync/current/bytes"] == 155_648 and m["weight_sync/current/full_bytes"] == full
        assert m["weight_sync/current/bytes_fraction"] == pytest.approx(155_648 / full)
        assert m["weight_sync/current/adapters_loaded"] <= 2
    with sqlite3.connect(run_dir / "trajectories.sqlite") as conn:
        versions = {v for (row,) in conn.execute("SELECT versions FROM tokens") for v in json.loads(row) if v >= 0}
    assert {1, 2} <= versions <= {0, 1, 2}
    assert (run_dir / "final_model" / "adapter" / "adapter_config.json").is_file()


def test_a_validation_task_with_an_index_outside_its_split_stops_the_run_before_training(tmp_path, tiny_model_dir):
    config = write_config(tmp_path, tiny_model_dir, "badeval",
                          **{"train.eval_tasks": [{"env": "calc", "split": "test", "indices": [0, 99999]}],
                             "train.eval_every": 2})
    proc = agentrl("train", str(config))
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode != 0
    assert "eval task 'calc-test': indices 99999 are not in split 'test' of 'calc'" in out, out[-4000:]
    assert not (tmp_path / "badeval" / "trained_groups.jsonl").exists()  # no step was trained
    assert_no_processes_left(tmp_path / "badeval")
