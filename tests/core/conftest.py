"""Shared fixtures of core's tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny Qwen2 model + tokenizer + chat template (``agentrl model init --size tiny``), built once.

    Its tokenizer learns from the synthetic conversations only (an empty data folder), so the model
    is the same whichever environment plugins the test venv has: core's nox session installs none,
    a development venv all of them. Its vocabulary is small (678 ids); tests take token ids from
    :func:`tiny_vocab`, never as literals.
    """
    from agentrl_core.tinymodel import init_model

    no_plugin_data = tmp_path_factory.mktemp("no_plugin_data")
    return init_model(tmp_path_factory.mktemp("tiny_model"), "tiny", seed=0, data_dir=no_plugin_data)


@pytest.fixture(scope="session")
def tiny_vocab(tiny_model_dir):
    """The tiny model's vocabulary size and its chat-template token ids."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    im_start, im_end = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    return {"size": len(tokenizer), "im_start": im_start, "im_end": im_end}


@pytest.fixture(scope="module")
def world_of_one():
    """A one-rank gloo process group for the learner tests of a module (left as found)."""
    import torch.distributed as dist

    from agentrl_core.train.learner import init_distributed

    created = not dist.is_initialized()
    init_distributed("cpu")
    yield
    if created:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    """The tiny model's tokenizer (a test module may define its own)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def parser():
    """The Qwen2.5 tool-call parser the chat loop's tests use."""
    from agentrl_core.rollout.tool_parsers import Qwen25Parser

    return Qwen25Parser(None)
