"""A persistent interactive bash on a pseudo-terminal inside the episode's container.

Upstream (AgentBench FC) types each command into ``bash --login`` on a TTY and reads until
something that looks like a colored prompt appears. That breaks on multi-line scripts, on
``su`` to a user whose prompt differs, on tabs (readline completion) and on output that
looks like a prompt. Here the terminal is made quiet once (no echo, no line editing, empty
prompts) and every script is followed by a sentinel line::

    <script>
     printf '\\036AGENTRL-<token>-<seq>-%d\\036' "$?"

The shell prints the sentinel when it has run the whole script, with the exit status of
its last command. Nested shells (``su - jack``, ``bash``) read the sentinel too, so ``cd``,
variables and the current user persist across turns exactly as in a terminal.

A command that runs past ``command_timeout`` is interrupted with Ctrl-C; if the terminal
does not come back, the foreground job is killed; if that fails too, the shell is replaced
by a fresh one. The terminal does not flush typed-ahead input on Ctrl-C (``stty noflsh``),
so the sentinel is never lost: the lines of the script after the interrupted command still
run, as they would in a script. After an interruption the terminal settings are reset
(``stty sane``), in case the killed program left the terminal in raw mode. The caller learns which happened from :class:`ShellResult`. A shell that
exits (``exit``) is replaced as well.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from typing import Any

import anyio
from attrs import frozen

from agentrl_core.errors import EnvError
from agentrl_env_os.docker_backend import ContainerGone, DockerBackend, ExecRefused

log = logging.getLogger(__name__)

_wait_readable = getattr(anyio, "wait_readable", None) or anyio.wait_socket_readable
_wait_writable = getattr(anyio, "wait_writable", None) or anyio.wait_socket_writable

SHELL_ARGV = ("bash", "--login", "--noediting")
SHELL_ENV = {"TERM": "xterm", "PAGER": "cat", "GIT_PAGER": "cat", "SYSTEMD_PAGER": "cat"}
# Typed once into a new shell. The image's /etc/bash.bashrc does the same for nested shells.
# The prompt marker tells that the shell is back at its prompt after an interrupted command.
PROMPT_MARKER = b"\x1eAGENTRL-P\x1e"
QUIET = (
    " stty -echo noflsh 2>/dev/null; set +o emacs +o vi 2>/dev/null; PS1=''; PS2=''; "
    "PROMPT_COMMAND='printf \"\\036AGENTRL-P\\036\"; PS1=; PS2='; HISTCONTROL=ignoreboth"
)
MAX_KEPT_OUTPUT = 256 * 1024  # bytes of output kept per command (the observation keeps far less)
_TAIL = 256  # bytes kept unscanned at the end of the buffer, so a marker split across reads is found

_ANSI = [
    re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]"),  # CSI: colors, cursor movement, bracketed paste
    re.compile(rb"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"),  # OSC: window titles
    re.compile(rb"\x1b[()][0-9A-Za-z]"),  # character set selection
    re.compile(rb"\x1b[=>78DEHMNOZc]"),  # other two-byte escapes
    re.compile(rb"\x07"),
]


class ShellError(EnvError):
    """The terminal could not be opened or answered nothing (an infrastructure failure)."""


@frozen
class ShellResult:
    output: bytes
    exit_code: int | None
    timed_out: bool = False
    #: How a timed-out command was stopped: "interrupt" (Ctrl-C), "kill" or "restart".
    stopped_by: str | None = None
    #: The shell exited (e.g. ``exit``) and a new one was started.
    shell_exited: bool = False
    #: The container refused every new process; the shell is unusable.
    unresponsive: bool = False


def clean_output(raw: bytes) -> str | None:
    """Terminal bytes -> text: escape sequences removed, CRLF -> LF; None if not UTF-8."""
    for pattern in _ANSI:
        raw = pattern.sub(b"", raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text.replace("\r\n", "\n")


class InteractiveShell:
    """One bash on a TTY; ``run`` types a script and returns its output."""

    def __init__(
        self,
        backend: DockerBackend,
        container_id: str,
        *,
        command_timeout: float,
        interrupt_grace: float,
        ready_timeout: float = 20.0,
    ) -> None:
        self.backend = backend
        self.container_id = container_id
        self.command_timeout = command_timeout
        self.interrupt_grace = interrupt_grace
        self.ready_timeout = ready_timeout
        self.token = secrets.token_hex(8)
        self._marker = re.compile(rb"\x1eAGENTRL-" + self.token.encode() + rb"-(\d+)-(\d+)\x1e")
        # A sentinel line as typed, if a command read it from the terminal and printed it.
        self._typed = re.compile(rb" (?:stty [^;]*; )?printf '\\036AGENTRL-" + self.token.encode() + rb"-\d+-%d\\036' \"\$\?\"\r?\n?")
        self._info = re.compile(rb"\x1eAGENTRL-INFO-" + self.token.encode() + rb" (\d+) (\S+)\x1e")
        self._seq = 0
        self._conn: tuple[Any, Any] | None = None
        self._buffer = bytearray()
        self.pid: int | None = None
        self.tty: str | None = None
        self.restarts = 0
        self.unresponsive = False

    # -- lifecycle ----------------------------------------------------------------------

    async def open(self) -> float:
        """Start the shell and wait until it answers; returns the seconds it took."""
        t0 = time.monotonic()
        _, conn = await self.backend.call(
            self.backend.open_tty, self.container_id, list(SHELL_ARGV), dict(SHELL_ENV)
        )
        self._conn = conn
        conn[1].setblocking(False)
        self._buffer.clear()
        seq = self._next_seq()
        info = f""" printf '\\036AGENTRL-INFO-{self.token} %s %s\\036' "$$" "$(tty)"\n"""
        await self._send((QUIET + "\n" + info).encode() + self._sentinel(seq))
        found, output, _, eof = await self._read_until(seq, self.ready_timeout)
        if not found:
            why = "exited" if eof else f"did not answer within {self.ready_timeout:.0f} s"
            raise ShellError(f"the shell in container {self.container_id[:12]} {why}: {output[-300:]!r}")
        m = self._info.search(output)
        if m:
            self.pid, self.tty = int(m.group(1)), m.group(2).decode()
        return time.monotonic() - t0

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            for part in conn:
                try:
                    part.close()
                except OSError:
                    pass

    # -- running ------------------------------------------------------------------------

    async def run(self, script: str) -> ShellResult:
        if self.unresponsive:
            return ShellResult(b"", None, unresponsive=True)
        restarted = False
        if self._conn is None:
            await self.open()
        seq = self._next_seq()
        pending = self._clean(self._buffer)  # background jobs' output since the last command
        self._buffer.clear()
        payload = script.encode("utf-8", errors="surrogateescape") + b"\n" + self._sentinel(seq)
        try:
            await self._send(payload)
        except ShellError:  # the shell died between commands (e.g. killed for memory)
            await self._replace(kill=False)
            if self.unresponsive:
                return ShellResult(pending, None, shell_exited=True, unresponsive=True)
            restarted = True
            await self._send(payload)
        found, output, code, eof = await self._read_until(seq, self.command_timeout)
        output = pending + output
        if found:
            return ShellResult(output, code, shell_exited=restarted)
        if eof:
            await self._replace(kill=False)
            return ShellResult(output, None, shell_exited=True, unresponsive=self.unresponsive)
        stopped = await self._stop(output)
        return stopped

    async def _stop(self, output: bytes) -> ShellResult:
        """Stop a command that ran past the limit: Ctrl-C, then kill, then a new shell.

        The shell is back when it prints a prompt (PROMPT_COMMAND's marker); only then is a
        new sentinel typed, so a dying program that reads the terminal cannot swallow it.
        """
        try:
            await self._send(b"\x03")
        except ShellError:  # the shell is gone
            await self._replace(kill=False)
            return ShellResult(output, None, timed_out=True, stopped_by="restart", unresponsive=self.unresponsive)
        back, more, eof = await self._wait_for_prompt(self.interrupt_grace)
        output += more
        stopped_by = "interrupt"
        if not back and not eof and await self._kill_foreground():
            stopped_by = "kill"
            back, more, eof = await self._wait_for_prompt(self.interrupt_grace)
            output += more
        if back:
            seq = self._next_seq()
            await self._send(self._sentinel(seq, reset=True))
            found, more, _, eof = await self._read_until(seq, self.interrupt_grace)
            output += more
            if found:
                return ShellResult(output, None, timed_out=True, stopped_by=stopped_by)
        await self._replace(kill=not eof)
        return ShellResult(output, None, timed_out=True, stopped_by="restart", unresponsive=self.unresponsive)

    async def _wait_for_prompt(self, timeout: float) -> tuple[bool, bytes, bool]:
        """Read until the shell prints a prompt (or any sentinel); returns (back, output, eof)."""
        kept = bytearray()
        with anyio.move_on_after(timeout):
            while True:
                at = self._buffer.find(PROMPT_MARKER)
                m = self._marker.search(self._buffer)
                if m is not None and (at < 0 or m.start() < at):
                    at = m.start()
                if at >= 0:
                    kept += self._buffer[:at]
                    del self._buffer[:at]
                    return True, self._clean(kept), False
                chunk = await self._recv()
                if not chunk:
                    kept += self._buffer
                    self._buffer.clear()
                    return False, self._clean(kept), True
                self._buffer += chunk
        kept += self._buffer
        self._buffer.clear()
        return False, self._clean(kept), False

    def _clean(self, data: bytes | bytearray) -> bytes:
        """Remove what the machinery printed: markers of abandoned commands, prompts, typed sentinels."""
        data = self._marker.sub(b"", data)
        return self._typed.sub(b"", data.replace(PROMPT_MARKER, b""))

    async def _kill_foreground(self) -> bool:
        """SIGKILL the terminal's foreground process group unless it is the shell itself."""
        if self.pid is None:
            return False
        script = (
            f"s=$(cat /proc/{self.pid}/stat) || exit 1; s=${{s##*) }}; set -- $s; "
            f'pg=$6; [ "$pg" -gt 1 ] && [ "$pg" != {self.pid} ] && kill -KILL -- -"$pg"'
        )
        try:
            code, _, _ = await self.backend.call(self.backend.exec_script, self.container_id, ["bash", "-c", script])
        except ExecRefused:
            return False
        return code == 0

    async def _replace(self, *, kill: bool) -> None:
        """Kill everything on the old terminal and open a new shell."""
        self.restarts += 1
        await self.close()
        try:
            if kill and self.tty and self.tty.startswith("/dev/"):
                await self.backend.call(
                    self.backend.exec_script, self.container_id,
                    ["bash", "-c", f"pkill -KILL -t {self.tty[5:]} || kill -KILL {self.pid or 0}"],
                )
            await self.open()
        except (ExecRefused, ShellError) as exc:
            if not await self.backend.call(self.backend.running, self.container_id):
                # Removed from outside (or by the disk watchdog) while the new shell started.
                raise ContainerGone(self.backend.gone_reason(self.container_id, f"stopped: {exc}")) from None
            log.info("container %s: the shell cannot be restarted (%s)", self.container_id[:12], exc)
            self.unresponsive = True
        except ContainerGone:
            raise

    # -- I/O ----------------------------------------------------------------------------

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _sentinel(self, seq: int, *, reset: bool = False) -> bytes:
        stty = "stty sane -echo noflsh 2>/dev/null; " if reset else ""
        return f""" {stty}printf '\\036AGENTRL-{self.token}-{seq}-%d\\036' "$?"\n""".encode()

    async def _send(self, data: bytes) -> None:
        if self._conn is None:
            raise ShellError("the shell is closed")
        sock = self._conn[1]
        view = memoryview(data)
        while view:
            try:
                sent = sock.send(view)
            except BlockingIOError:
                await _wait_writable(sock)
                continue
            except OSError as exc:
                raise ShellError(f"writing to the shell failed: {exc}") from None
            view = view[sent:]

    async def _read_until(self, seq: int, timeout: float) -> tuple[bool, bytes, int | None, bool]:
        """Read until the sentinel ``seq``; returns (found, output, exit code, eof)."""
        kept = bytearray()
        eof = False
        with anyio.move_on_after(timeout):
            while True:
                while (m := self._marker.search(self._buffer)) is not None:
                    mseq, code, start, end = int(m.group(1)), int(m.group(2)), m.start(), m.end()
                    if mseq == seq:
                        kept += self._buffer[:start]
                        del self._buffer[:end]
                        return True, self._clean(kept), code, False
                    del self._buffer[start:end]  # a marker of an earlier, abandoned command
                if len(self._buffer) > _TAIL:
                    # Clean before cutting, so no complete marker is split between kept and buffer.
                    self._buffer[:] = self._clean(self._buffer)
                    cut = max(0, len(self._buffer) - _TAIL)
                    room = max(0, MAX_KEPT_OUTPUT - len(kept))
                    kept += self._buffer[: min(cut, room)]
                    del self._buffer[:cut]
                chunk = await self._recv()
                if not chunk:
                    eof = True
                    break
                self._buffer += chunk
        kept += self._buffer
        self._buffer.clear()
        return False, self._clean(kept), None, eof

    async def _recv(self) -> bytes:
        if self._conn is None:
            return b""
        sock = self._conn[1]
        while True:
            try:
                return sock.recv(65536)
            except BlockingIOError:
                await _wait_readable(sock)
            except OSError:
                return b""
