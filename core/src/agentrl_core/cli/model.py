"""``agentrl model init``: build a small Qwen2 model and tokenizer locally (no model hub)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    from agentrl_core.tinymodel.model import MODEL_SIZES  # stdlib only at import: no torch

    p = sub.add_parser("model", help="build local models")
    msub = p.add_subparsers(dest="model_command", metavar="SUBCOMMAND")
    init = msub.add_parser("init", help="train a tokenizer on the bundled texts and write a random Qwen2 model")
    init.add_argument("--out", required=True, help="output directory (a Hugging Face model directory)")
    init.add_argument("--size", choices=list(MODEL_SIZES), default="tiny",
                      help="tiny: 1.3M parameters; mini: 5.8M; small: 27M")
    init.add_argument("--seed", type=int, default=0, help="seed of the weight initialisation")
    init.add_argument("--data-dir", default=None, help="folder of texts for the tokenizer (default: $AGENTRL_DATA_DIR, else the data of the installed environment plugins)")
    init.set_defaults(run=run_init)
    p.set_defaults(run=lambda args: p.print_help() or 2)


def run_init(args: argparse.Namespace) -> int:
    from agentrl_core.tinymodel import init_model

    out = init_model(args.out, args.size, args.seed, data_dir=args.data_dir)
    print(f"wrote a {args.size} Qwen2 model with its tokenizer and chat template to {out}")
    return 0
