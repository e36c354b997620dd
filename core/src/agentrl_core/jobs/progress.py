"""Live progress of the jobs: a training run's panel and an evaluation's episode counter.

:class:`TrainProgress`: on a terminal a panel (rich) refreshes every second, also between
learner steps, with what the run is doing now: the step, episodes finished and in flight,
the buffer, the last batch's reward and success per task, throughput and version lag. When
output is not a terminal (CI, ``nohup``) only the per-step line is printed.

:class:`EpisodeProgress`: one line on stderr, ``eval: done/total episodes, rate, eta``.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio


class TrainProgress:
    """The live panel of a training run (a terminal), or one line per step (logs)."""

    def __init__(self, total_steps: int, snapshot: Callable[[], dict[str, Any]], *, echo: Callable[[str], None] = print,
                 live: bool | None = None) -> None:
        self.total_steps = total_steps
        self.snapshot = snapshot
        self.echo = echo
        self.live = sys.stdout.isatty() if live is None else live
        self.started = time.monotonic()
        self.last: dict[str, Any] = {}
        self._live: Any = None
        self._rate: tuple[float, float] | None = None  # smoothed (trained tokens, seconds) of a step

    smoothing = 0.3  # weight of the newest step in the tokens/s average

    def step(self, metrics: dict[str, Any]) -> None:
        """Called after every learner step with its metrics."""
        self.last = metrics
        tokens, seconds = float(metrics.get("learner/num_tokens", 0.0)), float(metrics.get("time/step_s", 0.0))
        if self._rate is None:
            self._rate = (tokens, seconds)
        else:  # a ratio of averages: one short or long step moves it by a third at most
            a = self.smoothing
            self._rate = (a * tokens + (1 - a) * self._rate[0], a * seconds + (1 - a) * self._rate[1])
        done = int(metrics.get("step", 0))
        elapsed = time.monotonic() - self.started
        eta = elapsed / done * (self.total_steps - done) if done > 0 else float("inf")
        line = step_line(metrics, self.total_steps, elapsed=elapsed, eta=eta,
                         tokens_per_s=self._rate[0] / max(self._rate[1], 1e-9))
        if self._live is not None:
            self._live.console.print(line)
            self._live.update(self._render(), refresh=True)
        else:
            self.echo(line)

    async def run(self) -> None:
        """Refresh the live panel every second until cancelled (no-op without a terminal)."""
        if not self.live:
            return
        from rich.live import Live

        with Live(self._render(), auto_refresh=False, transient=True) as live:
            self._live = live
            try:
                while True:
                    await anyio.sleep(1.0)
                    live.update(self._render(), refresh=True)
            finally:
                self._live = None

    def _render(self) -> Any:
        from rich.table import Table

        now = self.snapshot()
        m = self.last
        table = Table.grid(padding=(0, 2))
        elapsed = time.monotonic() - self.started
        done = int(m.get("step", 0))
        eta = elapsed / done * (self.total_steps - done) if done > 0 else float("inf")
        table.add_row("step", f"{done}/{self.total_steps}", "elapsed", f"{duration(elapsed)}, eta {duration(eta)}")
        table.add_row("episodes", f"{int(now.get('episodes', 0))} done, {int(now.get('in_flight', 0))} running",
                      "buffer", f"{int(now.get('ready', 0))} ready, {int(now.get('pending', 0))} in incomplete groups")
        table.add_row("reward", f"{m.get('reward', 0.0):.3f}", "success", f"{m.get('success', 0.0):.3f}")
        table.add_row("trained tok/s", f"{m.get('trained_tokens_per_s', 0.0):.0f}",
                      "version lag", f"{m.get('version_lag/mean', 0.0):.2f} (max {m.get('version_lag/max', 0.0):.0f})")
        for key in sorted(k for k in m if k.startswith("task/") and k.endswith("/success")):
            task = key.split("/")[1]
            table.add_row(f"  {task}", f"success {m[key]:.3f}", "reward", f"{m.get(f'task/{task}/reward', 0.0):.3f}")
        return table


def step_line(m: dict[str, Any], total: int, *, elapsed: float | None = None, eta: float | None = None,
              tokens_per_s: float | None = None) -> str:
    """One training step: progress (with elapsed and ETA when given), batch outcome, learner, timing.

    ``tokens_per_s``: trained tokens per second averaged over recent steps (default: this step's own).
    """
    timing = f"  elapsed {duration(elapsed)}  eta {duration(eta)}" if elapsed is not None and eta is not None else ""
    rate = m.get("trained_tokens_per_s", 0.0) if tokens_per_s is None else tokens_per_s
    tasks = sorted(k.split("/")[1] for k in m if k.startswith("task/") and k.endswith("/reward"))
    by_task = "  ".join(f"{t} {m[f'task/{t}/reward']:.2f}/{m.get(f'task/{t}/success', 0.0):.2f}" for t in tasks)
    return (
        f"step {int(m.get('step', 0))}/{total}{timing}  reward {m.get('reward', 0.0):.3f}  "
        f"success {m.get('success', 0.0):.3f}" + (f"  [{by_task}]" if len(tasks) > 1 else "") + "  "
        f"traj {int(m.get('trajectories', 0))}  "
        f"lag {m.get('version_lag/mean', 0.0):.2f}  loss {m.get('learner/loss', 0.0):.4f}  tok/s {rate:,.0f}  "
        f"step {m.get('time/step_s', 0.0):.1f}s (wait {m.get('time/wait_rollout_s', 0.0):.1f}s)"
    )


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``; ``?`` when unknown."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def where_to_look(run_dir: Path, *, store: Path | None = None, loggers: Sequence[Any] = (),
                  view_command: bool = False) -> str:
    """The lines ``agentrl train`` ends with: where the run's results are and how to open them."""
    lines = [f"run folder: {run_dir}", f"  metrics:            {run_dir / 'metrics.jsonl'}"]
    if (run_dir / "tensorboard").is_dir():
        lines.append(f"  tensorboard:        tensorboard --logdir {run_dir / 'tensorboard'}")
    if store is not None:
        lines.append(f"  trajectory store:   sqlite3 {store}  (schema and queries: core/docs/observability.md)")
        if view_command:
            lines.append(f"  browse it:          agentrl view {run_dir}")
    for logger in loggers:
        url = getattr(logger, "url", None)
        if url:
            lines.append(f"  {type(logger).__name__}: {url}")
    for name, what in (("final_model", "final model"), ("checkpoints", "checkpoints"), ("logs", "process logs")):
        if (run_dir / name).exists():
            lines.append(f"  {what + ':':<19} {run_dir / name}")
    return "\n".join(lines)


class PhaseProgress:
    """Progress lines of a phase with a known total (SFT steps, training steps, episodes).

    A line says ``label done/total unit (pct)``, the time elapsed, the ETA (the mean time per
    unit so far times the units left) and, where tokens are counted, tokens/s over the time since
    the previous line: an average over many steps, not one step's figure (a step's own rate
    swings by 40x with the batch's lengths, the first step's warm-up and the machine's load).
    Quiet by default: a line at the first unit, then at most one every ``every_s`` seconds, and
    one at the end.
    """

    def __init__(self, label: str, total: int, *, unit: str = "steps", echo: Callable[[str], None] = print,
                 every_s: float = 30.0, first_line: bool = True, start: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.total, self.unit, self.echo, self.every_s, self.clock = label, total, unit, echo, every_s, clock
        self.t0 = clock() if start is None else start
        self.tokens = 0.0
        # (time, tokens) at the previous line; first_line=False: the first line waits every_s too
        self._last_line: tuple[float, float] | None = None if first_line else (self.t0, 0.0)

    def eta(self, done: int, now: float | None = None) -> float:
        now = self.clock() if now is None else now
        return (now - self.t0) / done * (self.total - done) if done > 0 else float("inf")

    def update(self, done: int, *, tokens: float = 0.0, extra: str = "", force: bool = False) -> str | None:
        """Count ``done`` units finished (and ``tokens`` more processed); return the line printed, if any."""
        now = self.clock()
        self.tokens += tokens
        due = force or self._last_line is None or done >= self.total or now - self._last_line[0] >= self.every_s
        if not due:
            return None
        since, tokens_then = self._last_line or (self.t0, 0.0)
        line = (f"{self.label} {done}/{self.total} {self.unit} ({100 * done / max(self.total, 1):.0f}%)  "
                f"elapsed {duration(now - self.t0)}  eta {duration(self.eta(done, now))}")
        if self.tokens:
            line += f"  {(self.tokens - tokens_then) / max(now - since, 1e-9):,.0f} tok/s"
        if extra:
            line += f"  {extra}"
        self._last_line = (now, self.tokens)
        self.echo(line)
        return line


class EpisodeProgress:
    """Episodes of an evaluation: one refreshed line on a terminal, else quiet lines (:class:`PhaseProgress`)."""

    def __init__(self, label: str, *, echo: Callable[[str], None] | None = None, live: bool | None = None,
                 every_s: float = 30.0) -> None:
        self.label = label
        self.live = sys.stderr.isatty() if live is None else live
        self.echo = echo or (lambda line: print(line, file=sys.stderr, flush=True))
        self.every_s = every_s
        self.t0 = time.monotonic()
        self.last = 0.0
        self._lines: PhaseProgress | None = None

    def __call__(self, done: int, total: int) -> None:
        if not self.live:
            if self._lines is None:
                # episodes run concurrently: the first to finish says little about the rest, so no line for it
                self._lines = PhaseProgress(self.label, total, unit="episodes", echo=self.echo, every_s=self.every_s,
                                            first_line=False, start=self.t0)
            self._lines.update(done)
            return
        now = time.monotonic()
        if now - self.last < 1.0 and done != total:
            return
        self.last = now
        rate = done / max(now - self.t0, 1e-9)
        eta = (total - done) / rate if rate > 0 else float("inf")
        print(f"\r{self.label}: {done}/{total} episodes, {rate:.1f}/s, eta {duration(eta)}", end="", file=sys.stderr,
              flush=True)
        if done == total:
            print(file=sys.stderr)
