"""Checkpoints: kill -9 and resume trains exactly the groups an uninterrupted run trains.

A small training process (the harness at the bottom of this file) trains the tiny model on
synthetic trajectories for groups drawn from the task stream. Like the async pipeline it
issues groups ahead of training and trains them in a completion order that is not the issue
order, so at every checkpoint some groups are issued but not yet trained. It saves a
checkpoint every 2 steps.

Run 1 kills itself with SIGKILL in the middle of saving step 4 (after the sharded state is
written, before the rename); run 2 resumes from step 2 and is SIGKILLed from outside at an
arbitrary moment after step 5; run 3 resumes and finishes. The groups trained over the
epoch, the batches and the final weights must equal an uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

STEPS = 8
GROUPS_PER_STEP = 2
N_SAMPLES = 2
LOOKAHEAD = 3  # groups issued beyond the current batch


def _launch(model_dir, run_dir, log, *extra):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, __file__, str(model_dir), str(run_dir), str(log), *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _finish(proc, timeout=240):
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out.decode(errors="replace")


def _records(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def _resumed_history(logs: list[Path]) -> list[dict]:
    """Steps that count: a later run's resume discards the steps after its checkpoint."""
    history: dict[int, dict] = {}
    for log in logs:
        records = _records(log)
        starts = [r for r in records if r.get("event") == "start"]
        resumed_at = starts[0]["step"] if starts else 0
        history = {s: r for s, r in history.items() if s <= resumed_at}
        for r in records:
            if r.get("event") == "step":
                history[r["step"]] = r
    return [history[s] for s in sorted(history)]


@pytest.mark.processes
def test_sigkill_and_resume_trains_the_same_groups(tiny_model_dir, tmp_path):
    # the uninterrupted reference and run 1 in parallel
    ref_dir, run_dir = tmp_path / "reference", tmp_path / "run"
    reference = _launch(tiny_model_dir, ref_dir, tmp_path / "reference.jsonl", "--hf-at-end")
    first = _launch(tiny_model_dir, run_dir, tmp_path / "run1.jsonl", "--kill-while-saving", "4")
    code, out = _finish(first)
    assert code == -signal.SIGKILL, out
    assert [p.name for p in sorted(run_dir.iterdir())] == [".step_00000004.tmp", "step_00000002"]  # half-written: ignored

    second = _launch(tiny_model_dir, run_dir, tmp_path / "run2.jsonl", "--resume")
    deadline = time.monotonic() + 240
    while not any(r.get("step", 0) >= 5 and r.get("event") == "step" for r in _records(tmp_path / "run2.jsonl")):
        assert second.poll() is None, _finish(second)[1]
        assert time.monotonic() < deadline, "run 2 made no progress"
        time.sleep(0.05)  # polling a subprocess's progress; the kill lands wherever it lands
    second.send_signal(signal.SIGKILL)
    assert _finish(second)[0] == -signal.SIGKILL

    third = _launch(tiny_model_dir, run_dir, tmp_path / "run3.jsonl", "--resume")
    code, out = _finish(third)
    assert code == 0, out
    code, out = _finish(reference)
    assert code == 0, out

    expected = [r for r in _records(tmp_path / "reference.jsonl") if r.get("event") == "step"]
    got = _resumed_history([tmp_path / f"run{i}.jsonl" for i in (1, 2, 3)])
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    trained = [g for r in got for g in r["groups"]]
    assert len(trained) == len(set(trained)) == STEPS * GROUPS_PER_STEP  # none repeated
    assert set(trained) == {g for r in expected for g in r["groups"]}  # none skipped
    assert [r["groups"] for r in got] == [r["groups"] for r in expected]  # and the same batches
    for a, b in zip(got, expected, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6, abs=1e-9)
    # some checkpoints held issued-but-untrained groups, and they were re-issued first
    resumes = [r for i in (2, 3) for r in _records(tmp_path / f"run{i}.jsonl") if r.get("event") == "start"]
    assert all(r["reissued"] for r in resumes)
    assert _records(tmp_path / "run3.jsonl")[-1]["checksum"] == pytest.approx(
        _records(tmp_path / "reference.jsonl")[-1]["checksum"], rel=1e-9)
    # keep the last 3 complete checkpoints
    assert sorted(p.name for p in run_dir.iterdir()) == ["step_00000004", "step_00000006", "step_00000008"]
    # the reference wrote a loadable Hugging Face directory with the trained weights
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf_dir = ref_dir / "step_00000008" / "hf"
    model = AutoModelForCausalLM.from_pretrained(hf_dir)
    AutoTokenizer.from_pretrained(hf_dir)
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    assert checksum == pytest.approx(_records(tmp_path / "reference.jsonl")[-1]["checksum"], rel=1e-9)


