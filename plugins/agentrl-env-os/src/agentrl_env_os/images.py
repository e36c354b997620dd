"""Build the task images locally, without a registry: debootstrap -> docker import -> commits.

What goes into each image is in :mod:`agentrl_env_os.recipes` (Ubuntu 24.04 by default, the
previous Debian bookworm recipe on request). The steps:

1. ``base``: ``debootstrap --variant=minbase`` on the host (the only step that needs debootstrap
   and root), the recipe's setup run in the new tree with ``chroot``, then ``docker import``;
2. ``default``, ``packages``, ``ubuntu``: a build container of the parent image runs the
   recipe's script (on the host network where it downloads packages) and is committed.

Images are tagged ``<prefix>/<name>:<recipe hash>``, so a build is skipped when the images
exist and only what changed is rebuilt.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentrl_env_os.recipes import DEFAULT_DISTRO, DISTROS, IMAGE_CHANGES, IMAGE_NAMES, Recipe, recipe, recipe_hashes

log = logging.getLogger(__name__)

__all__ = ["IMAGE_NAMES", "ImageBuildError", "ImageBuilder", "image_ref", "recipe_hashes"]

DEBOOTSTRAP_SCRIPTS = Path("/usr/share/debootstrap/scripts")


class ImageBuildError(RuntimeError):
    """Building a task image failed; the message names the step and shows its last output."""


def image_ref(name: str, prefix: str = "agentrl-os", tag: str | None = None, distro: str = DEFAULT_DISTRO) -> str:
    """``<prefix>/<name>:<tag>``; the tag defaults to the image's recipe hash."""
    return f"{prefix}/{name}:{tag or recipe_hashes(distro)[name]}"


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
    """Builds the images of one distribution's recipe with a ``docker.APIClient``; ``say`` reports progress."""

    def __init__(
        self, api: Any, *, prefix: str = "agentrl-os", distro: str = DEFAULT_DISTRO, mirror: str | None = None,
        workdir: str | None = None, say: Callable[[str], None] = print,
    ) -> None:
        self.api = api
        self.prefix = prefix
        self.recipe: Recipe = recipe(distro)
        self.mirror = (mirror or self.recipe.mirror).rstrip("/")
        self.workdir = workdir or os.environ.get("AGENTRL_OS_BUILD_DIR") or _build_dir()
        self.say = say
        self.tags = recipe_hashes(distro)
        self.timings: dict[str, float] = {}

    def ref(self, name: str) -> str:
        return image_ref(name, self.prefix, self.tags[name], self.recipe.distro)

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
        built: set[str] = set()

        def ensure(name: str) -> None:
            if name in built or (not force and self.exists(self.ref(name))):
                return
            if name == "base":
                self._timed("base", self._build_base)
            else:
                parent = self.recipe.parents[name]
                ensure(parent)
                network = name != "ubuntu"  # the others download packages
                self._timed(name, lambda: self._derive(parent, name, self.recipe.scripts[name], network=network))
            built.add(name)

        for name in names:
            ensure(name)
        if not built:
            self.say(f"images up to date: {', '.join(wanted.values())}")
            return wanted
        for name in names:
            self.api.tag(self.ref(name), f"{self.prefix}/{name}", "latest")
        self.timings["total"] = time.monotonic() - t0
        self.say(f"built {', '.join(sorted(built))} in {self.timings['total']:.0f} s: {', '.join(wanted.values())}")
        return wanted

    def _timed(self, step: str, fn: Callable[[], None]) -> None:
        t0 = time.monotonic()
        fn()
        self.timings[step] = time.monotonic() - t0
        self.say(f"  {step}: {self.timings[step]:.0f} s")

    # -- steps --------------------------------------------------------------------------

    def _keyring(self, tmp: Path) -> list[str]:
        """debootstrap's --keyring option: the archive keyring of the recipe's pinned package."""
        keyring = self.recipe.keyring
        if keyring is None:
            return []
        url = f"{self.mirror}/{keyring.pool_path}"
        try:
            with urllib.request.urlopen(url, timeout=120) as response:
                data = response.read()
        except OSError as exc:
            raise ImageBuildError(f"cannot download the archive keyring package {url}: {exc}") from None
        digest = hashlib.sha256(data).hexdigest()
        if digest != keyring.sha256:
            raise ImageBuildError(f"{url} has sha256 {digest}, expected {keyring.sha256}: not the pinned keyring package")
        deb = tmp / "keyring.deb"
        deb.write_bytes(data)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp / "keyring")], check=True, capture_output=True)
        return [f"--keyring={tmp / 'keyring' / keyring.member}"]

    def _build_base(self) -> None:
        if shutil.which("debootstrap") is None:
            raise ImageBuildError("debootstrap is not installed: apt-get install debootstrap (as root).")
        if os.geteuid() != 0:
            raise ImageBuildError("debootstrap needs root: run `agentrl-env-os build-images` as root.")
        r = self.recipe
        self.say(f"  debootstrap {r.suite} (minbase) from {self.mirror} ...")
        tmp = Path(tempfile.mkdtemp(prefix="agentrl-env-os-build-", dir=self.workdir))
        rootfs = tmp / "rootfs"
        try:
            start = int(time.time()) - 1
            include = [f"--include={','.join(r.include)}"] if r.include else []
            argv = ["debootstrap", "--variant=minbase", *include, *self._keyring(tmp), r.suite, str(rootfs), self.mirror]
            if r.base_script and not (DEBOOTSTRAP_SCRIPTS / r.suite).exists():
                argv.append(str(DEBOOTSTRAP_SCRIPTS / r.base_script))
            proc = subprocess.run(argv, capture_output=True, text=True)
            if proc.returncode != 0:
                detail = proc.stdout + proc.stderr
                log_file = rootfs / "debootstrap" / "debootstrap.log"
                if log_file.exists():
                    detail += log_file.read_text(errors="replace")
                raise ImageBuildError(f"debootstrap failed (exit {proc.returncode}):\n{_tail(detail)}")
            for deb in (rootfs / "var/cache/apt/archives").glob("*.deb"):
                deb.unlink()
            if r.base_setup:
                env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "MIRROR": self.mirror, "BUILD_START": str(start)}
                proc = subprocess.run(["chroot", str(rootfs), "bash", "-c", r.base_setup],
                                      capture_output=True, text=True, env=env)
                if proc.returncode != 0:
                    raise ImageBuildError(f"setting up the base image failed (exit {proc.returncode}):\n"
                                          f"{_tail(proc.stdout + proc.stderr)}")
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
        """Remove images of this prefix whose tag is no current recipe hash (unless in use)."""
        import docker.errors

        removed = []
        # The images of every distribution's current recipe stay (the benchmark compares them).
        current = {image_ref(name, self.prefix, tag, d) for d in DISTROS for name, tag in recipe_hashes(d).items()}
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
