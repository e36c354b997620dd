#!/usr/bin/env bash
# Install the MariaDB server binaries the `mariadb` tests need (CI runs this as root).
# Idempotent and non-interactive; the tests start their own private mariadbd, so the
# system service is neither needed nor started here.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }

if have mariadbd && have mariadb-install-db; then
    echo "ci_setup: mariadb-server already installed ($(mariadbd --version))"
    exit 0
fi
if [ "$(id -u)" != "0" ]; then
    echo "ci_setup: mariadb-server is missing and installing it needs root: run 'apt-get install mariadb-server' as root." >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# Other jobs may hold the dpkg lock: wait for it instead of failing.
APT=(apt-get -y -q -o DPkg::Lock::Timeout=600 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
# Never start (or restart) services from package scripts: the tests run their own server.
POLICY=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$POLICY"
    chmod +x "$POLICY"
    created_policy=1
fi
trap '[ "$created_policy" = 1 ] && rm -f "$POLICY"' EXIT
"${APT[@]}" update
"${APT[@]}" install --no-install-recommends mariadb-server mariadb-client
echo "ci_setup: installed $(mariadbd --version)"