# ---------------------------------------------------------------------------------------
# Harness: python test_checkpoint.py MODEL_DIR RUN_DIR LOG [--resume] [--kill-while-saving STEP] [--hf-at-end]


def _train(model_dir: str, run_dir: str, log_path: str, argv: list[str]) -> None:
    import random

    import torch

    from agentrl_core.config import OptimConfig, TrainConfig
    from agentrl_core.train import checkpoint as ckpt
    from agentrl_core.train.advantages import compute_advantages, grpo_advantages
    from agentrl_core.train.batching import TrainSample
    from agentrl_core.train.learner import Learner, init_distributed
    from agentrl_core.train.task_stream import StreamTask, TaskStream
    from agentrl_core.types import Trajectory

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    kill_at = int(argv[argv.index("--kill-while-saving") + 1]) if "--kill-while-saving" in argv else None
    if kill_at is not None:
        real_replace = ckpt.os.replace

        def replace(src, dst):
            if Path(src).name == f".step_{kill_at:08d}.tmp":
                os.kill(os.getpid(), signal.SIGKILL)
            return real_replace(src, dst)

        ckpt.os.replace = replace

    init_distributed("cpu")
    learner = Learner(model_dir, train=TrainConfig(device="cpu", max_tokens_per_micro_batch=96),
                      optim=OptimConfig(lr=1e-4), temperature=0.8)
    stream = TaskStream([StreamTask("toy-train", "toy", "train", range(STEPS * GROUPS_PER_STEP))], N_SAMPLES, seed=5)
    log = open(log_path, "a")  # noqa: SIM115 (open until the process ends or is killed)

    def write(record: dict) -> None:
        log.write(json.dumps(record) + "\n")
        log.flush()
        os.fsync(log.fileno())

    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    reissued: list[str] = []
    latest = ckpt.latest_checkpoint(run_dir) if "--resume" in argv else None
    if latest is not None:
        state = ckpt.load_checkpoint(latest, learner)
        stream.load_state_dict(state["task_stream"])
        reissued = [g.group_id for g in stream.outstanding]
    write({"event": "start", "step": learner.step, "reissued": reissued})

    issued = []  # issued, not yet trained, in issue order (what the rollout side holds)
    while learner.step < STEPS:
        while len(issued) < GROUPS_PER_STEP + LOOKAHEAD:
            issued.append(stream.next_group())
        # groups complete out of issue order; each group's "completion time" is fixed by its id
        issued.sort(key=lambda g: random.Random(g.group_id).random())
        batch, issued = issued[:GROUPS_PER_STEP], issued[GROUPS_PER_STEP:]
        issued.sort(key=lambda g: g.seq)
        trajectories = []
        for group in batch:
            for s in range(group.n_samples):
                rng = random.Random(f"{group.group_id}/{s}")
                n = rng.randint(12, 40)
                mask = [0] * (n // 2) + [1] * (n - n // 2)
                trajectories.append(Trajectory(
                    group_id=group.group_id, uid=f"{group.group_id}/{s}", task=group.task, split=group.split,
                    index=group.index, input_ids=[rng.randrange(vocab) for _ in range(n)], loss_mask=mask,
                    rollout_logprobs=[-8.3 * m for m in mask], versions=[0] * n, turns=[], reward=rng.random(),
                    training_reward=rng.random(), status="completed", failure="none", sample=s))
        advantages = compute_advantages(trajectories, grpo_advantages).advantages
        samples = [TrainSample(t.input_ids, t.loss_mask, t.rollout_logprobs, advantages[i, : len(t.input_ids)].tolist(),
                               t.group_id) for i, t in enumerate(trajectories)]
        metrics = learner.train_step(samples)
        stream.mark_done([g.group_id for g in batch])
        write({"event": "step", "step": learner.step, "groups": [g.group_id for g in batch], "loss": metrics["loss"]})
        if learner.step % 2 == 0:
            ckpt.save_checkpoint(run_dir, learner, {"task_stream": stream.state_dict()}, keep=3,
                                 hf_model="--hf-at-end" in argv and learner.step == STEPS)
    checksum = sum(float(t.double().sum()) for _, t in learner.named_full_tensors())
    write({"event": "end", "step": learner.step, "checksum": checksum})


if __name__ == "__main__":
    _train(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
