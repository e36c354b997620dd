"""Run by ``nox -s index``: the built artefacts, published to a real package index, install by name.

Usage: python tests/index_check.py DIST SOURCE

``DIST`` holds the wheels and sdists built from ``git archive HEAD``; ``SOURCE`` is that
archive unpacked. In order:

1. every artefact passes ``twine check`` and every wheel ``check-wheel-contents`` and our
   own contents check (no tests or caches shipped, every file under ``src/`` present, the
   licence in ``.dist-info/licenses``);
2. pypiserver serves an empty folder on loopback and ``twine upload`` publishes every
   artefact to it, as a release publishes to PyPI;
3. in fresh venvs, by name, with that index first and the normal index (PyPI and whatever
   pip is configured with) for everything else:
   ``pip install agentrl-core agentrl-env-db`` (no torch may come with it),
   ``pip install 'agentrl-core[train]' agentrl-env-alfworld agentrl-sampler-cross`` (with
   the repository's constraints.txt, as the README says), and the plugin tutorial's
   third-party plugin from its own folder; pip's install report must show every agentrl
   package coming from the loopback index at this version, and ``agentrl plugins`` must
   load what was installed.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

NORMAL_INDEX = "https://pypi.org/simple"
FILE_BLOCK = re.compile(r"```[a-z]*\n# file: (?P<path>\S+)\n(?P<body>.*?)```", re.S)
NEVER_SHIPPED = re.compile(r"(^|/)(tests?|__pycache__|\.pytest_cache|\.ruff_cache|\.mypy_cache)/|\.py[co]$")


def run(*args: str | Path, **kwargs) -> subprocess.CompletedProcess:
    print("+", " ".join(str(a) for a in args), flush=True)
    return subprocess.run([str(a) for a in args], check=True, **kwargs)


def check_artefacts(dist: Path, source: Path) -> None:
    artefacts = sorted(dist.iterdir())
    run(sys.executable, "-m", "twine", "check", "--strict", *artefacts)
    wheels = [a for a in artefacts if a.suffix == ".whl"]
    licence = (source / "LICENSE").read_bytes()
    problems = []
    for wheel in wheels:
        name = wheel.name.split("-")[0]  # agentrl_env_db
        package = source / ("core" if name == "agentrl_core" else f"plugins/{name.replace('_', '-')}")
        # check-wheel-contents reads a package's exceptions from [tool.check-wheel-contents] in its pyproject
        run(sys.executable, "-m", "check_wheel_contents", "--config", package / "pyproject.toml", wheel)
        with zipfile.ZipFile(wheel) as zf:
            names = set(zf.namelist())
            shipped = [n for n in names if NEVER_SHIPPED.search(n)]
            if shipped:
                problems.append(f"{wheel.name} ships test or cache files: {sorted(shipped)[:5]}")
            expected = {p.relative_to(package / "src").as_posix() for p in (package / "src").rglob("*") if p.is_file()}
            missing = sorted(expected - names)
            if missing:
                problems.append(f"{wheel.name} lacks files of {package.name}/src: {missing[:5]}")
            licences = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/licenses/LICENSE", n)]
            if not licences or zf.read(licences[0]) != licence:
                problems.append(f"{wheel.name} does not carry the repository's LICENSE in .dist-info/licenses")
            data = {n for n in names if "/data/" in n}
            if data and not any(n.endswith("/data/PROVENANCE.md") for n in data):
                problems.append(f"{wheel.name} ships data without its PROVENANCE.md (source and licence)")
        print(f"contents ok: {wheel.name} ({len(names)} files)")
    if problems:
        raise SystemExit("wheel contents check failed:\n  " + "\n  ".join(problems))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_index(packages: Path, log: Path) -> tuple[subprocess.Popen, str]:
    """pypiserver on loopback, with no fallback to PyPI and no upload authentication."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "pypiserver", "run", "--host", "127.0.0.1", "--port", str(port),
         "--disable-fallback", "--authenticate", ".", "--passwords", ".", str(packages)],
        stdout=log.open("w"), stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/simple/", timeout=5):
                return server, url
        except (urllib.error.URLError, ConnectionError):
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise SystemExit(f"pypiserver did not answer on {url} within 60 s: {log.read_text()[-2000:]}") from None
            time.sleep(0.2)


