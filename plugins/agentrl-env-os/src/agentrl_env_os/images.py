"""Build the task images locally, without a registry: debootstrap -> docker import -> commits.

Upstream builds ``local-os/{default,packages,ubuntu}`` from ``ubuntu`` with Dockerfiles that
download packages at build time (``res/dockerfiles``). There is no registry here, so:

1. ``base``: ``debootstrap --variant=minbase`` of Debian (bookworm) on the host, imported
   with ``docker import`` (the only step that needs debootstrap and root);
2. ``default``: a build container from ``base`` on the host network installs upstream's
   package set (python3, pip, git, vim, curl, wget, unzip, zip, tree) plus what the tasks'
   scripts call (procps, psmisc, less, file), configures the quiet terminal for nested shells
   (see :mod:`agentrl_env_os.shell`), and adds a local ``file:`` apt repository with the
   packages tasks install (sudo, net-tools, iproute2, lsof, ...) so ``apt update && apt
   install sudo -y`` works without a network; then ``docker commit``;
3. ``packages``: ``default`` + npm (upstream's extra), committed the same way;
4. ``ubuntu``: ``default`` + ``/file.txt`` (upstream's unused third image).

``sudo`` sits in the local repository but is not installed, as in upstream's images (the
Ubuntu base image has no sudo): task ``6/new.json`` #7 runs ``apt remove sudo`` without
``-y``, which aborts (and fails the init script) when sudo is installed.

Images are tagged ``<prefix>/<name>:<recipe hash>``: the hash covers everything that defines
the image's content (suite, package lists, scripts, and the parent image's hash), so a build
is skipped when the images exist and only what changed is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

RECIPE_VERSION = 1
SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
IMAGE_NAMES = ("default", "packages", "ubuntu")

UPSTREAM_PACKAGES = ("python3", "python3-pip", "git", "vim", "curl", "wget", "unzip", "zip", "tree")
TASK_PACKAGES = ("procps", "psmisc", "less", "file", "ca-certificates", "apt-utils")
EXTRA_PACKAGES = {"packages": ("npm",)}
# Offered by the local apt repository (with their dependencies), not installed.
LOCAL_REPO_PACKAGES = ("sudo", "net-tools", "iproute2", "lsof", "bc", "jq", "nano", "htop", "tmux", "zsh")
LOCAL_REPO = "/opt/agentrl-apt"

BASHRC_BLOCK = r"""
# agentrl-env-os: an agent types into this terminal. Interactive shells (also after su or
# sudo -i) keep it quiet, so a command's output is exactly what the command prints.
if [ -n "${PS1-}" ]; then
    stty -echo noflsh 2>/dev/null
    set +o emacs +o vi 2>/dev/null
    PS1=''; PS2=''
    PROMPT_COMMAND='printf "\036AGENTRL-P\036"; PS1=; PS2='
