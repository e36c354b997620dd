#!/usr/bin/env bash
# Install the Virtuoso server binary the `virtuoso` tests need (run as root before the tests).
# Idempotent: does nothing when virtuoso-t is already on PATH. Only the binary package of
# Debian's virtuoso-opensource is installed: the tests start their own private instance,
# so no system service, no debconf password and no conductor are needed.
set -euo pipefail
if command -v virtuoso-t >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "ci_setup.sh: virtuoso-t is missing and installing it needs root (apt-get install virtuoso-opensource-7-bin)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends virtuoso-opensource-7-bin >/dev/null
command -v virtuoso-t >/dev/null
