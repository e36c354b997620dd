"""engine/<pool>/busy_fraction from the two kinds of readings, with hand-computed numbers."""

from agentrl_core.rollout.engine_client import BusyReading
from agentrl_core.train.step_metrics import pool_busy_metrics


def test_forward_time_gives_the_busy_fraction_between_two_readings():
    previous = {}
    first = pool_busy_metrics("p", {"a": BusyReading(forward_seconds=2.0, wall_seconds=10.0, requests=1, waiting=0),
                                    "b": BusyReading(forward_seconds=0.0, wall_seconds=4.0, requests=0, waiting=0)},
                              previous)
    # since start: a 2/10 = 0.2, b 0/4 = 0; mean 0.1
    assert first == {"engine/p/busy_fraction": 0.1, "engine/p/requests": 1.0, "engine/p/waiting_requests": 0.0}
    second = pool_busy_metrics("p", {"a": BusyReading(forward_seconds=5.0, wall_seconds=14.0, requests=3, waiting=1),
                                     "b": BusyReading(forward_seconds=1.0, wall_seconds=6.0, requests=1, waiting=0)},
                               previous)
    # since the last reading: a (5-2)/(14-10) = 0.75, b (1-0)/(6-4) = 0.5; mean 0.625
    assert second == {"engine/p/busy_fraction": 0.625, "engine/p/requests": 4.0, "engine/p/waiting_requests": 1.0}
    assert previous == {"a": (5.0, 14.0), "b": (1.0, 6.0)}


def test_sglang_readings_give_the_share_of_engines_with_requests():
    # SGLang reports no forward time: 2 of 3 engines have requests (running or waiting) now
    readings = {"a": BusyReading(requests=3, waiting=2), "b": BusyReading(requests=0, waiting=0),
                "c": BusyReading(requests=1, waiting=1)}
    previous = {}
    assert pool_busy_metrics("p", readings, previous) == {
        "engine/p/busy_fraction": 2 / 3, "engine/p/requests": 4.0, "engine/p/waiting_requests": 3.0}
    assert previous == {}


def test_no_reading_no_metric():
    assert pool_busy_metrics("p", {}, {}) == {}
    # an engine read once only (wall time did not advance) gives no fraction yet
    assert pool_busy_metrics("p", {"a": BusyReading(forward_seconds=0.0, wall_seconds=0.0)}, {}) == {}
