"""The persisted store, the data checks and the backends' failure modes."""

from __future__ import annotations

import shutil
import socket
import threading

import anyio
import pytest
from agentrl_env_kg import store
from agentrl_env_kg.backends import BackendError, EmbeddedBackend, QueryError, SparqlBackend
from agentrl_env_kg.datafiles import data_file
from conftest import mini_ntriples

from agentrl_core.datafiles import DataFileError


def _writer(calls):
    def write(path):
        calls.append(path)
        path.write_text(mini_ntriples())
        return mini_ntriples().count("\n")

    return write


def test_a_store_is_built_once_then_opened_read_only(tmp_path):
    calls: list = []
    target = tmp_path / "db"
    barrier = threading.Barrier(3)
    markers = []

    def build():
        barrier.wait()
        markers.append(store.ensure_store(target, "k1", _writer(calls)))

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len({m["build_seconds"] for m in markers}) == 1
    assert markers[0]["statements"] == mini_ntriples().count("\n")
    first, second = store.open_read_only(target), store.open_read_only(target)  # many readers at once
    assert len(first) == len(second) == markers[0]["statements"]
    assert not list(tmp_path.glob("db.build-*"))  # the temporary build folder is gone
    store.ensure_store(target, "k1", _writer(calls))
    assert len(calls) == 1  # warm: nothing rebuilt
    store.ensure_store(target, "k2", _writer(calls))
    assert len(calls) == 2  # different data: rebuilt in place


def test_an_incomplete_store_is_refused_and_rebuilt(tmp_path):
    target = tmp_path / "db"
    target.mkdir()
    with pytest.raises(store.StoreError, match="not a complete knowledge-graph store"):
        store.open_read_only(target)
    calls: list = []
    store.ensure_store(target, "k", _writer(calls))
    assert len(calls) == 1 and store.open_read_only(target) is not None


def test_a_failed_build_leaves_nothing_behind(tmp_path):
    def broken(path):
        path.write_text("<not a triple")
        return 1

    with pytest.raises(store.StoreError, match="building the knowledge-graph store"):
        store.ensure_store(tmp_path / "db", "k", broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db.lock"]


def test_a_corrupt_data_file_is_detected(tmp_path):
    good = data_file("fb15k237/kgbert/entity2text.txt")
    copy = tmp_path / "fb15k237" / "kgbert" / "entity2text.txt"
    copy.parent.mkdir(parents=True)
    shutil.copyfile(good, copy)
    with open(copy, "a") as f:
        f.write("/m/0xyz\tExtra\n")
    with pytest.raises(DataFileError, match="sha256"):
        data_file("fb15k237/kgbert/entity2text.txt", override=tmp_path)


class _BlockingStore:
    """Test double for a store whose query hangs (Oxigraph cannot be interrupted)."""

    def __init__(self):
        self.release = threading.Event()

    def query(self, text):
        self.release.wait(30)
        return iter(())


def test_embedded_queries_time_out_without_blocking_the_loop():
    fake = _BlockingStore()

    async def main():
        backend = EmbeddedBackend(fake, timeout=0.2, threads=1)
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await anyio.sleep(0.01)
                ticks += 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            with pytest.raises(QueryError, match="longer than 0.2 s"):
                await backend.select("SELECT * WHERE { ?s ?p ?o }")
            tg.cancel_scope.cancel()
        return ticks

    try:
        assert anyio.run(main) >= 5  # the event loop kept running while the query hung
    finally:
        fake.release.set()


def test_sparql_endpoint_that_never_answers_times_out(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts connections in the kernel, never answers
    port = listener.getsockname()[1]

    async def main():
        backend = SparqlBackend(f"http://127.0.0.1:{port}/sparql", timeout=0.3, connect_timeout=0.3)
        try:
            with pytest.raises(QueryError, match="longer than 0.3 s"):
                await backend.select("ASK {}")
        finally:
            await backend.aclose()

    try:
        anyio.run(main)
    finally:
        listener.close()


def test_sparql_endpoint_down_is_an_infrastructure_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there

    async def main():
        backend = SparqlBackend(f"http://127.0.0.1:{port}/sparql", timeout=2)
        try:
            with pytest.raises(BackendError, match="unreachable"):
                await backend.select("ASK {}")
        finally:
            await backend.aclose()

    anyio.run(main)
