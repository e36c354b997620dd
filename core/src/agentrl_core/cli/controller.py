"""``agentrl controller``: run the environment controller."""

from __future__ import annotations

import argparse

# flag -> ControllerConfig field (every duration is configurable; tests use seconds)
TIMEOUT_FLAGS = {
    "unresponsive_after": "no heartbeat for this long: the worker gets no new sessions (default 11)",
    "remove_after": "no heartbeat for this long: the worker is removed, its sessions fail (default 300)",
    "idle_session_timeout": "a session without a call for this long is cancelled (default 300)",
    "request_timeout": "one interact on a worker (default 120)",
    "start_timeout": "a worker starting a session (default 300)",
    "cancel_timeout": "a worker acknowledging a cancel (default 30)",
    "connect_timeout": "opening a connection to a worker (default 5)",
    "reconcile_interval": "period of comparing each worker's sessions with ours (default 60)",
    "cancel_notice_timeout": "wait for a worker's cancel notice before reconciling (default 60)",
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("controller", help="run the environment controller that task workers register with")
    p.add_argument("--host", help="interface to listen on (default: controller.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to listen on (default: controller.port; 0 picks a free one)")
    p.add_argument("--config", help="YAML config; its controller section is used")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set controller.idle_session_timeout=60")
    for name, text in TIMEOUT_FLAGS.items():
        p.add_argument("--" + name.replace("_", "-"), type=float, metavar="SECONDS", help=text)
    p.add_argument("--max-body-bytes", type=int, help="larger requests get 413 (default 32 MiB)")
    p.add_argument("--token", help="the run's shared secret: every request must carry 'Authorization: Bearer TOKEN' "
                                   "(default: $AGENTRL_TOKEN, the safer way to pass it; without a token the "
                                   "controller only listens on a loopback address)")
    p.add_argument("--unauthenticated-workers", action="store_true", default=None,
                   help="let workers register without the token (upstream AgentBench-FC workers cannot send one); "
                        "anyone who reaches the port can then register a worker")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from agentrl_core.config import load_config
    from agentrl_core.controlplane.controller import Controller
    from agentrl_core.errors import ConfigError
    from agentrl_core.http.auth import require_token_to_bind, resolve_token
    from agentrl_core.http.server import bind_socket, raise_fd_limit, run_event_loop, tune_gc

    overrides = list(args.set)
    for name in [*TIMEOUT_FLAGS, "max_body_bytes", "host", "port", "unauthenticated_workers"]:
        value = getattr(args, name)
        if value is not None:
            overrides.append(f"controller.{name}={value}")
    config = load_config(args.config, overrides, validate_plugins=False).controller
    token = resolve_token(args.token)
    require_token_to_bind(config.host, token, service="controller")
    raise_fd_limit()
    tune_gc()
    try:
        sock = bind_socket(config.host, config.port)
    except OSError as exc:
        raise ConfigError(f"{exc}; choose another --port") from None
    controller = Controller(config, token=token)
    host, port = sock.getsockname()[:2]
    print(f"agentrl controller listening on http://{host}:{port}/api", flush=True)
    run_event_loop(lambda: controller.serve(sock=sock))
    return 0
