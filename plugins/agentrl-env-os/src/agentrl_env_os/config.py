"""Config section ``environments.os``."""

from __future__ import annotations

from typing import Literal

from attrs import field, frozen

from agentrl_core.structure import check, in_range

_MEMORY_UNITS = ("b", "k", "m", "g")


def _memory_ok(value: str) -> bool:
    value = value.strip().lower()
    number = value[:-1] if value[-1:] in _MEMORY_UNITS else value
    return number.isdigit() and int(number) > 0


def size_bytes(value: str) -> int:
    """``512m``, ``1g``, ``4096`` -> bytes (binary units, as Docker reads them)."""
    value = value.strip().lower()
    unit = value[-1:] if value[-1:] in _MEMORY_UNITS else "b"
    number = value[:-1] if value[-1:] in _MEMORY_UNITS else value
    return int(number) * 1024 ** _MEMORY_UNITS.index(unit)


#: Capabilities an episode's root keeps (every other one is dropped). Docker's default set minus
#: MKNOD, NET_RAW, NET_BIND_SERVICE, SETFCAP, SETPCAP and SYS_CHROOT, which no task uses: CHOWN,
#: DAC_OVERRIDE, FOWNER, FSETID for root's file work (chown/chmod of others' files, SUID/SGID bits,
#: dpkg unpacking), SETUID/SETGID for useradd, su, runuser, sudo and apt's ``_apt`` sandbox, KILL
#: for killing other users' processes, AUDIT_WRITE for the PAM audit records of su/sudo/login.
DEFAULT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID", "KILL", "AUDIT_WRITE")


def _capabilities_ok(value: tuple[str, ...]) -> bool:
    return all(isinstance(c, str) and c.isupper() and not c.startswith("CAP_") and c != "ALL" for c in value)


def _tmpfs_ok(value: dict[str, str]) -> bool:
    return all(p.startswith("/") and "size=" in o for p, o in value.items())


@frozen
class OSConfig:
    """Settings of the ``os`` environment (all optional).

    The defaults follow AgentBench FC: 8 rounds, a 30 s limit per shell command, 1 GiB of
    memory per container, tool output truncated to 780 characters past 800.
    """

    backend: Literal["docker"] = "docker"
    #: Docker endpoint; ``None`` uses ``DOCKER_HOST`` or the local socket.
    docker_host: str | None = None
    #: Repository prefix of the images ``agentrl-env-os build-images`` creates.
    image_prefix: str = field(default="agentrl-os", validator=check(lambda v: v and v == v.lower(), "must be a lowercase image name"))
    #: Image tag; ``None`` uses the content hash of this package's image recipe.
    image_tag: str | None = None
    #: Whose root file system the images have: "ubuntu" (24.04, as upstream's) or "debian" (bookworm,
    #: this package's earlier images); ``agentrl-env-os build-images --distro`` builds either.
    distro: Literal["ubuntu", "debian"] = "ubuntu"
    #: Open-file limit (soft = hard) of each container; ``None`` inherits dockerd's. Std task 26
    #: (``4/Q09.json``) writes to file descriptor 123321, so it needs more than 123321; raising the
    #: limit above dockerd's own needs CAP_SYS_RESOURCE where dockerd runs.
    open_files: int | None = field(default=None, validator=in_range(64))
    round_limit: int = field(default=8, validator=in_range(1))
    #: How tool calls are read: "upstream" (AgentBench-FC's task: the first argument value whatever
    #: its key; ``finish_action {}`` is scored), "strict" (the schemas; a call that breaks them gets
    #: the reason), "auto" (upstream for std and dev, strict for train).
    tool_arguments: Literal["auto", "upstream", "strict"] = "auto"
    #: Seconds an agent's command may run before it is interrupted (the episode continues).
    command_timeout_s: float = field(default=30.0, validator=in_range(0, lo_open=True))
    #: Seconds to wait for the prompt after Ctrl-C before the shell is restarted.
    interrupt_grace_s: float = field(default=5.0, validator=in_range(0, lo_open=True))
    #: Limit for one init, check or example script (run with `docker exec`).
    script_timeout_s: float = field(default=120.0, validator=in_range(0, lo_open=True))
    #: Tool output longer than ``output_limit`` characters keeps its first ``output_keep``.
    output_limit: int = field(default=800, validator=in_range(1))
    output_keep: int = field(default=780, validator=in_range(0))
    #: Bytes of output an init/check/example script (``docker exec``) keeps per stream; the rest is
    #: read and dropped (the agent's shell keeps 256 KiB per command, its observation far less).
    script_output_limit: int = field(default=1024 * 1024, validator=in_range(1024))
    memory: str = field(default="1g", validator=check(_memory_ok, "must be a size like 512m or 1g"))
    cpus: float = field(default=1.0, validator=in_range(0.01))
    pids_limit: int = field(default=512, validator=in_range(16))
    #: Most bytes a container may write on top of its image (its writable layer). Enforced by the
    #: storage driver where it can (``--storage-opt size``: overlay2 on xfs with pquota, btrfs, zfs),
    #: else by a watchdog that removes a container past it (every ``disk_check_s``); either way no
    #: single file may grow past it (``ulimit -f``). ``None``: no limit.
    disk_limit: str | None = field(default="2g", validator=check(_memory_ok, "must be a size like 512m or 2g, or null"))
    disk_check_s: float = field(default=5.0, validator=in_range(0.5))
    #: Capabilities root keeps in a container; all others are dropped (see DEFAULT_CAPABILITIES).
    capabilities: tuple[str, ...] = field(
        default=DEFAULT_CAPABILITIES, converter=tuple,
        validator=check(_capabilities_ok, "must be capability names like CHOWN (upper case, without CAP_)"),
    )
    #: Set no_new_privs: setuid programs (sudo, su, passwd) do not raise a non-root user's privileges.
    no_new_privileges: bool = True
    #: Mount the image's root file system read-only; then only the ``tmpfs`` paths are writable.
    #: Off by default: upstream's tasks write all over the file system (/usr, /etc, /var, /home,
    #: apt installs into /usr), so a read-only root fails most of std.
    read_only_root: bool = False
    #: tmpfs mounts (path -> mount options, which must include ``size=``), e.g.
    #: ``{"/tmp": "size=256m,mode=1777,exec"}``; their contents count against ``memory``.
    tmpfs: dict[str, str] = field(factory=dict, validator=check(_tmpfs_ok, "must map absolute paths to tmpfs options with size=, like {\"/tmp\": \"size=256m,mode=1777,exec\"}"))
    #: A container removes itself after this many seconds even if nobody closes it.
    container_lifetime_s: int = field(default=3 * 3600, validator=in_range(60))
    concurrency: int = field(default=32, validator=in_range(1))
    #: Started, unused containers kept ready per image (0 disables), so an episode starts at once.
    warm_pool: int = field(default=4, validator=in_range(0))
    #: Remove containers left by dead workers of this host when the environment starts.
    sweep_on_start: bool = True
    #: Folder holding the task data (``data/``, ``scripts/``, ``train_0317/``); default: the wheel's.
    data_dir: str | None = None
