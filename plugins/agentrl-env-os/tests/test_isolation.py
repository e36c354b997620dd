"""The sandbox: no network, no host files, limits that contain a fork bomb and a memory hog."""

from __future__ import annotations

import os
import time
import uuid

import anyio
import docker.errors
import pytest

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
