"""Game worker processes: started on demand, leased one per episode, reused, replaced.

Why processes: TextWorld's PDDL engine is synchronous, keeps its task in process-global C
state (one game per process), grows in memory with every game it loads, and a thread that
runs a hung game cannot be stopped. A process can be killed, and replacing it every
``max_episodes`` episodes sheds the growth.

Every blocking call (spawn, request, kill) runs in a worker thread with a deadline, so the
event loop is never blocked and no call waits forever. A process whose request times out,
fails or is cancelled is killed: its state is unknown, so it is never reused.
"""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
import time
import weakref
from collections import deque
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread

from agentrl_core.errors import EnvError

log = logging.getLogger(__name__)

_MAX_LINE = 64 << 20


class GameProcessError(EnvError):
    """A game worker process died, timed out or could not start (the episode is a task error)."""


class GameError(EnvError):
    """The engine could not load or play a game; the process itself is still healthy."""


class GameProcess:
    """One ``python -m agentrl_env_alfworld.worker`` child. Its methods block: call them in a thread."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self._popen = popen
        self._buffer = b""
        self.episodes = 0
        self.broken = False

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def alive(self) -> bool:
        return not self.broken and self._popen.poll() is None

    @classmethod
    def spawn(cls, timeout: float) -> GameProcess:
        popen = subprocess.Popen(
            [sys.executable, "-m", "agentrl_env_alfworld.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,  # engine warnings go to our stderr
            close_fds=True,
        )
        proc = cls(popen)
        try:
            ready = proc._read_reply(time.monotonic() + timeout, what="start")
        except BaseException:
            proc.kill()
            raise
        if not ready.get("ready"):
            proc.kill()
            raise GameProcessError(f"ALFWorld game process {popen.pid} sent {ready!r} instead of its ready line")
        return proc

    def request(self, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one request and wait for its reply until ``timeout`` seconds have passed."""
        deadline = time.monotonic() + timeout
        try:
            assert self._popen.stdin is not None
            self._popen.stdin.write(json.dumps(payload).encode() + b"\n")
            self._popen.stdin.flush()
        except (BrokenPipeError, ValueError, OSError) as exc:
            self.broken = True
            raise GameProcessError(f"ALFWorld game process {self.pid} is gone ({type(exc).__name__}); {self._exit()}") from None
        reply = self._read_reply(deadline, what=str(payload.get("op")))
        if not reply.get("ok"):
            raise GameError(f"the ALFWorld engine failed: {reply.get('error', reply)}")
        return reply

    def _read_reply(self, deadline: float, *, what: str) -> dict[str, Any]:
        assert self._popen.stdout is not None
        fd = self._popen.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            readable = select.select([fd], [], [], max(remaining, 0))[0] if remaining > 0 else []
            if not readable:
                self.broken = True
                raise GameProcessError(
                    f"ALFWorld game process {self.pid} did not answer {what!r} in time; it is stopped "
                    "(raise environments.alfworld.*_timeout if the machine is just slow)"
                )
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self.broken = True
                raise GameProcessError(f"ALFWorld game process {self.pid} exited during {what!r}; {self._exit()}")
            self._buffer += chunk
            if len(self._buffer) > _MAX_LINE:
                self.broken = True
                raise GameProcessError(f"ALFWorld game process {self.pid} sent a reply over {_MAX_LINE} bytes")
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            self.broken = True
            raise GameProcessError(f"ALFWorld game process {self.pid} sent a line that is not JSON: {line[:200]!r}") from None

    def _exit(self) -> str:
        code = self._popen.poll()
        return "it is still running" if code is None else f"exit status {code}"

    def signal_kill(self) -> None:
        """Send SIGKILL without waiting (safe from any thread; a blocked reader then sees EOF)."""
        self.broken = True
        try:
            self._popen.kill()
        except OSError:
            pass

    def kill(self) -> None:
        self.signal_kill()
        self._reap(timeout=10)

    def stop(self, timeout: float = 5.0) -> None:
        """Close stdin (the worker exits at end of input); kill it if it does not."""
        try:
            if self._popen.stdin is not None:
                self._popen.stdin.close()
            self._popen.wait(timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()
        self._reap(timeout=timeout)

    def _reap(self, timeout: float) -> None:
        try:
            self._popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log.warning("ALFWorld game process %s did not exit after SIGKILL", self.pid)
        for stream in (self._popen.stdin, self._popen.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass

    def rss_kb(self) -> int:
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        except OSError:
            pass
        return -1


def _kill_all(processes: set[GameProcess]) -> None:
    for proc in list(processes):
        proc.signal_kill()


class GamePool:
    """Leases game processes to sessions; at most ``max_processes`` exist at once."""

    def __init__(
        self,
        *,
        max_processes: int,
        max_idle: int,
        max_episodes: int,
        start_timeout: float,
    ) -> None:
        self.max_processes = max_processes
        self.max_idle = max_idle
        self.max_episodes = max_episodes
        self.start_timeout = start_timeout
        self._idle: deque[GameProcess] = deque()
        self._all: set[GameProcess] = set()
        self._leased = 0
        self._waiters: deque[anyio.Event] = deque()
        self._limiter: tuple[Any, anyio.CapacityLimiter] | None = None
        self._closed = False
        self.started = 0  # processes ever started (for tests and benchmarks)
        # Children exit at end of input when we die; this also kills them if the pool is
        # garbage-collected or the interpreter exits without aclose().
        self._finalizer = weakref.finalize(self, _kill_all, self._all)

    @property
    def leased(self) -> int:
        return self._leased

    @property
    def processes(self) -> list[GameProcess]:
        return list(self._all)

    def _threads(self) -> anyio.CapacityLimiter:
        # One thread per process at most; a limiter belongs to one event loop, so make one per loop.
        token = anyio.lowlevel.current_token()
        if self._limiter is None or self._limiter[0] is not token:
            self._limiter = (token, anyio.CapacityLimiter(self.max_processes + 1))
        return self._limiter[1]

    async def _blocking(self, fn: Any, *args: Any) -> Any:
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._threads(), abandon_on_cancel=True)

    async def acquire(self) -> GameProcess:
        """A live process for one episode (waits while ``max_processes`` are leased)."""
        if self._closed:
            raise GameProcessError("the ALFWorld environment is closed")
        while self._leased >= self.max_processes:
            event = anyio.Event()
            self._waiters.append(event)
            try:
                await event.wait()
            except BaseException:
                if event in self._waiters:
                    self._waiters.remove(event)
                elif self._waiters:
                    self._waiters.popleft().set()  # woken but leaving: pass the wake-up on
                raise
        self._leased += 1
        try:
            while self._idle:
                proc = self._idle.pop()
                if proc.alive:
                    return proc
                await self._discard(proc)
            return await self._spawn()
        except BaseException:
            self._give_back_slot()
            raise

    async def _spawn(self) -> GameProcess:
        proc = await self._blocking(GameProcess.spawn, self.start_timeout)
        self._all.add(proc)
        self.started += 1
        return proc

    async def replace(self, proc: GameProcess) -> GameProcess:
        """Swap a dead leased process for a fresh one (the lease is kept)."""
        await self._discard(proc)
        return await self._spawn()

    async def call(self, proc: GameProcess, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        try:
            return await self._blocking(proc.request, payload, timeout)
        except GameError:
            raise
        except BaseException:
            # Timed out, died or cancelled mid-request: the game state is unknown; stop it now
            # (this also ends an abandoned reader thread, which then sees end of file).
            proc.signal_kill()
            raise

    async def release(self, proc: GameProcess | None, *, episode_done: bool = True) -> None:
        """Return a leased process: kept idle if healthy, else stopped."""
        try:
            if proc is None:
                return
            if episode_done:
                proc.episodes += 1
            keep = (
                not self._closed
                and proc.alive
                and (self.max_episodes == 0 or proc.episodes < self.max_episodes)
                and len(self._idle) < self.max_idle
            )
            if keep:
                self._idle.append(proc)
            else:
                with anyio.CancelScope(shield=True):
                    await self._discard(proc)
        finally:
            self._give_back_slot()

    def _give_back_slot(self) -> None:
        self._leased -= 1
        if self._waiters:
            self._waiters.popleft().set()

    async def _discard(self, proc: GameProcess) -> None:
        self._all.discard(proc)
        if proc.alive:
            await self._blocking(proc.stop)
        else:
            await self._blocking(proc.kill)

    async def aclose(self) -> None:
        self._closed = True
        with anyio.CancelScope(shield=True):
            while self._idle:
                await self._discard(self._idle.pop())
