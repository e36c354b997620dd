"""``agentrl config``: validate a configuration file and print it with defaults filled in."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="validate a config file and print the resolved configuration")
    p.add_argument("config", nargs="?", help="YAML file (omit for the defaults)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key, e.g. --set rollout.temperature=1.0 (repeatable)")
    p.add_argument("--quiet", action="store_true", help="only validate")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import yaml

    from agentrl_core.config import config_to_dict, load_config

    config = load_config(args.config, args.overrides)
    if not args.quiet:
        print(yaml.safe_dump(config_to_dict(config), sort_keys=False), end="")
    return 0
