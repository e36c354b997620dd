"""Containers through the Docker SDK: create, exec, remove, and sweep what dead workers left.

Every blocking SDK call runs in a worker thread (:func:`agentrl_core.env.run_blocking`
with this backend's limiter); the event loop never waits on Docker.

Ownership: each container carries labels naming the worker process that created it
(host name, pid and the pid's start time, so a recycled pid is not mistaken for the
owner). :meth:`DockerBackend.sweep` removes the containers of workers of this host that no
longer run; a container also removes itself when its main process (``sleep
<container_lifetime_s>``) ends, so nothing outlives a lost host for long.

Sandbox: no network, cgroup limits on memory (no swap), CPU and processes, only the
capabilities of ``OSConfig.capabilities``, no_new_privs, a per-file size limit and a limit on
what the container writes on top of its image (``disk_limit``: the storage driver's quota where
it has one, else :class:`DiskWatch`, which removes a container past it).
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import anyio
from attrs import frozen

from agentrl_core.env import run_blocking
from agentrl_core.errors import EnvError
from agentrl_env_os.config import OSConfig, size_bytes

log = logging.getLogger(__name__)

LABEL_MANAGED = "agentrl.env-os.managed"
LABEL_WORKER = "agentrl.env-os.worker"
LABEL_HOST = "agentrl.env-os.host"
LABEL_PID = "agentrl.env-os.pid"
LABEL_PID_START = "agentrl.env-os.pid-start"
LABEL_SESSION = "agentrl.env-os.session"
LABEL_TASK = "agentrl.env-os.task"

# The container's user-visible environment matches `docker run` of the upstream images.
WORKDIR = "/root"


class DockerUnavailable(EnvError):
    """The Docker engine cannot be reached or lacks the task images (an infrastructure failure)."""


class ContainerGone(EnvError):
    """The episode's container disappeared or stopped (an infrastructure failure)."""


class ExecRefused(EnvError):
    """The running container refused a new process (its pid or memory limit is exhausted)."""


def _pid_start(pid: int) -> str | None:
    """Start time of ``pid`` in clock ticks since boot, or None if it does not run."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


@frozen
class WorkerIdentity:
    """Who owns a container: a process on a host."""

    host: str
    pid: int
    pid_start: str
    id: str

    @classmethod
    def current(cls) -> WorkerIdentity:
        pid = os.getpid()
        return cls(socket.gethostname(), pid, _pid_start(pid) or "0", uuid.uuid4().hex[:12])

    def labels(self) -> dict[str, str]:
        return {
            LABEL_MANAGED: "1",
            LABEL_WORKER: self.id,
            LABEL_HOST: self.host,
            LABEL_PID: str(self.pid),
            LABEL_PID_START: self.pid_start,
        }


def owner_is_dead(labels: dict[str, str], host: str) -> bool:
    """True when the labels name a process of ``host`` that is no longer running."""
    if labels.get(LABEL_HOST) != host:
        return False  # another host's worker: we cannot tell, leave it to its own sweeper
    try:
        pid = int(labels.get(LABEL_PID, ""))
    except ValueError:
        return True
    return _pid_start(pid) != labels.get(LABEL_PID_START)


def _no_storage_quota(exc: Exception) -> bool:
    """True for Docker's refusal of ``--storage-opt size`` (e.g. overlay2 on ext4, or xfs without pquota)."""
    text = str(exc).lower()
    return "storage-opt" in text or "storage opt" in text or "pquota" in text or "quota" in text and "support" in text


def _is_refusal(exc: Exception) -> bool:
    text = str(exc).lower()
    return any(s in text for s in ("resource temporarily unavailable", "cannot allocate memory", "pids", "fork"))


