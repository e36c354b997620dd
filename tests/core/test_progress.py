"""Progress lines: total, elapsed, ETA and a smoothed tokens/s, quiet by default."""

from __future__ import annotations

from agentrl_core.jobs.progress import EpisodeProgress, PhaseProgress, TrainProgress, duration, step_line, where_to_look


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_duration():
    assert [duration(s) for s in (0, 42.4, 185, 3720, float("inf"), -1)] == ["0s", "42s", "3m05s", "1h02m", "?", "?"]


def test_phase_lines_have_total_eta_and_the_windows_tokens_per_s():
    clock, lines = Clock(), []
    p = PhaseProgress("sft", 10, echo=lines.append, every_s=30.0, clock=clock)
    clock.now += 4.0  # step 1 took 4 s (warm-up), 1,000 tokens
    assert p.update(1, tokens=1000, extra="nll 2.0") == "sft 1/10 steps (10%)  elapsed 4s  eta 36s  250 tok/s  nll 2.0"
    for step in range(2, 8):  # 6 steps of 2 s and 4,000 tokens each: quiet (12 s < 30 s)
        clock.now += 2.0
        assert p.update(step, tokens=4000) is None
    clock.now += 20.0  # step 8: 20 s, 4,000 tokens; 34 s since the last line, 28,000 tokens
    line = p.update(8, tokens=4000)
    # eta: 36 s for 8 steps -> 4.5 s a step x 2 left = 9 s; tokens/s over the window: 28,000 / 32 s
    assert line == "sft 8/10 steps (80%)  elapsed 36s  eta 9s  875 tok/s"
    clock.now += 1.0
    assert p.update(9, tokens=100) is None
    clock.now += 1.0
    assert p.update(10, tokens=100) == "sft 10/10 steps (100%)  elapsed 38s  eta 0s  100 tok/s"  # the end is always said
    assert len(lines) == 3


def test_episode_progress_off_a_terminal_is_a_few_lines():
    lines = []
    progress = EpisodeProgress("validation", echo=lines.append, live=False, every_s=3600)
    for done in range(1, 41):
        progress(done, 40)
    # episodes run concurrently: no line for the first one (its ETA would mislead), one at the end
    assert len(lines) == 1 and lines[0].startswith("validation 40/40 episodes (100%)")


def test_phase_without_a_first_line_waits_for_the_interval():
    clock, lines = Clock(), []
    p = PhaseProgress("eval", 80, unit="episodes", echo=lines.append, every_s=30.0, first_line=False, clock=clock)
    clock.now += 18.0
    assert p.update(1) is None
    clock.now += 14.0  # 32 s in, 40 done: 0.8 s each, 40 left
    assert p.update(40) == "eval 40/80 episodes (50%)  elapsed 32s  eta 32s"


def test_train_step_lines_smooth_tokens_per_s_and_give_an_eta():
    lines = []
    progress = TrainProgress(4, dict, echo=lines.append, live=False)
    progress.step({"step": 1, "learner/num_tokens": 14000.0, "time/step_s": 1.0, "trained_tokens_per_s": 14000.0})
    progress.step({"step": 2, "learner/num_tokens": 300.0, "time/step_s": 1.0, "trained_tokens_per_s": 300.0})
    assert "step 1/4  elapsed" in lines[0] and "eta" in lines[0] and "tok/s 14,000" in lines[0]
    # (0.3 x 300 + 0.7 x 14,000) / (0.3 x 1 + 0.7 x 1) = 9,890: not the step's own 300
    assert "tok/s 9,890" in lines[1]


def test_torch_threads_are_the_cores_the_load_leaves_free():
    from agentrl_core.cpu_threads import free_cores

    assert free_cores([0, 1], load=0.0, cpu_count=2) == 2
    assert free_cores([0, 1], load=0.7, cpu_count=2) == 1  # 1.3 free: one thread
    assert free_cores([0, 1], load=7.0, cpu_count=2) == 1  # never below one
    # 8 of 16 cores while the machine's load is 4: those 8 carry 2 of it, 6 stay free
    assert free_cores(list(range(8)), load=4.0, cpu_count=16) == 6


