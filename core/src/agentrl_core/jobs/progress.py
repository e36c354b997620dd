"""Live progress of the jobs: a training run's panel and an evaluation's episode counter.

:class:`TrainProgress`: on a terminal a panel (rich) refreshes every second, also between
learner steps, with what the run is doing now: the step, episodes finished and in flight,
the buffer, the last batch's reward and success per task, throughput and version lag. When
output is not a terminal (CI, ``nohup``) only the per-step line is printed.

:class:`EpisodeProgress`: one line on stderr, ``eval: done/total episodes, rate, eta``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
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

    def step(self, metrics: dict[str, Any]) -> None:
        """Called after every learner step with its metrics."""
        self.last = metrics
        line = step_line(metrics, self.total_steps)
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
        table.add_row("step", f"{int(m.get('step', 0))}/{self.total_steps}", "elapsed", f"{elapsed:.0f} s")
        table.add_row("episodes", f"{int(now.get('episodes', 0))} done, {int(now.get('in_flight', 0))} running",
                      "buffer", f"{int(now.get('ready', 0))} ready, {int(now.get('pending', 0))} in incomplete groups")
        table.add_row("reward", f"{m.get('reward', 0.0):.3f}", "success", f"{m.get('success', 0.0):.3f}")
        table.add_row("trained tok/s", f"{m.get('trained_tokens_per_s', 0.0):.0f}",
                      "version lag", f"{m.get('version_lag/mean', 0.0):.2f} (max {m.get('version_lag/max', 0.0):.0f})")
        for key in sorted(k for k in m if k.startswith("task/") and k.endswith("/success")):
            task = key.split("/")[1]
            table.add_row(f"  {task}", f"success {m[key]:.3f}", "reward", f"{m.get(f'task/{task}/reward', 0.0):.3f}")
        return table


def step_line(m: dict[str, Any], total: int) -> str:
    return (
        f"step {int(m.get('step', 0))}/{total}  reward {m.get('reward', 0.0):.3f}  success {m.get('success', 0.0):.3f}  "
        f"traj {int(m.get('trajectories', 0))}  lag {m.get('version_lag/mean', 0.0):.2f}  "
        f"loss {m.get('learner/loss', 0.0):.4f}  tok/s {m.get('trained_tokens_per_s', 0.0):.0f}  "
        f"step {m.get('time/step_s', 0.0):.1f}s (wait {m.get('time/wait_rollout_s', 0.0):.1f}s)"
    )


class EpisodeProgress:
    """A one-line live progress report on stderr (rich when available)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.t0 = time.monotonic()
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        import sys

        now = time.monotonic()
        if now - self.last < 1.0 and done != total:
            return
        self.last = now
        rate = done / max(now - self.t0, 1e-9)
        eta = (total - done) / rate if rate > 0 else float("inf")
        print(f"\r{self.label}: {done}/{total} episodes, {rate:.1f}/s, eta {eta:.0f} s", end="", file=sys.stderr,
              flush=True)
        if done == total:
            print(file=sys.stderr)
