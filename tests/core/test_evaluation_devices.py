"""Which devices ``agentrl eval`` gives the engines it launches."""

from __future__ import annotations

import os

import torch

from agentrl_core.jobs.evaluation import engine_device_groups


def test_auto_on_a_gpu_machine_splits_gpu_ids_not_cpu_cores(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    # two models, one GPU each (before: CPU core numbers, which the driver then used as GPU ids)
    assert engine_device_groups("auto", 2) == [[0], [1]]
    assert engine_device_groups("cuda", 1) == [[0, 1]]


def test_cpu_splits_the_cores_this_process_may_use(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cores = sorted(os.sched_getaffinity(0))
    assert [c for group in engine_device_groups("auto", 2) for c in group] == cores
    assert engine_device_groups("cpu", 1) == [cores]