fi
export PAGER=cat GIT_PAGER=cat SYSTEMD_PAGER=cat
"""

_APT = "apt-get -y -q -o Dpkg::Options::=--force-unsafe-io -o Dpkg::Use-Pty=0"

# As in Ubuntu's container images: no manuals, docs or translations (also a faster build).
DPKG_EXCLUDES = """path-exclude=/usr/share/man/*
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/info/*
path-exclude=/usr/share/groff/*
path-exclude=/usr/share/lintian/*
path-exclude=/usr/share/locale/*
path-include=/usr/share/locale/locale.alias
"""

DEFAULT_SCRIPT = f"""
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
cat > /etc/dpkg/dpkg.cfg.d/excludes <<'AGENTRL_EOF'
{DPKG_EXCLUDES}AGENTRL_EOF
echo "deb $MIRROR {SUITE} main" > /etc/apt/sources.list
rm -f /etc/apt/sources.list.d/*
{_APT} update
{_APT} install --no-install-recommends {' '.join(UPSTREAM_PACKAGES + TASK_PACKAGES)}
# The local repository: what `apt install <pkg>` of a task needs beyond what is installed.
{_APT} clean
{_APT} install --download-only {' '.join(LOCAL_REPO_PACKAGES)}
mkdir -p {LOCAL_REPO}
mv /var/cache/apt/archives/*.deb {LOCAL_REPO}/
cd {LOCAL_REPO}
apt-ftparchive packages . > Packages
apt-ftparchive release . > Release
chmod -R a+rX {LOCAL_REPO}
cd /
echo "deb [trusted=yes] file:{LOCAL_REPO} ./" > /etc/apt/sources.list
{_APT} update
{_APT} clean
cat >> /etc/bash.bashrc <<'AGENTRL_EOF'
{BASHRC_BLOCK}
AGENTRL_EOF
cp /etc/skel/.bashrc /etc/skel/.profile /root/
rm -rf /tmp/* /var/tmp/* /var/log/apt/* /var/log/dpkg.log
"""

PACKAGES_SCRIPT = f"""
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
echo "deb $MIRROR {SUITE} main" > /etc/apt/sources.list.d/agentrl-build.list
{_APT} update
{_APT} install --no-install-recommends {' '.join(EXTRA_PACKAGES['packages'])}
rm /etc/apt/sources.list.d/agentrl-build.list
{_APT} update
{_APT} clean
rm -rf /tmp/* /var/tmp/* /root/.npm /var/log/apt/* /var/log/dpkg.log
"""

UBUNTU_SCRIPT = "set -e\ncd / && echo tmp > file.txt\n"

IMAGE_CHANGES = ["WORKDIR /root", 'CMD ["bash"]', "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]


class ImageBuildError(RuntimeError):
    """Building a task image failed; the message names the step and shows its last output."""


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


def recipe_hashes() -> dict[str, str]:
    """Per image, a short hash of everything that determines its content (its parent's included)."""
    base = _digest(RECIPE_VERSION, SUITE, "minbase", IMAGE_CHANGES)
    default = _digest(base, UPSTREAM_PACKAGES, TASK_PACKAGES, LOCAL_REPO_PACKAGES, DEFAULT_SCRIPT)
    return {
        "base": base,
        "default": default,
        "packages": _digest(default, EXTRA_PACKAGES, PACKAGES_SCRIPT),
        "ubuntu": _digest(default, UBUNTU_SCRIPT),
    }


def image_ref(name: str, prefix: str = "agentrl-os", tag: str | None = None) -> str:
    """``<prefix>/<name>:<tag>``; the tag defaults to the image's recipe hash."""
    return f"{prefix}/{name}:{tag or recipe_hashes()[name]}"


def _build_dir() -> str:
    """Where debootstrap writes the root file system: tmpfs when it has room (no fsync cost:
    about 3x faster here), else /var/tmp."""
    try:
        free = shutil.disk_usage("/dev/shm").free
    except OSError:
        free = 0
    return "/dev/shm" if free > 2 * 1024**3 else "/var/tmp"


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


class ImageBuilder:
    """Builds the images with a ``docker.APIClient``; ``say`` reports progress."""

    def __init__(
        self, api: Any, *, prefix: str = "agentrl-os", mirror: str = DEFAULT_MIRROR,
        workdir: str | None = None, say: Callable[[str], None] = print,
    ) -> None:
        self.api = api
        self.prefix = prefix
        self.mirror = mirror
        self.workdir = workdir or os.environ.get("AGENTRL_OS_BUILD_DIR") or _build_dir()
        self.say = say
        self.tags = recipe_hashes()
        self.timings: dict[str, float] = {}

    def ref(self, name: str) -> str:
        return image_ref(name, self.prefix, self.tags[name])

    def exists(self, ref: str) -> bool:
        import docker.errors

        try:
            self.api.inspect_image(ref)
            return True
        except docker.errors.ImageNotFound:
            return False

    def build(self, names: Sequence[str] = IMAGE_NAMES, *, force: bool = False) -> dict[str, str]:
        """Build the named images (and what they derive from); returns name -> reference."""
        unknown = sorted(set(names) - set(IMAGE_NAMES))
        if unknown:
            raise ImageBuildError(f"unknown image {unknown[0]!r}; known: {', '.join(IMAGE_NAMES)}")
        t0 = time.monotonic()
        wanted = {n: self.ref(n) for n in names}
        missing = [n for n, ref in wanted.items() if force or not self.exists(ref)]
        if not missing:
            self.say(f"images up to date: {', '.join(wanted.values())}")
            return wanted
        # packages and ubuntu derive from default, default from base.
        if force or not self.exists(self.ref("default")):
            if force or not self.exists(self.ref("base")):
                self._timed("base", self._build_base)
            self._timed("default", lambda: self._derive("base", "default", DEFAULT_SCRIPT, network=True))
        if "packages" in missing:
            self._timed("packages", lambda: self._derive("default", "packages", PACKAGES_SCRIPT, network=True))
        if "ubuntu" in missing:
            self._timed("ubuntu", lambda: self._derive("default", "ubuntu", UBUNTU_SCRIPT, network=False))
        for name in names:
            self.api.tag(self.ref(name), f"{self.prefix}/{name}", "latest")
        self.timings["total"] = time.monotonic() - t0
        self.say(f"built {', '.join(missing)} in {self.timings['total']:.0f} s: {', '.join(wanted.values())}")
        return wanted

    def _timed(self, step: str, fn: Callable[[], None]) -> None:
        t0 = time.monotonic()
        fn()
        self.timings[step] = time.monotonic() - t0
        self.say(f"  {step}: {self.timings[step]:.0f} s")

    # -- steps --------------------------------------------------------------------------

    def _build_base(self) -> None:
        if shutil.which("debootstrap") is None:
            raise ImageBuildError("debootstrap is not installed: apt-get install debootstrap (as root).")
        if os.geteuid() != 0:
            raise ImageBuildError("debootstrap needs root: run `agentrl-env-os build-images` as root.")
        self.say(f"  debootstrap {SUITE} (minbase) from {self.mirror} ...")
        tmp = Path(tempfile.mkdtemp(prefix="agentrl-env-os-build-", dir=self.workdir))
        rootfs = tmp / "rootfs"
        try:
            proc = subprocess.run(
                ["debootstrap", "--variant=minbase", SUITE, str(rootfs), self.mirror],
                capture_output=True, text=True,
            )
            if proc.returncode != 0:
                detail = proc.stdout + proc.stderr
                log_file = rootfs / "debootstrap" / "debootstrap.log"
                if log_file.exists():
                    detail += log_file.read_text(errors="replace")
                raise ImageBuildError(f"debootstrap failed (exit {proc.returncode}):\n{_tail(detail)}")
            for deb in (rootfs / "var/cache/apt/archives").glob("*.deb"):
                deb.unlink()
            tar = subprocess.Popen(
                ["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE
            )
            try:
                self.api.import_image(
                    src=tar.stdout, repository=f"{self.prefix}/base", tag=self.tags["base"],
                    changes=IMAGE_CHANGES, stream_src=True,
                )
            finally:
                tar.stdout.close()
                if tar.wait() != 0:
                    raise ImageBuildError(f"tar of {rootfs} failed (exit {tar.returncode})")
            if not self.exists(self.ref("base")):
                raise ImageBuildError("docker import finished but the base image is missing")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _derive(self, parent: str, name: str, script: str, *, network: bool) -> None:
        """Run ``script`` in a container of ``parent`` and commit it as ``name``."""
        host_config = self.api.create_host_config(network_mode="host" if network else "none")
        container = self.api.create_container(
            self.ref(parent), command=["bash", "-c", script], user="root", working_dir="/root",
            environment={"MIRROR": self.mirror}, host_config=host_config,
            name=f"agentrl-os-build-{name}-{os.getpid()}",  # no labels: the image would inherit them
        )["Id"]
        try:
            self.api.start(container)
            status = self.api.wait(container, timeout=3600)
            logs = self.api.logs(container).decode("utf-8", errors="replace")
            if status.get("StatusCode") != 0:
                raise ImageBuildError(f"building image {name!r} failed (exit {status.get('StatusCode')}):\n{_tail(logs)}")
            self.api.commit(container, repository=f"{self.prefix}/{name}", tag=self.tags[name], changes=IMAGE_CHANGES)
        finally:
            self.api.remove_container(container, force=True)

    def prune(self) -> list[str]:
        """Remove images of this prefix whose tag is not the current recipe hash (unless in use)."""
        import docker.errors

        removed = []
        current = {self.ref(name) for name in self.tags}
        for image in self.api.images():
            for ref in image.get("RepoTags") or []:
                repo, _, tag = ref.rpartition(":")
                if repo.startswith(self.prefix + "/") and tag != "latest" and ref not in current:
                    try:
                        self.api.remove_image(ref)
                        removed.append(ref)
                    except docker.errors.APIError as exc:  # e.g. a running episode still uses it
                        self.say(f"kept {ref}: {exc.explanation or exc}")
        return removed
