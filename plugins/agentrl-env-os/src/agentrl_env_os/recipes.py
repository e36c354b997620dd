"""What goes into the task images, per distribution: root file system, scripts, content hashes.

Upstream (AgentBench FC, ``data/os_interaction/res/dockerfiles``) builds three images from
Docker's ``ubuntu`` image (24.04 "noble" when its published runs were made: their ``apt
update`` lists noble): ``default`` runs ``apt install python3 -y && apt install python3-pip -y
&& ...`` for python3, python3-pip, git, vim, curl, wget, unzip, zip and tree (with their
recommended packages: build-essential, python3-dev, gnupg, less, openssh-client, ...),
``packages`` adds npm, ``ubuntu`` only writes ``/file.txt``. There is no registry here, so the
root file system comes from ``debootstrap``:

* ``ubuntu`` (the default): ``debootstrap --variant=minbase noble`` from the Ubuntu archive,
  its signatures checked with the archive keyring of a pinned ``ubuntu-keyring`` package (sha256
  below); then what makes Docker's image differ from a plain minbase system: its dpkg path
  excludes and the documentation they drop, the ``ubuntu`` user (uid 1000) and the full
  ``noble``/``-updates``/``-security`` sources. ``default`` and ``packages`` run upstream's
  ``apt install`` commands, recommended packages included.
* ``debian``: the previous recipe (``debootstrap bookworm``, the same packages without their
  recommendations plus procps, psmisc, less and file), kept to compare images.

Both: a local ``file:`` apt repository (``/opt/agentrl-apt``) with the packages tasks and agents
install (sudo, net-tools, ...) is the only apt source afterwards, since containers have no
network; ``/etc/bash.bashrc`` keeps nested shells quiet (see :mod:`agentrl_env_os.shell`).
In the ``ubuntu`` recipe every file a build step creates gets the time ``FILE_TIME`` (files
from packages keep the package's times): in a container started from an image that Docker
built long ago, only what the task and the agent change is recent (``find /usr -mtime -1``).

Images are tagged ``<prefix>/<name>:<recipe hash>``; the hash covers everything that defines
an image's content (distribution, package lists, scripts, the parent's hash), so a build is
skipped when the images exist and only what changed is rebuilt.
"""

from __future__ import annotations

import hashlib
import json

from attrs import frozen

IMAGE_NAMES = ("default", "packages", "ubuntu")
DISTROS = ("ubuntu", "debian")
DEFAULT_DISTRO = "ubuntu"

UPSTREAM_PACKAGES = ("python3", "python3-pip", "git", "vim", "curl", "wget", "unzip", "zip", "tree")
EXTRA_PACKAGES = {"packages": ("npm",)}
LOCAL_REPO = "/opt/agentrl-apt"
# The Docker image's PATH (upstream runs `docker exec` with the image's environment).
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
IMAGE_CHANGES = ["WORKDIR /root", 'CMD ["bash"]', f"ENV PATH={IMAGE_PATH}"]
# Files a build step of the ubuntu recipe creates get this time (2024-04-25 00:00 UTC, noble's release).
FILE_TIME = 1714003200

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


@frozen
class Keyring:
    """An archive keyring taken from a pinned package of the archive itself."""

    pool_path: str  # relative to the mirror
    sha256: str
    member: str  # the keyring file inside the package


@frozen
class Recipe:
    distro: str
    suite: str
    mirror: str
    version: int
    base_script: str | None  # debootstrap's script when the host's debootstrap does not know the suite
    include: tuple[str, ...]  # packages beyond debootstrap's minbase set
    keyring: Keyring | None
    base_setup: str  # run with chroot in the new root file system before it is imported
    scripts: dict[str, str]  # default / packages / ubuntu, each run in a container of its parent
    parents: dict[str, str]


def _local_repo(packages: tuple[str, ...], sources_line: str) -> str:
    """Download ``packages`` (and what they need) into the local repository, make it the only source.

    apt-ftparchive (apt-utils) indexes it and is removed again: upstream's image does not have it.
    """
    return f"""
{_APT} clean
{_APT} install --download-only {' '.join(packages)}
mkdir -p {LOCAL_REPO}
mv /var/cache/apt/archives/*.deb {LOCAL_REPO}/
{_APT} install --no-install-recommends apt-utils
cd {LOCAL_REPO}
apt-ftparchive packages . > Packages
apt-ftparchive release . > Release
chmod -R a+rX {LOCAL_REPO}
cd /
{_APT} purge apt-utils
{sources_line}
{_APT} update
{_APT} clean
"""


_QUIET_SHELLS = f"""
cat >> /etc/bash.bashrc <<'AGENTRL_EOF'
{BASHRC_BLOCK}
AGENTRL_EOF
"""

