"""A few started, never-used containers per image, so an episode does not wait for Docker.

``take`` hands out the oldest idle container (or None) and starts background threads that
bring the pool back to its size. The threads only call the blocking Docker SDK; the event
loop is never involved. A container idle for longer than half its lifetime is discarded
instead of used (its ``sleep`` would end during the episode). Pool containers carry the
worker's labels like every other container, so the sweeper removes them if the worker dies;
idle ones are named ``agentrl-os-pool-*`` (a session renames the one it takes).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import uuid

from agentrl_env_os.docker_backend import DockerBackend

log = logging.getLogger(__name__)
POOL_PREFIX = "agentrl-os-pool-"


class WarmPool:
    def __init__(self, backend: DockerBackend, size: int, max_idle_s: float) -> None:
        self.backend = backend
        self.size = size
        self.max_idle_s = max_idle_s
        self._idle: dict[str, collections.deque[tuple[str, float]]] = collections.defaultdict(collections.deque)
        self._inflight: dict[str, int] = collections.defaultdict(int)
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.failures = 0

    def take(self, image: str) -> str | None:
        """An idle started container of ``image``, or None; refills the pool in the background."""
        stale = []
        taken = None
        with self._lock:
            idle = self._idle[image]
            while idle and taken is None:
                container_id, since = idle.popleft()
                if time.monotonic() - since > self.max_idle_s:
                    stale.append(container_id)
                else:
                    taken = container_id
        for container_id in stale:
            self._spawn(self.backend.remove, container_id)
        self.fill(image)
        return taken

    def fill(self, image: str) -> None:
        """Start creating containers until idle + in flight reach the pool size."""
        with self._lock:
            if self._closed or self.size == 0:
                return
            missing = self.size - len(self._idle[image]) - self._inflight[image]
            self._inflight[image] += max(0, missing)
        for _ in range(max(0, missing)):
            self._spawn(self._create, image)

    def wait(self, timeout: float = 120.0) -> None:
        """Block until the creations and removals started so far have finished."""
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout)

    def idle_ids(self) -> set[str]:
        with self._lock:
            return {cid for idle in self._idle.values() for cid, _ in idle}

    def close(self) -> None:
        """Stop refilling, wait for creations in flight and remove every idle container (blocking)."""
        with self._lock:
            self._closed = True
        self.wait()
        with self._lock:
            idle = [cid for queue in self._idle.values() for cid, _ in queue]
            self._idle.clear()
        for container_id in idle:
            self.backend.remove(container_id)

    # -- threads ------------------------------------------------------------------------

    def _spawn(self, fn, *args) -> None:
        def run() -> None:
            try:
                fn(*args)
            except Exception as exc:
                log.warning("warm pool: %s failed: %s", getattr(fn, "__name__", fn), exc)
            finally:
                with self._lock:
                    self._threads.discard(threading.current_thread())

        thread = threading.Thread(target=run, name="agentrl-env-os-pool", daemon=True)
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def _create(self, image: str) -> None:
        container_id = None
        try:
            name = f"{POOL_PREFIX}{uuid.uuid4().hex[:16]}"
            container_id = self.backend.create(image, name=name, session="pool", task="pool")
        except Exception:
            with self._lock:
                self.failures += 1
            raise
        finally:
            with self._lock:
                self._inflight[image] -= 1
                keep = container_id is not None and not self._closed
                if keep:
                    self._idle[image].append((container_id, time.monotonic()))
        if container_id is not None and not keep:
            self.backend.remove(container_id)
