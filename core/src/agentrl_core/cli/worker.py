"""``agentrl worker``: serve an installed environment to a controller."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("worker", help="serve an environment's index set to a controller (task worker)")
    p.add_argument("--env", required=True, help="environment name, e.g. db")
    p.add_argument("--split", help="index set to serve (default: std, or the only one); task name <env>-<split>")
    p.add_argument("--controller", required=True, help="controller API URL, e.g. http://127.0.0.1:5020/api")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port to listen on (default 0: any free port)")
    p.add_argument("--address", help="URL the controller uses to reach this worker (default http://HOST:PORT/api)")
    p.add_argument("--concurrency", type=int, help="sessions at once (default: the environment's concurrency)")
    p.add_argument("--task-name", help="register under this task name instead of <env>-<split>, e.g. dbbench-std")
    p.add_argument("--heartbeat-interval", type=float, default=8.0, help="seconds between heartbeats (default 8)")
    p.add_argument("--start-timeout", type=float, default=300.0, help="seconds a session may take to start")
    p.add_argument("--step-timeout", type=float, default=600.0, help="seconds one step may take (then task error)")
    p.add_argument("--config", help="YAML config whose environments.<env> section configures the environment")
    p.add_argument("--token", help="the run's shared secret, sent to the controller and required of every request "
                                   "(default: $AGENTRL_TOKEN, the safer way to pass it; without a token the worker "
                                   "only listens on a loopback address)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from agentrl_core.config import load_config
    from agentrl_core.controlplane.worker import TaskWorker
    from agentrl_core.errors import ConfigError
    from agentrl_core.http.auth import require_token_to_bind, resolve_token
    from agentrl_core.http.server import raise_fd_limit, run_event_loop, tune_gc
    from agentrl_core.registry import Registry
    from agentrl_core.types import EnvironmentSpec

    token = resolve_token(args.token)
    require_token_to_bind(args.host, token, service="task worker")
    registry = Registry()
    config = load_config(args.config, registry=registry) if args.config else None
    env = registry.build(EnvironmentSpec, args.env, config.environment_config(args.env) if config else None)
    sets = env.index_sets()
    split = args.split or ("std" if "std" in sets else next(iter(sets)) if len(sets) == 1 else None)
    if split is None:
        raise ConfigError(f"environment {args.env!r} has several index sets ({', '.join(sorted(sets))}); choose one with --split")
    if args.concurrency is not None and args.concurrency < 1:
        raise ConfigError("--concurrency must be at least 1")
    worker = TaskWorker(env, split, task_name=args.task_name, controller_url=args.controller,
                        concurrency=args.concurrency, heartbeat_interval=args.heartbeat_interval,
                        start_timeout=args.start_timeout, step_timeout=args.step_timeout, token=token)
    raise_fd_limit()
    tune_gc()

    def ready(w: TaskWorker) -> None:
        print(f"agentrl worker {w.task_name} listening on {w.address} (concurrency {w.concurrency}, "
              f"{len(w.indices)} indices), controller {args.controller}", flush=True)

    run_event_loop(lambda: worker.serve(args.host, args.port, address=args.address, on_ready=ready))
    return 0
