"""How many threads torch uses on CPU: the cores this process may run on that other work leaves free.

torch starts one intra-op thread per core of the machine. When other processes keep some of
those cores busy (another job, or the engine and learner of the same run on their own cores),
the extra threads wait on each other at every parallel region and a step takes many times
longer: on a 2-core machine at load ~7, SFT took 1,618 s where it takes 219 s alone (issue 26).
So every process that runs torch on CPU takes ``free_cores`` threads: its cores minus its share
of the load others put on the machine, at least one.

The 1-minute load average lags: a job that started right after another one ended (``agentrl
demos`` then ``agentrl sft``, as the learning benchmarks run them) still sees the ended job's load
and took one thread on an idle 2-core machine, twice the time. So the load counted is the lesser
of the 1-minute average and the processes runnable right now (Linux's ``/proc/loadavg``, fewest of
a few samples, less this process): work that keeps a core busy shows in both.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence

log = logging.getLogger(__name__)


def allowed_cores() -> list[int]:
    """The cores this process may run on (its affinity), else every core of the machine."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def runnable_now(samples: int = 5, interval_s: float = 0.01, *, path: str = "/proc/loadavg") -> int | None:
    """Processes runnable on the machine now besides this one: the fewest of ``samples`` readings
    of ``/proc/loadavg``'s running count (which counts the reader), or None where there is none."""
    counts = []
    for i in range(samples):
        try:
            with open(path) as f:
                counts.append(int(f.read().split()[3].split("/")[0]))
        except (OSError, IndexError, ValueError):
            return None
        if i + 1 < samples:
            time.sleep(interval_s)
    return max(0, min(counts) - 1)


def current_load() -> float:
    """The load other work puts on the machine: the lesser of the 1-minute load average and
    :func:`runnable_now` (the average lags a job that just ended); 0 where neither is known."""
    average = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    now = runnable_now()
    return average if now is None else min(average, float(now))


def free_cores(cores: Sequence[int] | None = None, *, load: float | None = None, cpu_count: int | None = None) -> int:
    """Threads for torch on ``cores`` (default: :func:`allowed_cores`) given the machine's load
    (default: :func:`current_load`).

    The load spreads over every core of the machine, so ``cores`` carry ``load x len(cores) /
    cpu_count`` of it; the rest is free. Rounded to the nearest core, between 1 and ``len(cores)``.
    """
    cores = list(allowed_cores() if cores is None else cores)
    total = cpu_count or os.cpu_count() or len(cores)
    if load is None:
        load = current_load()
    busy = load * len(cores) / max(total, 1)
    return max(1, min(len(cores), round(len(cores) - busy)))


def set_torch_threads(cores: Sequence[int] | None = None, *, threads: int | None = None) -> int:
    """Set torch's intra-op threads to ``threads`` or :func:`free_cores`; returns the number set."""
    import torch

    load = current_load()
    n = threads or free_cores(cores, load=load)
    torch.set_num_threads(n)
    log.info("torch uses %d CPU thread(s) (cores %s, load %.1f)", n, list(cores or allowed_cores()), load)
    return n
