"""Entry point of the ``agentrl`` command."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import traceback

from agentrl_core._version import __version__
from agentrl_core.errors import AgentrlError

# Subcommand modules under agentrl_core.cli, in help order.
COMMANDS = [
    "plugins",
    "config_cmd",
    "demos",
    "model",
    "engine",
    "gateway",
    "worker",
    "controller",
    "train",
    "sft",
    "eval_cmd",
    "view",
]


# Modules of agentrl-core's optional extras (core/pyproject.toml) -> the extra that installs them:
# a command that needs one says so in a sentence instead of a traceback.
OPTIONAL_MODULES = {
    "torch": "torch", "transformers": "torch", "tokenizers": "torch", "safetensors": "torch",
    "ray": "train", "rich": "train", "tensorboard": "train",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentrl",
        description="Asynchronous reinforcement learning for multi-turn LLM agents.",
    )
    parser.add_argument("--version", action="version", version=f"agentrl-core {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"agentrl_core.cli.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except AgentrlError as exc:
        if args.verbose:
            traceback.print_exc()
        print(f"agentrl: error: {exc}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:
        extra = OPTIONAL_MODULES.get((exc.name or "").partition(".")[0])
        if extra is None:
            raise
        if args.verbose:
            traceback.print_exc()
        print(f"agentrl: error: `agentrl {args.command}` needs {exc.name}, which is not installed: from a checkout "
              f"of agentrl, pip install -c constraints.txt './core[{extra}]' (see the README, section Install)",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
