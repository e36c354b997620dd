"""The sandbox: no network, no host files, limits that contain a fork bomb and a memory hog, dropped
capabilities and no_new_privs, the disk limit, a read-only root with tmpfs, capped script output."""

from __future__ import annotations

import os
import time
import uuid

import anyio
import docker.errors
import pytest
from agentrl_env_os.config import DEFAULT_CAPABILITIES
from agentrl_env_os.docker_backend import ContainerGone

from agentrl_core.env import assistant_tool_call
from agentrl_core.types import Status

pytestmark = pytest.mark.docker

PLAIN = 12


async def bash(session, script: str) -> str:
    step = await session.step(assistant_tool_call("bash_action", {"script": script}))
    assert step.status is Status.RUNNING, step
    return step.messages[0]["content"]


def test_no_network_and_no_host_files(make_env, tmp_path):
    env = make_env(round_limit=20)
    marker = f"agentrl-env-os-host-{uuid.uuid4().hex[:10]}"
    host_files = [tmp_path / marker, f"/tmp/{marker}", f"/root/{marker}"]
    for path in host_files:
        with open(path, "w") as f:
            f.write("secret")

    async def main():
        session = await env.open("std", PLAIN)
        try:
            await session.start()
            info = env.backend.api.inspect_container(session.container_id)
            assert info["HostConfig"]["NetworkMode"] == "none" and info["Mounts"] == []
            connect = "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), timeout=3)'"
            assert "Network is unreachable" in await bash(session, connect)
            resolve = "python3 -c 'import socket; socket.getaddrinfo(\"deb.debian.org\", 80)'"
            assert "gaierror" in await bash(session, resolve)
            interfaces = await bash(session, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
            assert interfaces == "The output of the OS:\n\nlo\n"
            found = await bash(session, f"ls /tmp/{marker} /root/{marker} 2>&1 | wc -l; find / -xdev -name '{marker}' 2>/dev/null | wc -l")
            assert found == "The output of the OS:\n\n2\n0\n"  # two "No such file" lines, nothing found
            # Its own PID namespace: PID 1 is the container's sleep, the host's processes are invisible.
            assert await bash(session, "tr '\\0' ' ' < /proc/1/cmdline") == f"The output of the OS:\n\nsleep {env.config.container_lifetime_s} "
            seen = await bash(session, f"test -d /proc/{os.getpid()} && echo visible || echo hidden")
            assert seen.endswith("hidden\n")
        finally:
            await session.close()

    try:
        anyio.run(main)
    finally:
        for path in host_files:
            os.unlink(path)


def test_fork_bomb_and_memory_hog_are_contained(make_env):
    env = make_env(round_limit=20, command_timeout_s=5, interrupt_grace_s=3)

    async def main():
        victim = await env.open("std", PLAIN)
        bystander = None
        try:
            await victim.start()
            host = env.backend.api.inspect_container(victim.container_id)["HostConfig"]
            assert (host["Memory"], host["MemorySwap"], host["PidsLimit"], host["NanoCpus"]) == (
                1024**3, 1024**3, 512, 10**9
            )
            # 3 GiB in a container limited to 1 GiB: the kernel stops the hog, the shell survives.
            hog = await bash(victim, "python3 -c 'b = bytearray(3 * 1024**3); print(len(b))'")
            assert "MemoryError" in hog or "Killed" in hog, hog
            assert await bash(victim, "echo alive") == "The output of the OS:\n\nalive\n"
            # A fork bomb fills the pid limit of this container only.
            await victim.step(assistant_tool_call("bash_action", {"script": ":(){ :|:& };:"}))
            stats = env.backend.api.stats(victim.container_id, stream=False)
            assert 0 < stats["pids_stats"]["current"] <= 512
            # A new episode next to it is unaffected.
            t0 = time.monotonic()
            bystander = await env.open("std", PLAIN)
            await bystander.start()
            assert await bash(bystander, "echo fine") == "The output of the OS:\n\nfine\n"
            assert time.monotonic() - t0 < 20
            victim_id = victim.container_id
            await victim.close()
            with pytest.raises(docker.errors.NotFound):
                env.backend.api.inspect_container(victim_id)
            assert await bash(bystander, "echo still fine") == "The output of the OS:\n\nstill fine\n"
        finally:
            await victim.close()
            if bystander is not None:
                await bystander.close()
        assert env.resource_count() == 0

    anyio.run(main)


# Bits of the kept capabilities in /proc/<pid>/status (linux/capability.h): CHOWN 0, DAC_OVERRIDE 1,
# FOWNER 3, FSETID 4, KILL 5, SETGID 6, SETUID 7, AUDIT_WRITE 29.
KEPT_CAPS_MASK = f"{(1 << 0) | (1 << 1) | (1 << 3) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 29):016x}"
SETUID_ID = "cp /usr/bin/id /usr/local/bin/sid && chmod u+s /usr/local/bin/sid && useradd bob && su bob -c /usr/local/bin/sid"


def test_capabilities_are_dropped_and_setuid_does_not_elevate(make_env):
    env = make_env(round_limit=20, warm_pool=0)
    loose = make_env(round_limit=20, warm_pool=0, no_new_privileges=False)

    async def main():
        session = await env.open("std", PLAIN)
        other = await loose.open("std", PLAIN)
        try:
            await session.start()
            host = env.backend.api.inspect_container(session.container_id)["HostConfig"]
            assert host["CapDrop"] == ["ALL"] and sorted(host["CapAdd"]) == sorted(DEFAULT_CAPABILITIES)
            assert host["SecurityOpt"] == ["no-new-privileges:true"] and host["NetworkMode"] == "none"
            status = await bash(session, "grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status")
            assert status == f"The output of the OS:\n\nCapEff:\t{KEPT_CAPS_MASK}\nCapBnd:\t{KEPT_CAPS_MASK}\nNoNewPrivs:\t1\n"
            # Dropped: device nodes (MKNOD), chroot (SYS_CHROOT), raw sockets (NET_RAW), file capabilities (SETFCAP).
            denied = await bash(session, "mknod /root/null c 1 3; chroot / true; python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)' 2>&1 | tail -1")
            assert denied.count("Operation not permitted") == 3, denied
            # What the tasks do as root still works: users, su, chown/chmod of others' files, SUID bits, killing.
            kept = await bash(session, SETUID_ID + " && chown bob /usr/local/bin/sid && chmod 4755 /usr/local/bin/sid "
                              "&& stat -c '%U %a' /usr/local/bin/sid && su bob -c 'sleep 300 &' && sleep 0.5 && pkill -u bob sleep && echo killed")
            # no_new_privs: the SUID bit does not make bob root (no euid=0 in id's output).
            assert kept == "The output of the OS:\n\nuid=1001(bob) gid=1001(bob) groups=1001(bob)\nbob 4755\nkilled\n", kept
            # The same without no_new_privs (this is what the setting prevents):
            await other.start()
            assert "euid=0(root)" in await bash(other, SETUID_ID)
        finally:
            await session.close()
            await other.close()

    anyio.run(main)


def test_disk_limit_and_script_output_cap(make_env):
    env = make_env(round_limit=20, warm_pool=0, disk_limit="64m", disk_check_s=1, script_output_limit=4096)

    async def main():
        session = await env.open("std", PLAIN)
        try:
            await session.start()
            cid = session.container_id
            # Script output (init/check/example scripts) keeps its first script_output_limit bytes per stream.
            code, out, err = await env.backend.call(
                env.backend.exec_script, cid, ["bash", "-c", "head -c 3000000 /dev/zero | tr '\\0' a; echo done >&2"]
            )
            assert (code, len(out), set(out), err) == (0, 4096, {ord("a")}, b"done\n")
            # No single file beyond the limit: the writer gets SIGXFSZ at 64 MiB.
            big = await bash(session, "dd if=/dev/zero of=/root/big bs=1M count=100 2>/dev/null; echo $?; stat -c %s /root/big; rm /root/big")
            assert big.endswith("153\n67108864\n"), big  # 128 + SIGXFSZ (25)
            # Many files past the limit: the storage quota refuses them, or the watchdog removes the container.
            many = "for i in 1 2 3; do head -c 30M /dev/zero > /root/f$i || echo refused; done"
            if env.backend.disk_mode == "quota":
                out = await bash(session, many)
                assert "No space left on device" in out and "refused" in out
                return
            assert env.backend.disk_mode == "watch"
            # The watchdog removes the container within a check or two (each check lists sizes through
            # Docker, seconds on a loaded machine: the test waits up to a minute); the episode then
            # fails as infrastructure.
            try:
                await bash(session, many)
            except ContainerGone:
                pass  # removed while it was still writing
            deadline = time.monotonic() + 60
            while env.backend.running(cid) and time.monotonic() < deadline:
                await anyio.sleep(0.5)
            assert not env.backend.running(cid)
            with pytest.raises(ContainerGone, match="more than environments.os.disk_limit=64m"):
                await bash(session, "echo still here")
            assert [c for c, size in env.backend.disk_watch.removed if size > 64 * 2**20] == [cid]
        finally:
            await session.close()

    anyio.run(main)
    assert env.resource_count() == 0


def test_read_only_root_with_a_size_limited_tmpfs(make_env):
    env = make_env(round_limit=20, warm_pool=0, read_only_root=True, tmpfs={"/tmp": "size=16m,mode=1777,exec"})

    async def main():
        session = await env.open("std", PLAIN)
        try:
            await session.start()
            assert env.backend.api.inspect_container(session.container_id)["HostConfig"]["ReadonlyRootfs"] is True
            assert "Read-only file system" in await bash(session, "touch /usr/x /root/x 2>&1")
            full = await bash(session, "head -c 20M /dev/zero > /tmp/f; stat -c %s /tmp/f")
            assert "No space left on device" in full and full.endswith("16777216\n"), full
            ran = await bash(session, "rm /tmp/f; printf '#!/bin/sh\\necho ran\\n' > /tmp/s.sh && chmod +x /tmp/s.sh && /tmp/s.sh")
            assert ran == "The output of the OS:\n\nran\n", ran
        finally:
            await session.close()

    anyio.run(main)
