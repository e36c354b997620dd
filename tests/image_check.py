"""Build the CPU image (docker/cpu/Dockerfile) and run agentrl in it; run by ``nox -s image``.

Steps, each timed: the Debian base (``docker/base/build.sh``: debootstrap, skipped when the
image with the same content hash exists), the wheelhouse (``docker/wheelhouse.sh``: agentrl's
wheels from this checkout, the dependencies from pip's cache), ``docker build --network none``,
then in containers without a network: ``agentrl --version``, ``agentrl plugins``, the user,
``agentrl model init`` and a short ``agentrl train examples/quickstart.yaml`` (two steps over the
quickstart's five tasks) whose run folder is a mounted host folder, checked from the host.
Prints one JSON line of results (build seconds, image size); ``--json FILE`` writes it too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART_PLUGINS = {"agentrl-plugin-example", "agentrl-env-db", "agentrl-env-kg", "agentrl-env-webshop",
                      "agentrl-env-alfworld"}
IMAGE_UID = 1000  # the image's user, agentrl (docker/cpu/Dockerfile)
# The quickstart's training run, made short: 2 steps of 2 groups x 2 samples, no validation at the end.
SHORT_TRAIN = ["--set", "train.total_steps=2", "--set", "rollout.batch_size=2", "--set", "rollout.n_samples=2",
               "--set", "train.eval_tasks=[]", "--set", "train.checkpoint_every=0"]


class CheckFailed(Exception):
    pass


def run(argv: list[str], *, timeout: float, env: dict | None = None) -> str:
    """Run a command; its stdout, or CheckFailed with the end of its output."""
    print("+ " + " ".join(argv), flush=True)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
        raise CheckFailed(f"`{' '.join(argv[:4])} ...` exited {proc.returncode}:\n{tail}")
    return proc.stdout


def in_image(image: str, *args: str, timeout: float = 300, mounts: tuple[str, ...] = (), entrypoint: str | None = None) -> str:
    argv = ["docker", "run", "--rm", "--network", "none", "--shm-size", "1g"]
    for mount in mounts:
        argv += ["-v", mount]
    if entrypoint:
        argv += ["--entrypoint", entrypoint]
    return run([*argv, image, *args], timeout=timeout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="agentrl:cpu", help="tag of the built image")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    results: dict = {"image": args.image, "load_average_start": os.getloadavg()[0]}
    timings = results.setdefault("seconds", {})

    def timed(step: str, fn):
        t0 = time.monotonic()
        out = fn()
        timings[step] = round(time.monotonic() - t0, 1)
        print(f"{step}: {timings[step]:.1f} s", flush=True)
        return out

    try:
        base = timed("base", lambda: run([str(ROOT / "docker/base/build.sh")], timeout=900).strip().splitlines()[-1])
        env = {**os.environ, "PYTHON": sys.executable}
        timed("wheelhouse", lambda: run([str(ROOT / "docker/wheelhouse.sh")], timeout=900, env=env))
        build_env = {**os.environ, "DOCKER_BUILDKIT": "0"}  # the builder in dockerd; no buildx plugin needed
        timed("docker_build", lambda: run(["docker", "build", "--network", "none", "-f", str(ROOT / "docker/cpu/Dockerfile"),
                                           "--build-arg", f"BASE={base}", "-t", args.image, str(ROOT)],
                                          timeout=1800, env=build_env))
        size = int(run(["docker", "image", "inspect", "--format", "{{.Size}}", args.image], timeout=60))
        results.update(base=base, image_bytes=size, image_size=f"{size / 1e9:.2f} GB")

        version = (ROOT / "VERSION").read_text().strip()
        said = in_image(args.image, "--version").strip()
        if said != f"agentrl-core {version}":
            raise CheckFailed(f"agentrl --version in the image says {said!r}, expected 'agentrl-core {version}'")
        records = json.loads(in_image(args.image, "plugins", "--json"))
        bad = [r for r in records if r["status"] != "ok"]
        if bad:
            raise CheckFailed(f"plugins that do not load in the image: {bad}")
        missing = QUICKSTART_PLUGINS - {r["distribution"] for r in records}
        if missing:
            raise CheckFailed(f"the image lacks the quickstart's plugins {sorted(missing)}")
        results["plugins"] = sorted(r["name"] for r in records)
        uid = in_image(args.image, "-u", entrypoint="id").strip()
        if uid != str(IMAGE_UID):
            raise CheckFailed(f"the image runs as uid {uid}, expected the non-root user {IMAGE_UID}")

        runs = Path(tempfile.mkdtemp(prefix="agentrl-image-runs-"))
        try:
            os.chown(runs, IMAGE_UID, IMAGE_UID)  # the image's user writes the mounted run folder
            mount = (f"{runs}:/home/agentrl/runs",)
            timed("model_init", lambda: in_image(args.image, "model", "init", "--out", "runs/tiny", mounts=mount))
            out = timed("train", lambda: in_image(args.image, "train", "examples/quickstart.yaml", "--set",
                                                  "model.path=runs/tiny", *SHORT_TRAIN, timeout=900, mounts=mount))
            results["train_tail"] = out.strip().splitlines()[-3:]
            run_dir = runs / "quickstart"
            rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
            steps = sorted({r["step"] for r in rows if "step" in r})
            if steps[-1:] != [2]:
                raise CheckFailed(f"{run_dir}/metrics.jsonl has steps {steps}, expected the last to be 2")
            for name in ("final_model/config.json", "trajectories.sqlite"):
                if not (run_dir / name).is_file():
                    raise CheckFailed(f"the run folder lacks {name}: {sorted(p.name for p in run_dir.iterdir())}")
            owners = {p.stat().st_uid for p in run_dir.rglob("*")}
            if owners != {IMAGE_UID}:
                raise CheckFailed(f"files in the run folder belong to uids {owners}, expected only {IMAGE_UID}")
            results["run_folder"] = sorted(p.name for p in run_dir.iterdir())
        finally:
            shutil.rmtree(runs, ignore_errors=True)
    except (CheckFailed, subprocess.TimeoutExpired) as exc:
        print(f"image check failed: {exc}", file=sys.stderr)
        return 1
    results["load_average_end"] = os.getloadavg()[0]
    line = json.dumps(results)
    print(line)
    if args.json:
        Path(args.json).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
