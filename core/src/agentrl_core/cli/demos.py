"""``agentrl demos``: write demonstrations by playing an environment's oracle."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demos", help="play an environment's oracle and write demonstrations (JSONL)")
    p.add_argument("--env", required=True, help="environment name, e.g. calc")
    p.add_argument("--split", required=True, help="index set, e.g. train")
    p.add_argument("--out", required=True, help="output JSONL file")
    p.add_argument("--limit", type=int, default=None, help="at most this many indices")
    p.add_argument("--error-rate", type=float, default=0.0, help="probability of a deliberate mistake per step")
    p.add_argument("--repeats", type=int, default=1, help="episodes per index (different seeds)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--config", help="YAML config whose environments.<env> section configures the environment")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import random

    import anyio

    from agentrl_core.config import load_config
    from agentrl_core.env.episodes import play_episode, write_demonstrations
    from agentrl_core.registry import Registry
    from agentrl_core.types import EnvironmentSpec

    registry = Registry()
    config = load_config(args.config, registry=registry) if args.config else None
    env_config = config.environment_config(args.env) if config else None
    env = registry.build(EnvironmentSpec, args.env, env_config)

    async def play_all():
        indices = list(env.index_sets().get(args.split, []))
        if not indices:
            env.check_index(args.split, 0)  # raises the clear "no index set" error
        indices = indices[: args.limit] if args.limit else indices
        episodes = []
        try:
            for index in indices:
                for r in range(args.repeats):
                    # one seed per (run seed, index, repeat): episodes must not share a mistake pattern
                    seed = random.Random(f"{args.seed}/{index}/{r}").randrange(2**31)
                    agent = env.oracle(args.split, index, error_rate=args.error_rate, seed=seed)
                    episodes.append(await play_episode(env, args.split, index, agent))
        finally:
            await env.aclose()
        return episodes

    episodes = anyio.run(play_all)
    n = write_demonstrations(args.out, episodes)
    solved = sum(1 for e in episodes if e.reward >= 1.0)
    print(f"wrote {n} episodes to {args.out}; {solved} with reward 1 ({solved / max(n, 1):.0%})")
    return 0
