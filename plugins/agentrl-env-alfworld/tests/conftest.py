"""Shared fixtures: one fresh game cache per test run (so unpacking is tested for real)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import anyio
import pytest
from agentrl_env_alfworld.config import AlfworldConfig
from agentrl_env_alfworld.env import AlfworldEnvironment

pytest_plugins = ["agentrl_core.testing"]


@pytest.fixture(scope="session", autouse=True)
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Point the default cache (used by check_environment and the CLI) at a fresh folder."""
    path = tmp_path_factory.mktemp("agentrl-cache")
    old = os.environ.get("AGENTRL_CACHE_DIR")
    os.environ["AGENTRL_CACHE_DIR"] = str(path)
    yield str(path / "alfworld")
    if old is None:
        os.environ.pop("AGENTRL_CACHE_DIR", None)
    else:
        os.environ["AGENTRL_CACHE_DIR"] = old


# Generous timeouts: CI machines are small and shared; tests of the timeouts set their own.
PATIENT = {"start_timeout": 600.0, "reset_timeout": 300.0, "step_timeout": 120.0}


@pytest.fixture(scope="module")
def env() -> Iterator[AlfworldEnvironment]:
    """One environment per module; its game processes are reused across tests."""
    environment = AlfworldEnvironment(AlfworldConfig(concurrency=4, **PATIENT))
    yield environment
    anyio.run(environment.aclose)


@pytest.fixture
def make_env() -> Iterator:
    """Build environments with config overrides; each is closed after the test."""
    made: list[AlfworldEnvironment] = []

    def build(**overrides) -> AlfworldEnvironment:
        made.append(AlfworldEnvironment(AlfworldConfig(**{**PATIENT, **overrides})))
        return made[-1]

    yield build
    for environment in made:
        anyio.run(environment.aclose)