class DockerBackend:
    """One Docker client shared by all sessions of an environment."""

    def __init__(self, config: OSConfig, *, limiter: anyio.CapacityLimiter | None = None) -> None:
        self.config = config
        self.worker = WorkerIdentity.current()
        self.limiter = limiter or anyio.CapacityLimiter(max(4, config.concurrency + 4))
        self._api: Any = None
        #: How ``disk_limit`` is enforced: None (not yet known), "quota" (the storage driver's) or "watch".
        self.disk_mode: str | None = None if config.disk_limit else "off"
        self.disk_watch: DiskWatch | None = None
        self._disk_lock = threading.Lock()

    # -- client -------------------------------------------------------------------------

    @property
    def api(self) -> Any:
        """The low-level ``docker.APIClient`` (created on first use, in the caller's thread)."""
        if self._api is None:
            self._api = self._connect()
        return self._api

    def _connect(self) -> Any:
        import docker

        kwargs: dict[str, Any] = docker.utils.kwargs_from_env()
        if self.config.docker_host:
            kwargs = {"base_url": self.config.docker_host}
        where = kwargs.get("base_url") or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        try:
            api = docker.APIClient(
                version="auto", timeout=max(60, int(self.config.script_timeout_s) + 10),
                max_pool_size=self.config.concurrency + 8, **kwargs,
            )
        except Exception as exc:
            raise DockerUnavailable(
                f"cannot reach the Docker engine at {where} ({type(exc).__name__}: {exc}); start dockerd "
                "(plugins/agentrl-env-os/tests/ci_setup.sh does it) or set environments.os.docker_host."
            ) from None
        return api

    async def call(self, fn: Any, *args: Any) -> Any:
        return await run_blocking(fn, *args, limiter=self.limiter)

    def close(self) -> None:
        if self.disk_watch is not None:
            self.disk_watch.stop()
            self.disk_watch = None
        if self._api is not None:
            self._api.close()
            self._api = None

    # -- images -------------------------------------------------------------------------

    def require_image(self, ref: str) -> None:
        import docker.errors

        try:
            self.api.inspect_image(ref)
        except docker.errors.ImageNotFound:
            raise DockerUnavailable(
                f"the task image {ref} is missing; build it with `agentrl-env-os build-images` (as root)."
            ) from None

    # -- containers ---------------------------------------------------------------------

    def host_config(self, *, storage_quota: bool) -> dict[str, Any]:
        """The sandbox of one container (see the module docstring and the README's isolation model)."""
        import docker.types

        cfg = self.config
        ulimits = []
        if cfg.open_files:
            ulimits.append(docker.types.Ulimit(name="nofile", soft=cfg.open_files, hard=cfg.open_files))
        if cfg.disk_limit:  # no single file larger than the disk limit (bash: "File size limit exceeded")
            limit = size_bytes(cfg.disk_limit)
            ulimits.append(docker.types.Ulimit(name="fsize", soft=limit, hard=limit))
        return self.api.create_host_config(
            network_mode="none",
            mem_limit=cfg.memory,
            memswap_limit=cfg.memory,  # no swap on top of the memory limit
            nano_cpus=int(cfg.cpus * 1e9),
            pids_limit=cfg.pids_limit,
            auto_remove=True,
            cap_drop=["ALL"],
            cap_add=list(cfg.capabilities) or None,
            security_opt=["no-new-privileges:true"] if cfg.no_new_privileges else None,
            read_only=cfg.read_only_root,
            tmpfs=dict(cfg.tmpfs) or None,
            storage_opt={"size": cfg.disk_limit} if storage_quota else None,
            ulimits=ulimits or None,
        )

    def create(self, image: str, *, name: str, session: str, task: str) -> str:
        """Create and start one episode's container; returns its id."""
        import docker.errors

        cfg = self.config
        labels = {**self.worker.labels(), LABEL_SESSION: session, LABEL_TASK: task}

        def create_container(storage_quota: bool) -> dict[str, Any]:
            return self.api.create_container(
                image,
                name=name,
                command=["sleep", str(cfg.container_lifetime_s)],
                user="root",
                working_dir=WORKDIR,
                labels=labels,
                host_config=self.host_config(storage_quota=storage_quota),
                network_disabled=True,
                detach=True,
            )

        try:
            if self.disk_mode in (None, "quota"):
                try:
                    created = create_container(True)
                    self.disk_mode = "quota"
                except docker.errors.APIError as exc:
                    if self.disk_mode == "quota" or not _no_storage_quota(exc):
                        raise
                    log.info("the Docker storage driver has no per-container quota (%s); a watchdog enforces "
                             "environments.os.disk_limit=%s", exc.explanation or exc, cfg.disk_limit)
                    self.disk_mode = "watch"
                    created = create_container(False)
            else:
                created = create_container(False)
        except docker.errors.ImageNotFound:
            raise DockerUnavailable(
                f"the task image {image} is missing; build it with `agentrl-env-os build-images` (as root)."
            ) from None
        if self.disk_mode == "watch":
            self._start_disk_watch()
        container_id = created["Id"]
        try:
            self.api.start(container_id)
            # Without a network Docker lists no address for the container's own name, and sudo
            # then prints "unable to resolve host" on every call (upstream's containers had one).
            self.exec_script(container_id, ["sh", "-c", 'printf "127.0.1.1\\t%s\\n" "$(hostname)" >> /etc/hosts'])
        except docker.errors.APIError as exc:
            self.remove(container_id)
            if cfg.open_files and "rlimit" in str(exc).lower():
                raise DockerUnavailable(
                    f"a container cannot get the open-file limit environments.os.open_files={cfg.open_files} "
                    f"({exc.explanation or exc}); the Docker host does not allow it (raising the limit needs "
                    "CAP_SYS_RESOURCE): lower open_files or set it to null to inherit dockerd's limit."
                ) from None
            raise
        except BaseException:
            self.remove(container_id)
            raise
        return container_id

    def remove(self, container_id: str) -> None:
        """Kill and remove a container; a container already gone is fine."""
        import docker.errors

        try:
            self.api.remove_container(container_id, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code == 409 and "already in progress" in str(exc):
                return  # auto-removal raced us
            raise

    def running(self, container_id: str) -> bool:
        import docker.errors

        try:
            return bool(self.api.inspect_container(container_id)["State"]["Running"])
        except docker.errors.NotFound:
            return False

    def exec_script(self, container_id: str, argv: Sequence[str]) -> tuple[int, bytes, bytes]:
        """Run ``argv`` as root in ``/root`` (stdin closed); returns (exit code, stdout, stderr).

        Background processes the command leaves behind keep running; Docker stops waiting
        for their output shortly after the command itself exits. Each stream keeps its first
        ``script_output_limit`` bytes; the rest is read and dropped, so a script printing
        without end costs no memory (its time is bounded by the caller, and by the container's
        removal when the episode closes).
        """
        import docker.errors

        limit = self.config.script_output_limit
        try:
            exec_id = self.api.exec_create(container_id, list(argv), user="root", workdir=WORKDIR)["Id"]
            out, err = bytearray(), bytearray()
            for chunk_out, chunk_err in self.api.exec_start(exec_id, demux=True, stream=True):
                if chunk_out and len(out) < limit:
                    out += chunk_out[: limit - len(out)]
                if chunk_err and len(err) < limit:
                    err += chunk_err[: limit - len(err)]
            stdout, stderr = bytes(out), bytes(err)
            exit_code = self.api.exec_inspect(exec_id).get("ExitCode")
        except docker.errors.NotFound:
            raise ContainerGone(self.gone_reason(container_id, "disappeared during an exec")) from None
        except docker.errors.APIError as exc:
            if self.running(container_id):
                if _is_refusal(exc):
                    raise ExecRefused(f"container {container_id[:12]} refused a new process: {exc}") from None
                raise
            raise ContainerGone(self.gone_reason(container_id, f"stopped: {exc}")) from None
        return (exit_code if exit_code is not None else -1), stdout or b"", stderr or b""

    def open_tty(self, container_id: str, argv: Sequence[str], environment: dict[str, str]) -> tuple[Any, Any]:
        """Start ``argv`` on a pseudo-terminal; returns ``(exec_id, socket)``, a raw stream socket."""
        import docker.errors

        try:
            exec_id = self.api.exec_create(
                container_id, list(argv), stdin=True, tty=True, user="root", workdir=WORKDIR, environment=environment,
            )["Id"]
            sock_io = self.api.exec_start(exec_id, tty=True, socket=True)
        except docker.errors.NotFound:
            raise ContainerGone(self.gone_reason(container_id, "disappeared")) from None
        except docker.errors.APIError as exc:
            if not self.running(container_id):  # stopped or being removed (409/500 "is not running")
                raise ContainerGone(self.gone_reason(container_id, f"stopped: {exc}")) from None
            if _is_refusal(exc):
                raise ExecRefused(f"container {container_id[:12]} refused a new shell: {exc}") from None
            raise
        raw = getattr(sock_io, "_sock", sock_io)
        if not isinstance(raw, socket.socket):
            raise DockerUnavailable(
                f"the Docker endpoint {self.api.base_url} gives no plain socket for a terminal; "
                "use a unix:// or tcp:// docker_host."
            )
        return exec_id, (sock_io, raw)

    # -- ownership ----------------------------------------------------------------------

    def ours(self, *, worker: str | None = None) -> list[dict[str, Any]]:
        """Containers (running or not) created by this environment, optionally by one worker."""
        label = [f"{LABEL_MANAGED}=1"] + ([f"{LABEL_WORKER}={worker}"] if worker else [])
        return self.api.containers(all=True, filters={"label": label})

    def sweep(self) -> int:
        """Remove containers whose owner process on this host is gone; returns how many."""
        removed = 0
        for c in self.ours():
            labels = c.get("Labels") or {}
            if labels.get(LABEL_WORKER) == self.worker.id:
                continue
            if owner_is_dead(labels, self.worker.host):
                log.info("removing container %s left by dead worker %s", c["Id"][:12], labels.get(LABEL_WORKER))
                self.remove(c["Id"])
                removed += 1
        return removed


    # -- disk ---------------------------------------------------------------------------

    def _start_disk_watch(self) -> None:
        with self._disk_lock:
            if self.disk_watch is None:
                self.disk_watch = DiskWatch(self)

    def gone_reason(self, container_id: str, what: str) -> str:
        """Why a container is gone: the disk watchdog's removal if it was that, else ``what``."""
        watch = self.disk_watch
        for removed, size in watch.removed if watch is not None else ():
            if removed == container_id:
                return (f"container {container_id[:12]} was removed: it wrote {size} bytes, more than "
                        f"environments.os.disk_limit={self.config.disk_limit}")
        return f"container {container_id[:12]} {what}"

    def over_disk_limit(self) -> list[tuple[str, int]]:
        """(id, bytes written) of this worker's running containers whose writable layer exceeds ``disk_limit``."""
        limit = size_bytes(self.config.disk_limit or "0")
        listed = self.api.containers(size=True, filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_WORKER}={self.worker.id}"]})
        return [(c["Id"], int(c.get("SizeRw") or 0)) for c in listed if int(c.get("SizeRw") or 0) > limit]


class DiskWatch:
    """Where the storage driver cannot limit a container's writable layer (overlay2 on ext4):
    every ``disk_check_s`` seconds, remove this worker's containers that wrote more than
    ``disk_limit`` on top of their image. The episode then fails as an infrastructure error
    (its container is gone); ``ulimit -f`` keeps any single file below the limit meanwhile,
    so between two checks a container can outgrow the limit only with many files.
    """

    def __init__(self, backend: DockerBackend) -> None:
        self.backend = backend
        self.removed: collections.deque[tuple[str, int]] = collections.deque(maxlen=1024)  # (id, bytes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentrl-env-os-disk-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.backend.config.disk_check_s):
            try:
                self.check()
            except Exception as exc:  # Docker briefly unreachable: try again at the next tick
                log.warning("disk watch: listing container sizes failed: %s", exc)

    def check(self) -> int:
        """One round: remove the containers over the limit; returns how many."""
        over = self.backend.over_disk_limit()
        for container_id, size in over:
            log.warning("removing container %s: it wrote %d bytes, more than environments.os.disk_limit=%s",
                        container_id[:12], size, self.backend.config.disk_limit)
            self.removed.append((container_id, size))
            self.backend.remove(container_id)
        return len(over)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
