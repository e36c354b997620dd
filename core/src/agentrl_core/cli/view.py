"""``agentrl view``: browse a run's trajectories, tokens and training curves in a local web UI."""

from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("view", help="browse runs in the browser: trajectories turn by turn, tokens, training "
                                    "curves (see core/docs/observability.md)")
    p.add_argument("run_dir", metavar="RUN_DIR",
                   help="a run folder (it holds trajectories.sqlite or metrics.jsonl) or a folder of runs")
    p.add_argument("--host", default="127.0.0.1",
                   help="interface to listen on (default 127.0.0.1; any other needs a token)")
    p.add_argument("--port", type=int, default=8765, help="port to listen on (default 8765; 0 picks a free one)")
    p.add_argument("--token", help="a shared secret every request must carry (default: $AGENTRL_TOKEN; without a "
                                   "token the viewer only listens on a loopback address)")
    p.add_argument("--tokenizer", metavar="DIR",
                   help="the model folder whose tokenizer shows token text (default: the run's final_model/, "
                        "else its config's model.path; without one the tokens show as ids)")
    p.add_argument("--port-file", help="write {url} as JSON here once listening")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from agentrl_core.errors import ConfigError
    from agentrl_core.http.auth import require_token_to_bind, resolve_token
    from agentrl_core.http.server import bind_socket, run_event_loop, serve_app
    from agentrl_core.view.server import build_app

    token = resolve_token(args.token)
    require_token_to_bind(args.host, token, service="trajectory viewer")
    app = build_app(args.run_dir, token=token, tokenizer=args.tokenizer)
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        raise ConfigError(f"{exc}; choose another --port") from None
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/"
    if args.port_file:
        with open(args.port_file, "w") as f:
            json.dump({"url": url}, f)
    print(f"agentrl view: serving {app.app.name} of {args.run_dir} on {url}"
          + ("?token=<your token> (open it once with the token)" if token else "")
          + "; Ctrl-C stops it", flush=True)
    run_event_loop(lambda: serve_app(app, sock))
    return 0
