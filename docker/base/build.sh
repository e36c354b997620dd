#!/usr/bin/env bash
# Build the Debian base of docker/cpu/Dockerfile locally, without an image registry:
# debootstrap --variant=minbase bookworm (plus Python 3.11 and its venv module) on the host,
# documentation and apt lists dropped, then `docker import`. The same approach as
# agentrl-env-os's task images (agentrl_env_os.images): only this step needs root and debootstrap.
#
#   sudo docker/base/build.sh            # prints the image reference, e.g. agentrl/debian-base:3f2c...
#
# The tag is a hash of this script and the settings below, so a second run finds the image and
# returns at once; AGENTRL_BASE_FORCE=1 rebuilds. Environment: AGENTRL_DEBIAN_MIRROR (default
# http://deb.debian.org/debian), AGENTRL_BASE_REPO (default agentrl/debian-base).
set -euo pipefail

SUITE=bookworm
MIRROR=${AGENTRL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
REPO=${AGENTRL_BASE_REPO:-agentrl/debian-base}
# python3-venv: `python3 -m venv` with pip (ensurepip); ca-certificates: HTTPS from derived images;
# tini: PID 1 of the image, so `docker stop` reaches agentrl train and its worker processes.
INCLUDE=python3,python3-venv,ca-certificates,tini
CHANGES=(--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
         --change 'ENV LANG=C.UTF-8' --change 'CMD ["bash"]')

say() { echo "build-base: $*" >&2; }
# The tag: a hash of this script without its comments and messages (what decides the content).
# The mirror is not part of it: the same suite from any mirror gives the same packages.
TAG=$( { grep -v -E '^\s*(#|say )' "$0"; echo "$SUITE $INCLUDE ${CHANGES[*]}"; } | sha256sum | cut -c1-12)
REF="$REPO:$TAG"

if [ "${AGENTRL_BASE_FORCE:-0}" != 1 ] && docker image inspect "$REF" >/dev/null 2>&1; then
    say "up to date: $REF"
    echo "$REF"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "build-base: debootstrap needs root: run docker/base/build.sh as root (sudo)." >&2
    exit 1
fi
if ! command -v debootstrap >/dev/null; then
    echo "build-base: debootstrap is not installed: apt-get install debootstrap (as root)." >&2
    exit 1
fi

# tmpfs when it has room (no fsync cost, as agentrl-env-os does), else /var/tmp.
WORK=/var/tmp
if [ "$(df --output=avail -k /dev/shm 2>/dev/null | tail -1 || echo 0)" -gt $((2 * 1024 * 1024)) ]; then WORK=/dev/shm; fi
TMP=$(mktemp -d "$WORK/agentrl-base-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
ROOTFS=$TMP/rootfs

start=$SECONDS
say "debootstrap $SUITE (minbase + $INCLUDE) from $MIRROR into $ROOTFS ..."
if ! debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$ROOTFS" "$MIRROR" >"$TMP/debootstrap.out" 2>&1; then
    echo "build-base: debootstrap failed; its last output:" >&2
    tail -n 25 "$TMP/debootstrap.out" "$ROOTFS/debootstrap/debootstrap.log" 2>/dev/null >&2 || true
    exit 1
fi

# What Docker's debian:bookworm-slim drops, and the same dpkg excludes for what is installed later.
mkdir -p "$ROOTFS/etc/dpkg/dpkg.cfg.d"
cat > "$ROOTFS/etc/dpkg/dpkg.cfg.d/docker-slim" <<'SLIM'
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
path-include=/usr/share/locale/locale.alias
SLIM
find "$ROOTFS/usr/share/doc" -mindepth 2 ! -type d ! -name copyright -delete
find "$ROOTFS/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* "$ROOTFS"/var/cache/apt/archives/*.deb \
       "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/log/* "$ROOTFS"/tmp/* "$ROOTFS"/var/tmp/*
find "$ROOTFS/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
echo "deb $MIRROR $SUITE main" > "$ROOTFS/etc/apt/sources.list"

say "docker import -> $REF"
tar -C "$ROOTFS" --numeric-owner -c . | docker import "${CHANGES[@]}" - "$REF" >/dev/null
docker tag "$REF" "$REPO:latest"
say "built $REF in $((SECONDS - start)) s ($(docker image inspect --format '{{.Size}}' "$REF" | numfmt --to=iec))"
echo "$REF"
