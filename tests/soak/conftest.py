"""Fixtures of the soak test: the same tiny model as the cross-package tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny Qwen2 model + tokenizer + chat template (``agentrl model init --size tiny``), built once."""
    from agentrl_core.tinymodel import init_model

    return init_model(tmp_path_factory.mktemp("tiny_model"), "tiny", seed=0)
