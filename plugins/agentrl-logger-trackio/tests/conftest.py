"""Trackio's storage in a temporary folder: TRACKIO_DIR is read once, when trackio is imported."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_STORE = tempfile.mkdtemp(prefix="agentrl-trackio-test-")
os.environ["TRACKIO_DIR"] = _STORE  # before any test module imports trackio
os.environ.pop("TRACKIO_PROJECT", None)
os.environ.pop("TRACKIO_SPACE_ID", None)
os.environ.pop("TRACKIO_SERVER_URL", None)


@pytest.fixture(scope="session", autouse=True)
def _trackio_store():
    yield _STORE
    shutil.rmtree(_STORE, ignore_errors=True)
