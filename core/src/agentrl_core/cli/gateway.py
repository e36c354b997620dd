"""``agentrl gateway``: the OpenAI-compatible training gateway in front of running engines."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gateway", help="serve OpenAI's API in front of engines, capturing exact tokens "
                                       "(see core/docs/gateway.md)")
    p.add_argument("config", nargs="?", help="YAML config (its model, rollout, sampler and gateway sections)")
    p.add_argument("--model", help="the model directory (default: model.path), for its tokenizer and chat template")
    p.add_argument("--engine", action="append", default=[], metavar="URL",
                   help="an engine of pool 'current' (agentrl engine serve, SGLang); repeatable")
    p.add_argument("--pool", action="append", default=[], metavar="NAME=URL[,URL]",
                   help="the engines of a named pool (the cross sampler uses current and stale); repeatable")
    p.add_argument("--host", help="interface to listen on (default: gateway.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to listen on (default: gateway.port; 0 picks a free one)")
    p.add_argument("--port-file", help="write {url} as JSON here once listening")
    p.add_argument("--export", metavar="FILE.jsonl", help="append every ended session's record, tokens included")
    p.add_argument("--token", help="the run's shared secret, required of the session and admin routes and sent to "
                                   "the engines (default: $AGENTRL_TOKEN, the safer way to pass it; without a token "
                                   "the gateway only listens on a loopback address)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set gateway.reasoning_parser=think (repeatable)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from agentrl_core.config import load_config
    from agentrl_core.errors import ConfigError
    from agentrl_core.gateway.process import parse_pools, serve_main
    from agentrl_core.http.auth import require_token_to_bind, resolve_token
    from agentrl_core.modelpath import check_model_path

    overrides = list(args.overrides)
    for flag, key in (("model", "model.path"), ("host", "gateway.host"), ("port", "gateway.port"),
                      ("export", "gateway.export")):
        value = getattr(args, flag)
        if value is not None:
            overrides.append(f"{key}={value}")
    config = load_config(args.config, overrides)
    token = resolve_token(args.token)
    require_token_to_bind(config.gateway.host, token, service="gateway")
    if not config.model.path:
        raise ConfigError("no model: give --model DIR (the engines' model, for its tokenizer) or model.path in the "
                          "config")
    check_model_path(config.model.path)
    return serve_main(config, parse_pools(args.engine, args.pool), port_file=args.port_file, token=token)
