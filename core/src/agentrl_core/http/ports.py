"""A free TCP port, for a service about to bind it (rendezvous stores, engines, weight groups)."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS reports free on ``host`` (IPv6 when it holds a ':'; ``""`` is every IPv4 interface).

    Another process may take it before the caller binds it; callers that cannot retry
    should bind port 0 themselves instead.
    """
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
