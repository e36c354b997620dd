"""``agentrl train``: reinforcement learning on the configured tasks (async or sync)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train with RL on the configured tasks (see examples/)")
    p.add_argument("config", help="YAML config file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key, e.g. --set train.mode=sync (repeatable)")
    p.add_argument("--resume", action="store_true", help="continue from the run directory's latest checkpoint")
    p.add_argument("--overwrite", action="store_true",
                   help="delete a previous run's outputs in the run directory first (its model, data and SFT model stay)")
    p.add_argument("--address", help="an existing Ray cluster (default: start a local Ray)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from agentrl_core.config import load_config
    from agentrl_core.jobs.run_folder import prepare_run_folder
    from agentrl_core.jobs.training import Trainer
    from agentrl_core.modelpath import check_model_path
    from agentrl_core.registry import Registry

    overrides = list(args.overrides)
    if args.address:
        overrides.append(f"launch.address={args.address}")
    registry = Registry()
    config = load_config(args.config, overrides, registry=registry)
    check_model_path(config.model.path)
    config = _agent_path_from_config_dir(config, args.config)
    trainer = Trainer(config, resume=args.resume, registry=registry)  # checks the config before --overwrite deletes
    prepare_run_folder(config.run.dir, resume=args.resume, overwrite=args.overwrite, model_path=config.model.path)
    summary = trainer.run()
    return 130 if summary.get("interrupted") else 0  # stopped early by SIGINT/SIGTERM, state saved


def _agent_path_from_config_dir(config, config_path: str):
    """``agent: my_agent.py:run`` is found from the working directory, else from the config file's folder."""
    from pathlib import Path

    import attrs

    name = config.agent.name
    if not config.agent.is_reference:
        return config
    target, _, attr = name.rpartition(":")
    if not (target.endswith(".py") or "/" in target) or Path(target).exists():
        return config
    beside = Path(config_path).resolve().parent / target
    if not beside.exists():
        return config
    return attrs.evolve(config, agent=attrs.evolve(config.agent, name=f"{beside}:{attr}"))
