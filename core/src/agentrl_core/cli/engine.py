"""``agentrl engine serve``: run the HF engine server (SGLang's native API subset + OpenAI chat)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("engine", help="rollout engines")
    esub = p.add_subparsers(dest="engine_command", metavar="SUBCOMMAND")
    s = esub.add_parser("serve", help="serve a model with continuous batching (see core/docs/engine.md)")
    s.add_argument("--model", required=True, help="Hugging Face model directory (agentrl model init, Qwen2.5-*)")
    s.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    s.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="weights and KV cache dtype (auto: the checkpoint's)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=0, help="0 picks a free port (see --port-file)")
    s.add_argument("--port-file", default=None, help="write {url, pid} as JSON here once listening")
    s.add_argument("--max-running-requests", type=int, default=64, help="KV-cache slots = concurrent requests")
    s.add_argument("--max-context", type=int, default=None,
                   help="longest prompt + completion (default: the model's, at most 32768)")
    s.add_argument("--max-prefill-tokens", type=int, default=4096, help="prompt tokens per forward (longer prompts are prefilled in chunks)")
    s.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    s.add_argument("--cpus", default=None, help="pin to these CPU cores, e.g. 0,1 (threads default to their number)")
    s.add_argument("--tool-call-parser", default="qwen25", help="tool parser of /v1/chat/completions")
    s.add_argument("--weight-version", default="0", help="the version reported until the first weight update")
    s.add_argument("--seed", type=int, default=0, help="seed of requests sent without one")
    s.add_argument("--served-model-name", default=None)
    s.add_argument("--no-prefix-cache", action="store_true", help="never reuse a finished request's KV cache")
    s.add_argument("--token", help="the run's shared secret: every request must carry 'Authorization: Bearer TOKEN' "
                                   "(default: $AGENTRL_TOKEN, the safer way to pass it; without a token the engine "
                                   "only listens on a loopback address)")
    s.set_defaults(run=run_serve)
    p.set_defaults(run=lambda args: p.print_help() or 2)


def run_serve(args: argparse.Namespace) -> int:
    from agentrl_core.engine.process import serve_main
    from agentrl_core.http.auth import require_token_to_bind, resolve_token
    from agentrl_core.modelpath import check_model_path

    check_model_path(args.model, key="--model")
    args.token = resolve_token(args.token)
    require_token_to_bind(args.host, args.token, service="engine")  # before the model loads
    return serve_main(args)
