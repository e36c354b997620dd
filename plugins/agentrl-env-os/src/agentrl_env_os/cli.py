"""``agentrl-env-os``: build the task images, list or sweep this environment's containers.

::

    agentrl-env-os build-images [--distro ubuntu|debian] [--force] [--only default,packages] [--mirror URL] [--prune]
    agentrl-env-os containers          # every container of this environment, with its owner
    agentrl-env-os sweep [--all]       # remove containers of dead workers (--all: every one)
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from agentrl_env_os.config import OSConfig
from agentrl_env_os.images import IMAGE_NAMES, ImageBuilder, ImageBuildError
from agentrl_env_os.recipes import DEFAULT_DISTRO, DISTROS


def _api(config: OSConfig, timeout: int = 600):
    from agentrl_env_os.docker_backend import DockerBackend

    backend = DockerBackend(config)
    api = backend.api
    api.timeout = timeout
    return backend, api


def build_images(args: argparse.Namespace) -> int:
    config = OSConfig(image_prefix=args.prefix)
    _, api = _api(config)
    names = [n.strip() for n in args.only.split(",")] if args.only else list(IMAGE_NAMES)
    builder = ImageBuilder(api, prefix=args.prefix, distro=args.distro, mirror=args.mirror,
                           say=lambda line: print(line, flush=True))
    t0 = time.monotonic()
    try:
        refs = builder.build(names, force=args.force)
    except ImageBuildError as exc:
        print(f"agentrl-env-os: {exc}", file=sys.stderr)
        return 1
    if args.prune:
        for ref in builder.prune():
            print(f"removed {ref}")
    if args.json:
        print(json.dumps({"images": refs, "seconds": round(time.monotonic() - t0, 1), "timings": builder.timings}))
    return 0


def containers(args: argparse.Namespace) -> int:
    from agentrl_env_os.docker_backend import LABEL_HOST, LABEL_PID, LABEL_SESSION, LABEL_WORKER, owner_is_dead

    backend, _ = _api(OSConfig())
    rows = backend.ours()
    for c in rows:
        labels = c.get("Labels") or {}
        dead = owner_is_dead(labels, backend.worker.host)
        print(
            f"{c['Id'][:12]}  {c.get('State', '?'):8} worker={labels.get(LABEL_WORKER)} "
            f"host={labels.get(LABEL_HOST)} pid={labels.get(LABEL_PID)}{' (dead)' if dead else ''} "
            f"session={labels.get(LABEL_SESSION)}"
        )
    print(f"{len(rows)} container(s)")
    return 0


def sweep(args: argparse.Namespace) -> int:
    backend, _ = _api(OSConfig())
    if args.all:
        rows = backend.ours()
        for c in rows:
            backend.remove(c["Id"])
        print(f"removed {len(rows)} container(s)")
    else:
        print(f"removed {backend.sweep()} container(s) of dead workers")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentrl-env-os", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build-images", help="build the task images (debootstrap + docker; needs root)")
    p.add_argument("--force", action="store_true", help="rebuild even if images with the same recipe exist")
    p.add_argument("--only", help=f"comma-separated subset of {', '.join(IMAGE_NAMES)}")
    p.add_argument("--distro", choices=DISTROS, default=DEFAULT_DISTRO,
                   help="ubuntu: Ubuntu 24.04 as upstream's images (default); debian: the earlier bookworm images")
    p.add_argument("--mirror", help="archive mirror for debootstrap and apt (default: the distribution's own)")
    p.add_argument("--prefix", default="agentrl-os", help="image repository prefix")
    p.add_argument("--prune", action="store_true", help="remove images built from older recipes")
    p.add_argument("--json", action="store_true", help="print a JSON summary with timings")
    p.set_defaults(run=build_images)
    p = sub.add_parser("containers", help="list this environment's containers and their owners")
    p.set_defaults(run=containers)
    p = sub.add_parser("sweep", help="remove containers left by dead workers")
    p.add_argument("--all", action="store_true", help="remove every container of this environment")
    p.set_defaults(run=sweep)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