# Every file this build step created or changed (since BUILD_START, epoch seconds) gets FILE_TIME.
# Files unpacked from packages keep their own times: the byte-compiled Python files record the
# times of their sources, and a changed source time would make Python write new ones at run time.
_OLD_TIMES = f"""
find / -xdev \\( -path /proc -o -path /sys -o -path /dev -o -path /etc/hostname -o -path /etc/hosts \\
    -o -path /etc/resolv.conf \\) -prune \\
    -o -newermt "@$BUILD_START" -print0 | xargs -0 -r touch -h -d @{FILE_TIME}
"""
_START = 'BUILD_START=${BUILD_START:-$(date +%s)}'


# --- debian: the previous recipe, unchanged (its hashes, hence its images, stay the same) -----

_DEBIAN_SUITE = "bookworm"
_DEBIAN_TASK_PACKAGES = ("procps", "psmisc", "less", "file", "ca-certificates", "apt-utils")
_DEBIAN_LOCAL_REPO = ("sudo", "net-tools", "iproute2", "lsof", "bc", "jq", "nano", "htop", "tmux", "zsh")
_DEBIAN_EXCLUDES = """path-exclude=/usr/share/man/*
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/info/*
path-exclude=/usr/share/groff/*
path-exclude=/usr/share/lintian/*
path-exclude=/usr/share/locale/*
path-include=/usr/share/locale/locale.alias
"""

_DEBIAN_DEFAULT = f"""
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
cat > /etc/dpkg/dpkg.cfg.d/excludes <<'AGENTRL_EOF'
{_DEBIAN_EXCLUDES}AGENTRL_EOF
echo "deb $MIRROR {_DEBIAN_SUITE} main" > /etc/apt/sources.list
rm -f /etc/apt/sources.list.d/*
{_APT} update
{_APT} install --no-install-recommends {' '.join(UPSTREAM_PACKAGES + _DEBIAN_TASK_PACKAGES)}
# The local repository: what `apt install <pkg>` of a task needs beyond what is installed.
{_APT} clean
{_APT} install --download-only {' '.join(_DEBIAN_LOCAL_REPO)}
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

_DEBIAN_PACKAGES = f"""
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
echo "deb $MIRROR {_DEBIAN_SUITE} main" > /etc/apt/sources.list.d/agentrl-build.list
{_APT} update
{_APT} install --no-install-recommends {' '.join(EXTRA_PACKAGES['packages'])}
rm /etc/apt/sources.list.d/agentrl-build.list
{_APT} update
{_APT} clean
rm -rf /tmp/* /var/tmp/* /root/.npm /var/log/apt/* /var/log/dpkg.log
"""

DEBIAN = Recipe(
    distro="debian", suite=_DEBIAN_SUITE, mirror="http://deb.debian.org/debian", version=1,
    base_script=None, include=(), keyring=None, base_setup="",
    scripts={"default": _DEBIAN_DEFAULT, "packages": _DEBIAN_PACKAGES,
             "ubuntu": "set -e\ncd / && echo tmp > file.txt\n"},
    parents={"default": "base", "packages": "default", "ubuntu": "default"},
)

# --- ubuntu: Docker's ubuntu:24.04 as closely as debootstrap gets it ---------------------------

_UBUNTU_SUITE = "noble"
# Offered by the local apt repository (with what they need), not installed: what tasks and agents
# install (sudo: std task 55 removes it; file, acl, bc: commands agents missed in upstream's runs).
_UBUNTU_LOCAL_REPO = ("sudo", "net-tools", "iproute2", "lsof", "bc", "jq", "nano", "htop", "tmux", "zsh",
                      "file", "psmisc", "acl", "iputils-ping")
# /etc/dpkg/dpkg.cfg.d/excludes of Docker's (minimized) Ubuntu images.
_UBUNTU_EXCLUDES = """# Drop all man pages
path-exclude=/usr/share/man/*

# Drop all translations
path-exclude=/usr/share/locale/*/LC_MESSAGES/*.mo

# Drop all documentation ...
path-exclude=/usr/share/doc/*

# ... except copyright files ...
path-include=/usr/share/doc/*/copyright

