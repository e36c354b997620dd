"""The run's shared secret: one bearer token that every agentrl service checks and every client sends.

``agentrl train`` and ``agentrl eval`` generate a token per run (:func:`run_token`) and hand
it to every process they start through the environment variable ``AGENTRL_TOKEN`` (child
processes inherit it; Ray actors get it in their ``runtime_env``). A standalone ``agentrl
controller / worker / engine serve / gateway`` takes it from ``--token`` or ``AGENTRL_TOKEN``.

A server built with a token (:class:`agentrl_core.http.server.App`) answers every request
that does not carry ``Authorization: Bearer <token>`` with 401, compared in constant time;
a server without one refuses to listen on anything but a loopback address
(:func:`require_token_to_bind`). Clients that are not given a token explicitly send the
process's ``AGENTRL_TOKEN`` (:func:`env_token`), so one variable wires a whole run.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import os
import secrets
from collections.abc import Iterator

from agentrl_core.errors import ConfigError

__all__ = [
    "TOKEN_ENV",
    "UNAUTHORIZED",
    "authorization_header",
    "check_bearer",
    "env_token",
    "is_loopback",
    "new_token",
    "require_token_to_bind",
    "resolve_token",
    "run_token",
]

TOKEN_ENV = "AGENTRL_TOKEN"

UNAUTHORIZED = (f"this agentrl service needs the run's token: send 'Authorization: Bearer <token>' "
                f"(the value of {TOKEN_ENV} or --token)")


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def env_token() -> str | None:
    """The process's ``AGENTRL_TOKEN``, or None when it is unset or empty."""
    value = os.environ.get(TOKEN_ENV, "").strip()
    return value or None


def resolve_token(flag: str | None) -> str | None:
    """A command's token: its ``--token`` flag, else ``AGENTRL_TOKEN``, else None (no authentication)."""
    if flag is not None and flag.strip():
        return flag.strip()
    return env_token()


@contextlib.contextmanager
def run_token() -> Iterator[str]:
    """Make sure this process (and every process it starts) has an ``AGENTRL_TOKEN`` while the block runs.

    A token the user set is kept (so the run can reach services started with it); otherwise a
    new one is generated for this run and removed again afterwards.
    """
    existing = env_token()
    if existing is not None:
        yield existing
        return
    token = new_token()
    os.environ[TOKEN_ENV] = token
    try:
        yield token
    finally:
        if os.environ.get(TOKEN_ENV) == token:
            del os.environ[TOKEN_ENV]


def authorization_header(token: str | None) -> dict[str, str]:
    """``{"Authorization": "Bearer <token>"}``, or ``{}`` without a token."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def check_bearer(header: str | bytes | None, token: str) -> bool:
    """Whether an ``Authorization`` header value carries ``token``, compared in constant time."""
    if header is None:
        return False
    raw = header if isinstance(header, bytes) else header.encode("latin-1", "replace")
    scheme, _, value = raw.strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    return hmac.compare_digest(value.strip(), token.encode())


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ::1, localhost); ``""`` and 0.0.0.0 are not."""
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def require_token_to_bind(host: str, token: str | None, *, service: str) -> None:
    """Refuse to serve ``service`` on a non-loopback ``host`` without a token (one sentence with the fix)."""
    if token is None and not is_loopback(host):
        raise ConfigError(f"refusing to serve the {service} on {host or 'every interface'} without a token: "
                          f"set {TOKEN_ENV} or pass --token, or listen on 127.0.0.1")