def configured_extra_indexes() -> list[str]:
    """The extra indexes pip is configured with (a local mirror, say): kept, since --extra-index-url replaces them."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.extra-index-url"],
                         capture_output=True, text=True)
    return out.stdout.split() if out.returncode == 0 else []


def fresh_venv(root: Path, name: str) -> Path:
    run(sys.executable, "-m", "venv", root / name)
    return root / name / "bin"


def pip_install(bin_dir: Path, index: str, report: Path, *args: str | Path, cwd: Path | None = None) -> list[dict]:
    extra = [x for url in [*configured_extra_indexes(), NORMAL_INDEX] for x in ("--extra-index-url", url)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_INDEX") and k != "PIP_EXTRA_INDEX_URL"}
    run(bin_dir / "python", "-m", "pip", "install", "-q", "--index-url", f"{index}/simple/", *extra,
        "--report", report, *args, cwd=cwd, env=env)
    return json.loads(report.read_text())["install"]


def check_origin(installed: list[dict], index: str, version: str, local: set[str] = frozenset()) -> list[str]:
    """Every agentrl-* distribution pip chose came from the loopback index at ``version``."""
    names = []
    for item in installed:
        name, got = item["metadata"]["name"], item["metadata"]["version"]
        names.append(name.lower())
        if name.lower().startswith("agentrl-") and name.lower() not in local:
            url = item["download_info"]["url"]
            if not url.startswith(index) or got != version:
                raise SystemExit(f"{name} {got} came from {url}, not {version} from the loopback index {index}")
    return names


def plugins_loaded(bin_dir: Path, cwd: Path) -> dict[str, str]:
    out = run(bin_dir / "agentrl", "plugins", "--json", capture_output=True, text=True, cwd=cwd)
    return {r["name"]: r["status"] for r in json.loads(out.stdout)}


def main(dist: Path, source: Path) -> int:
    started = time.monotonic()
    version = (source / "VERSION").read_text().strip()
    check_artefacts(dist, source)
    work = Path(tempfile.mkdtemp(prefix="agentrl-index-"))
    packages = work / "packages"
    packages.mkdir()
    server, index = start_index(packages, work / "pypiserver.log")
    try:
        run(sys.executable, "-m", "twine", "upload", "--non-interactive", "--disable-progress-bar",
            "--repository-url", f"{index}/", "-u", "agentrl", "-p", "unused", *sorted(dist.iterdir()))
        listed = urllib.request.urlopen(f"{index}/simple/agentrl-env-db/", timeout=10).read().decode()
        if f"agentrl_env_db-{version}-py3-none-any.whl" not in listed:
            raise SystemExit(f"the index does not list the uploaded agentrl-env-db wheel: {listed}")

        light = fresh_venv(work, "light")
        names = check_origin(pip_install(light, index, work / "light.json", "agentrl-core", "agentrl-env-db"), index, version)
        heavy_deps = {"torch", "transformers", "ray", "nvidia-cublas-cu12"} & set(names)
        if heavy_deps:
            raise SystemExit(f"pip install agentrl-core agentrl-env-db pulled in {sorted(heavy_deps)}")
        loaded = plugins_loaded(light, work)
        if loaded != {"env_db": "ok"}:
            raise SystemExit(f"agentrl plugins in the light venv: {loaded}")
        run(light / "agentrl", "--version", cwd=work)
        print(f"light venv: {len(names)} distributions, no torch; env_db loads ({time.monotonic() - started:.0f} s)")

        tutorial = work / "agentrl-env-guess"
        readme = (source / "plugins" / "agentrl-plugin-example" / "README.md").read_text(encoding="utf-8")
        for match in FILE_BLOCK.finditer(readme):
            (tutorial / match["path"]).parent.mkdir(parents=True, exist_ok=True)
            (tutorial / match["path"]).write_text(match["body"], encoding="utf-8")
        guess = fresh_venv(work, "guess")
        check_origin(pip_install(guess, index, work / "guess.json", ".[test]", cwd=tutorial), index, version,
                     local={"agentrl-env-guess"})
        run(guess / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests", cwd=tutorial)
        if plugins_loaded(guess, tutorial) != {"env_guess": "ok"}:
            raise SystemExit("the tutorial's plugin does not load beside agentrl-core from the index")
        print(f"tutorial plugin: installed against the index, its tests pass ({time.monotonic() - started:.0f} s)")

        train = fresh_venv(work, "train")
        names = check_origin(pip_install(train, index, work / "train.json", "-c", source / "constraints.txt",
                                         "agentrl-core[train]", "agentrl-env-alfworld", "agentrl-sampler-cross"),
                             index, version)
        if not {"torch", "ray"} <= set(names):
            raise SystemExit(f"agentrl-core[train] did not bring torch and ray: {sorted(names)}")
        loaded = plugins_loaded(train, work)
        if loaded != {"env_alfworld": "ok", "sampler_cross": "ok"}:
            raise SystemExit(f"agentrl plugins in the train venv: {loaded}")
        print(f"train venv: {len(names)} distributions; env_alfworld and sampler_cross load "
              f"({time.monotonic() - started:.0f} s)")
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(f"index check passed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