# ... and Debian changelogs
path-include=/usr/share/doc/*/changelog.Debian.*
"""
_UBUNTU_SOURCES = f"deb $MIRROR {_UBUNTU_SUITE} {_UBUNTU_SUITE}-updates {_UBUNTU_SUITE}-security main restricted universe multiverse"

# Run with chroot in the debootstrapped tree (bash, as root, MIRROR set).
_UBUNTU_BASE_SETUP = f"""
set -euo pipefail
{_START}
mkdir -p /etc/dpkg/dpkg.cfg.d
cat > /etc/dpkg/dpkg.cfg.d/excludes <<'AGENTRL_EOF'
{_UBUNTU_EXCLUDES}AGENTRL_EOF
# What the excludes drop, removed from the packages debootstrap installed (as Docker's image).
find /usr/share/man -mindepth 1 -delete 2>/dev/null || true
find /usr/share/locale -path '*/LC_MESSAGES/*.mo' -delete
find /usr/share/doc -mindepth 2 ! -type d ! -name copyright ! -name 'changelog.Debian.*' -delete
find /usr/share/doc -mindepth 1 -type d -empty -delete
useradd --uid 1000 --user-group --create-home --shell /bin/bash --comment Ubuntu ubuntu
echo "{_UBUNTU_SOURCES}" > /etc/apt/sources.list
rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /tmp/* /var/tmp/*
{_OLD_TIMES}"""

_UBUNTU_INSTALL = "\n".join(f"{_APT} install {p}" for p in UPSTREAM_PACKAGES)

_UBUNTU_DEFAULT = f"""
set -euo pipefail
{_START}
export DEBIAN_FRONTEND=noninteractive
echo "{_UBUNTU_SOURCES}" > /etc/apt/sources.list
{_APT} update
# Upstream's Dockerfile: one `apt install <package> -y` after the other, recommended packages included.
{_UBUNTU_INSTALL}
{_local_repo(_UBUNTU_LOCAL_REPO, f'echo "deb [trusted=yes] file:{LOCAL_REPO} ./" > /etc/apt/sources.list')}
{_QUIET_SHELLS}
rm -rf /tmp/* /var/tmp/* /var/log/apt/* /var/log/dpkg.log /root/.cache
{_OLD_TIMES}"""

_UBUNTU_PACKAGES = f"""
set -euo pipefail
{_START}
export DEBIAN_FRONTEND=noninteractive
echo "{_UBUNTU_SOURCES}" > /etc/apt/sources.list.d/agentrl-build.list
{_APT} update
{_APT} install {' '.join(EXTRA_PACKAGES['packages'])}
rm /etc/apt/sources.list.d/agentrl-build.list
{_APT} update
{_APT} clean
rm -rf /tmp/* /var/tmp/* /root/.npm /root/.cache /var/log/apt/* /var/log/dpkg.log
{_OLD_TIMES}"""

# Upstream's third image is plain ubuntu with /file.txt (unused by the task data).
_UBUNTU_UBUNTU = f"""
set -euo pipefail
{_START}
cd / && echo tmp > file.txt
{_QUIET_SHELLS}
{_OLD_TIMES}"""

UBUNTU = Recipe(
    distro="ubuntu", suite=_UBUNTU_SUITE, mirror="http://archive.ubuntu.com/ubuntu", version=1,
    base_script="gutsy",  # debootstrap's script for every Ubuntu release; bookworm's has no "noble" link
    include=("unminimize",),  # in Docker's (minimized) 24.04 image beside the minbase set
    keyring=Keyring(
        pool_path="pool/main/u/ubuntu-keyring/ubuntu-keyring_2023.11.28.1_all.deb",
        sha256="36de43b15853ccae0028e9a767613770c704833f82586f28eb262f0311adb8a8",
        member="usr/share/keyrings/ubuntu-archive-keyring.gpg",
    ),
    base_setup=_UBUNTU_BASE_SETUP,
    scripts={"default": _UBUNTU_DEFAULT, "packages": _UBUNTU_PACKAGES, "ubuntu": _UBUNTU_UBUNTU},
    parents={"default": "base", "packages": "default", "ubuntu": "base"},
)

RECIPES = {"ubuntu": UBUNTU, "debian": DEBIAN}


def recipe(distro: str = DEFAULT_DISTRO) -> Recipe:
    if distro not in RECIPES:
        raise ValueError(f"unknown image distribution {distro!r}; known: {', '.join(DISTROS)}")
    return RECIPES[distro]


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


def recipe_hashes(distro: str = DEFAULT_DISTRO) -> dict[str, str]:
    """Per image, a short hash of everything that determines its content (its parent's included)."""
    r = recipe(distro)
    if r.distro == "debian":  # exactly the inputs of the previous recipe, so its images are found again
        base = _digest(r.version, r.suite, "minbase", IMAGE_CHANGES)
        default = _digest(base, UPSTREAM_PACKAGES, _DEBIAN_TASK_PACKAGES, _DEBIAN_LOCAL_REPO, r.scripts["default"])
        return {
            "base": base,
            "default": default,
            "packages": _digest(default, EXTRA_PACKAGES, r.scripts["packages"]),
            "ubuntu": _digest(default, r.scripts["ubuntu"]),
        }
    hashes = {"base": _digest(r.distro, r.version, r.suite, "minbase", r.include, r.keyring.sha256 if r.keyring else None,
                              r.base_setup, IMAGE_CHANGES)}
    for name in IMAGE_NAMES:  # parents come first in this order
        hashes[name] = _digest(hashes[r.parents[name]], name, r.scripts[name])
    return hashes
