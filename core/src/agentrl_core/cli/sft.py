"""``agentrl sft``: supervised cold start on demonstrations."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sft", help="supervised fine-tuning on demonstrations (cold start before RL)")
    p.add_argument("config", help="YAML config with model.path and an sft section")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key, e.g. --set sft.epochs=3 (repeatable)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from agentrl_core.config import load_config
    from agentrl_core.jobs.sft import run_sft
    from agentrl_core.modelpath import check_model_path

    config = load_config(args.config, args.overrides)
    check_model_path(config.model.path)
    run_sft(config)
    return 0
