"""Fixtures: a running Docker engine with the task images (prepared by tests/ci_setup.sh)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from agentrl_env_os.config import OSConfig
from agentrl_env_os.env import OSEnvironment
from agentrl_env_os.images import IMAGE_NAMES, image_ref

pytest_plugins = ["agentrl_core.testing"]

SETUP = Path(__file__).with_name("ci_setup.sh")


def _missing() -> str | None:
    """Why the Docker tests cannot run yet, or None when they can."""
    import docker

    try:
        api = docker.APIClient(version="auto", timeout=10)
    except Exception as exc:
        return f"the Docker engine is not reachable ({type(exc).__name__})"
    try:
        for name in IMAGE_NAMES:
            try:
                api.inspect_image(image_ref(name))
            except docker.errors.ImageNotFound:
                return f"the task image {image_ref(name)} is missing"
    finally:
        api.close()
    return None


@pytest.fixture(scope="session")
def docker_ready() -> None:
    """Docker with the task images; runs the (idempotent) setup script as root if needed, else fails."""
    why = _missing()
    if why is None:
        return
    if os.geteuid() != 0:
        pytest.fail(f"{why}: run plugins/agentrl-env-os/tests/ci_setup.sh as root (it installs docker.io, "
                    "starts dockerd and builds the images).", pytrace=False)
    proc = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True)
    if proc.returncode != 0 or _missing() is not None:
        pytest.fail(f"{why}, and {SETUP.name} did not fix it: {(proc.stderr or proc.stdout)[-800:]}", pytrace=False)


@pytest.fixture
def make_env(docker_ready):
    """Build OSEnvironments with config overrides; each one is closed after the test."""
    import anyio

    made: list[OSEnvironment] = []

    def make(**overrides) -> OSEnvironment:
        env = OSEnvironment(OSConfig(**overrides))
        made.append(env)
        return env

    yield make
    for env in made:
        anyio.run(env.aclose)
