"""Prometheus text exposition of the controller's counters and gauges (no client library)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentrl_core.controlplane.state import State


def _escape(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: object) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


class Metrics:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()
        self.sessions_started: Counter[str] = Counter()
        self.sessions_finished: Counter[tuple[str, str]] = Counter()
        self.workers_lost: Counter[str] = Counter()

    def observe(self, route: str, status: int) -> None:
        self.requests[(route, status)] += 1

    def started(self, task: str) -> None:
        self.sessions_started[task] += 1

    def finished(self, task: str, status: str) -> None:
        self.sessions_finished[(task, status)] += 1

    def worker_lost(self, task: str) -> None:
        self.workers_lost[task] += 1

    def render(self, state: State) -> str:
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(f"{name}{labels} {value:g}" for labels, value in samples)

        family("agentrl_controller_requests_total", "counter", "HTTP requests answered, by route and status.",
               [(_labels(route=r, code=c), n) for (r, c), n in sorted(self.requests.items())])
        family("agentrl_controller_sessions_started_total", "counter", "Sessions started, by task.",
               [(_labels(task=t), n) for t, n in sorted(self.sessions_started.items())])
        family("agentrl_controller_sessions_finished_total", "counter", "Sessions ended, by task and status.",
               [(_labels(task=t, status=s), n) for (t, s), n in sorted(self.sessions_finished.items())])
        family("agentrl_controller_workers_lost_total", "counter", "Workers found unreachable, by task.",
               [(_labels(task=t), n) for t, n in sorted(self.workers_lost.items())])
        live: Counter[str] = Counter(s.task for s in state.sessions.values())
        family("agentrl_controller_sessions", "gauge", "Sessions the controller holds, by task.",
               [(_labels(task=t), live[t]) for t in sorted(set(live) | set(state.tasks))])
        by_state: Counter[tuple[str, str]] = Counter()
        capacity: Counter[str] = Counter()
        in_use: Counter[str] = Counter()
        for worker in state.workers():
            by_state[(worker.task, worker.state_name())] += 1
            capacity[worker.task] += worker.capacity
            in_use[worker.task] += worker.current
        family("agentrl_controller_workers", "gauge", "Registered workers, by task and state.",
               [(_labels(task=t, state=s), n) for (t, s), n in sorted(by_state.items())])
        family("agentrl_controller_capacity", "gauge", "Session slots of registered workers, by task.",
               [(_labels(task=t), n) for t, n in sorted(capacity.items())])
        family("agentrl_controller_slots_in_use", "gauge", "Slots held by sessions and unconfirmed cancels, by task.",
               [(_labels(task=t), n) for t, n in sorted(in_use.items())])
        family("agentrl_controller_pending_cancels", "gauge", "Cancels not yet confirmed by a worker.",
               [("", len(state.pending_cancels))])
        return "\n".join(lines) + "\n"