def test_load_is_not_the_lagging_average_of_a_job_that_just_ended(tmp_path, monkeypatch):
    from agentrl_core import cpu_threads

    loadavg = tmp_path / "loadavg"
    loadavg.write_text("0.91 0.79 0.42 3/111 6151\n")  # 3 running, this reader among them
    assert cpu_threads.runnable_now(samples=2, interval_s=0.0, path=str(loadavg)) == 2
    loadavg.write_text("garbled\n")
    assert cpu_threads.runnable_now(samples=1, path=str(loadavg)) is None
    assert cpu_threads.runnable_now(samples=1, path=str(tmp_path / "missing")) is None

    # the demos job just ended: the 1-minute average still says 0.9, nothing else runs now
    monkeypatch.setattr(cpu_threads.os, "getloadavg", lambda: (0.9, 0.8, 0.4))
    monkeypatch.setattr(cpu_threads, "runnable_now", lambda: 0)
    assert cpu_threads.current_load() == 0.0
    assert cpu_threads.free_cores([0, 1], cpu_count=2) == 2  # the 1-minute average alone gave 1
    # another job keeps a core busy: both readings see it
    monkeypatch.setattr(cpu_threads, "runnable_now", lambda: 1)
    assert cpu_threads.current_load() == 0.9 and cpu_threads.free_cores([0, 1], cpu_count=2) == 1
    # a burst of short processes right now: the average is the lesser
    monkeypatch.setattr(cpu_threads, "runnable_now", lambda: 5)
    assert cpu_threads.current_load() == 0.9
    monkeypatch.setattr(cpu_threads, "runnable_now", lambda: None)  # no /proc: the average
    assert cpu_threads.current_load() == 0.9


def test_a_step_without_learning_signal_is_explained():
    from types import SimpleNamespace

    from agentrl_core.jobs.training import no_signal_note

    failed = [SimpleNamespace(training_reward=0.0) for _ in range(4)]
    note = no_signal_note(failed, 1)
    assert note.startswith("note: at step 1 every episode got the same training reward (0), so every advantage is 0")
    assert "agentrl sft" in note
    mixed = [SimpleNamespace(training_reward=r) for r in (0.0, 0.0, 1.0, 1.0)]
    assert "the samples of every group got equal rewards" in no_signal_note(mixed, 3)


BY_TASK = {"step": 3, "reward": 0.5, "success": 0.25, "trajectories": 8, "version_lag/mean": 0.5,
           "learner/loss": 0.01234, "trained_tokens_per_s": 812.4, "time/step_s": 2.04, "time/wait_rollout_s": 1.0,
           "task/db-std/reward": 0.75, "task/db-std/success": 0.5, "task/os-std/reward": 0.25, "task/os-std/success": 0.0}


def test_step_line_shows_reward_and_success_by_task_when_there_are_several():
    line = step_line(BY_TASK, 10)
    assert line.startswith("step 3/10  reward 0.500  success 0.250  [db-std 0.75/0.50  os-std 0.25/0.00]  traj 8")
    one_task = {k: v for k, v in BY_TASK.items() if "os-std" not in k}
    assert "[" not in step_line(one_task, 10)  # one task: the overall numbers are its numbers


def test_where_to_look_lists_what_exists(tmp_path):
    (tmp_path / "tensorboard").mkdir()
    (tmp_path / "final_model").mkdir()

    class Tracker:
        url = "http://mlflow.local/#/experiments/1/runs/abc"

    text = where_to_look(tmp_path, store=tmp_path / "trajectories.sqlite", loggers=[Tracker(), object()],
                         view_command=True)
    assert text.splitlines()[0] == f"run folder: {tmp_path}"
    assert f"tensorboard --logdir {tmp_path / 'tensorboard'}" in text
    assert f"sqlite3 {tmp_path / 'trajectories.sqlite'}" in text and f"agentrl view {tmp_path}" in text
    assert "Tracker: http://mlflow.local/#/experiments/1/runs/abc" in text
    assert "final model:" in text and "checkpoints" not in text
    bare = where_to_look(tmp_path / "none")
    assert "trajectory store" not in bare and "agentrl view" not in bare and "tensorboard" not in bare
