#!/usr/bin/env bash
# Install the Chromium that the viewer's browser test drives (CI runs this as root).
# Debian's package, not Playwright's own browser download: that host may be unreachable,
# and a distribution package is what a CI image and a developer's machine both have.
# Idempotent and non-interactive.
set -euo pipefail

CHROMIUM="${AGENTRL_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$CHROMIUM" ]; then
    echo "ci_setup: chromium already installed ($("$CHROMIUM" --version 2>/dev/null || echo "$CHROMIUM"))"
    exit 0
fi
if [ "$(id -u)" != "0" ]; then
    echo "ci_setup: chromium is missing and installing it needs root: run 'apt-get install chromium' as root" \
         "(or set AGENTRL_CHROMIUM to a Chromium binary)." >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ci_setup: chromium is missing and this machine has no apt-get: install Chromium and set" \
         "AGENTRL_CHROMIUM to its binary." >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# Other jobs may hold the dpkg lock: wait for it instead of failing.
APT=(apt-get -y -q -o DPkg::Lock::Timeout=600 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
"${APT[@]}" update
if ! "${APT[@]}" install --no-install-recommends chromium fonts-dejavu-core; then
    echo "ci_setup: 'apt-get install chromium' failed (see above): the browser test needs Debian's chromium" \
         "package, or AGENTRL_CHROMIUM set to a Chromium binary." >&2
    exit 1
fi
if [ ! -x "$CHROMIUM" ]; then
    echo "ci_setup: Debian's chromium is installed but $CHROMIUM is not executable: set AGENTRL_CHROMIUM to" \
         "the Chromium binary (Debian's is /usr/bin/chromium)." >&2
    exit 1
fi
echo "ci_setup: installed $("$CHROMIUM" --version)"
