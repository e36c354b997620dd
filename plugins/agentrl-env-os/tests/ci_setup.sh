#!/usr/bin/env bash
# Prepare the Docker engine and the task images the `docker` tests need (CI runs this as root).
#
# 1. install docker.io and debootstrap from Debian's packages (skipped when present);
# 2. start dockerd (overlay2 storage, no bridge network, no iptables) unless one answers;
# 3. build the task images with `agentrl-env-os build-images` (skipped when images with the
#    same content hash exist, or with AGENTRL_OS_SETUP_IMAGES=0).
# Idempotent and non-interactive: running it again on a prepared machine takes a second or two.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }
log() { echo "ci_setup(env-os): $*"; }

# Containers never get a network (network_mode none), so the daemon needs no bridge and
# touches no iptables rules of this machine. The same settings apply however dockerd starts
# (this script, an init script, a package's postinst), hence a daemon.json, not flags.
DAEMON_JSON=/etc/docker/daemon.json
WANT_JSON='{"storage-driver": "overlay2", "bridge": "none", "iptables": false, "ip6tables": false, "ip-forward": false, "ip-masq": false}'
DOCKERD_LOG=${AGENTRL_DOCKERD_LOG:-/var/log/agentrl-dockerd.log}

need_root() {
    if [ "$(id -u)" != "0" ]; then
        echo "ci_setup(env-os): $1 needs root: run plugins/agentrl-env-os/tests/ci_setup.sh as root." >&2
        exit 1
    fi
}

if ! have dockerd || ! have debootstrap; then
    need_root "installing docker.io and debootstrap"
    export DEBIAN_FRONTEND=noninteractive
    APT=(apt-get -y -q -o DPkg::Lock::Timeout=600 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
    mkdir -p /etc/docker
    [ -e "$DAEMON_JSON" ] || echo "$WANT_JSON" > "$DAEMON_JSON"
    # Package scripts must not start dockerd: we start it below with our settings.
    POLICY=/usr/sbin/policy-rc.d
    created_policy=0
    if [ ! -e "$POLICY" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$POLICY"
        chmod +x "$POLICY"
        created_policy=1
    fi
    trap '[ "$created_policy" = 1 ] && rm -f "$POLICY"' EXIT
    "${APT[@]}" update
    "${APT[@]}" install --no-install-recommends docker.io debootstrap
    log "installed $(dockerd --version)"
fi

docker_up() { timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

if docker_up; then
    log "dockerd is running ($(docker info --format '{{.Driver}}' 2>/dev/null) storage)"
else
    need_root "starting dockerd"
    mkdir -p /etc/docker
    [ -e "$DAEMON_JSON" ] || echo "$WANT_JSON" > "$DAEMON_JSON"
    log "starting dockerd (log: $DOCKERD_LOG)"
    # Containers inherit dockerd's open-file limit; upstream hosts allow 1048576 (std task
    # 4/Q09.json writes to file descriptor 123321). Raising it needs CAP_SYS_RESOURCE.
    ulimit -Hn 1048576 2>/dev/null && ulimit -Sn 1048576 2>/dev/null || log "cannot raise the open-file limit above $(ulimit -Hn) (no CAP_SYS_RESOURCE)"
    setsid nohup dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null &
    # Poll the socket with a deadline (the daemon takes one to a few seconds to come up).
    deadline=$((SECONDS + 90))
    until docker_up; do
        if [ $SECONDS -ge $deadline ]; then
            echo "ci_setup(env-os): dockerd did not answer within 90 s; last lines of $DOCKERD_LOG:" >&2
            tail -n 30 "$DOCKERD_LOG" >&2 || true
            exit 1
        fi
        sleep 0.5
    done
    log "dockerd is up ($(docker info --format '{{.Driver}}') storage)"
fi

driver=$(docker info --format '{{.Driver}}')
if [ "$driver" != "overlay2" ]; then
    echo "ci_setup(env-os): dockerd uses the '$driver' storage driver, expected overlay2; see $DOCKERD_LOG and $DAEMON_JSON." >&2
    exit 1
fi

if [ "${AGENTRL_OS_SETUP_IMAGES:-1}" = 0 ]; then
    log "not building the task images (AGENTRL_OS_SETUP_IMAGES=0: only the engine was wanted, e.g. by nox -s image)"
elif have agentrl-env-os; then
    agentrl-env-os build-images
else
    python -m agentrl_env_os.cli build-images
fi
