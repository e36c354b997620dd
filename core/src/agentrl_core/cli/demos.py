"""``agentrl demos``: write demonstrations by playing an environment's oracle."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demos", help="play an environment's oracle and write demonstrations (JSONL)")
    p.add_argument("--env", required=True, help="environment name, e.g. calc")
    p.add_argument("--split", required=True, help="index set, e.g. train")
    p.add_argument("--out", required=True, help="output JSONL file")
    p.add_argument("--indices", default=None, metavar="LIST",
                   help="only these indices of the split, in this order: comma-separated, ranges inclusive "
                        "(e.g. 0-99,150,200-209); default: all of them")
    p.add_argument("--limit", type=int, default=None, help="at most this many indices (after --indices)")
    p.add_argument("--error-rate", type=float, default=0.0, help="probability of a deliberate mistake per step")
    p.add_argument("--repeats", type=int, default=1, help="episodes per index (different seeds)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--concurrency", type=int, default=4,
                   help="episodes played at once (default 4); the file keeps index order either way")
    p.add_argument("--config", help="YAML config whose environments.<env> section configures the environment")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of that config (or of the defaults), e.g. "
                        "--set environments.alfworld.oracle=search (repeatable)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import json
    import random

    import anyio

    from agentrl_core.config import load_config
    from agentrl_core.env.episodes import play_episode
    from agentrl_core.errors import AgentrlError
    from agentrl_core.jobs.progress import PhaseProgress
    from agentrl_core.registry import Registry
    from agentrl_core.types import EnvironmentSpec

    if args.concurrency < 1:
        raise AgentrlError(f"--concurrency {args.concurrency}: must be at least 1")
    if args.indices is not None:
        parse_indices(args.indices)  # a malformed list fails before the environment is built
    registry = Registry()
    config = load_config(args.config, args.overrides, registry=registry) if args.config or args.overrides else None
    env_config = config.environment_config(args.env) if config else None
    env = registry.build(EnvironmentSpec, args.env, env_config)

    try:  # the indices are checked before --out is opened: a wrong one leaves an existing file as it was
        indices = list(env.index_sets().get(args.split, []))
        if not indices:
            env.check_index(args.split, 0)  # raises the clear "no index set" error
        if args.indices is not None:
            indices = [env.check_index(args.split, i) for i in parse_indices(args.indices)]
    except BaseException:
        anyio.run(env.aclose)
        raise
    indices = indices[: args.limit] if args.limit else indices

    async def play_all(out) -> tuple[int, int]:
        jobs = [(index, r) for index in indices for r in range(args.repeats)]
        progress = PhaseProgress(f"demos {args.env}/{args.split}", len(jobs), unit="episodes", first_line=False)
        finished: dict[int, dict] = {}  # played, waiting for the ones before them to be written
        written = played = solved = 0
        failure: list[BaseException] = []
        limiter = anyio.Semaphore(args.concurrency)

        async def play(k: int, index, r: int, scope: anyio.CancelScope) -> None:
            nonlocal written, played, solved
            async with limiter:
                # one seed per (run seed, index, repeat): episodes must not share a mistake pattern
                seed = random.Random(f"{args.seed}/{index}/{r}").randrange(2**31)
                agent = env.oracle(args.split, index, error_rate=args.error_rate, seed=seed)
                try:
                    episode = await play_episode(env, args.split, index, agent)
                except Exception as exc:  # the first failure stops the rest; what was written stays
                    failure.append(exc)
                    scope.cancel()
                    return
            finished[k] = episode.to_json()
            played += 1
            solved += episode.reward >= 1.0
            while written in finished:  # in index order, as soon as the episodes before are in
                out.write(json.dumps(finished.pop(written), ensure_ascii=False) + "\n")
                written += 1
            out.flush()
            progress.update(played, extra=f"{solved} with reward 1")

        try:
            async with anyio.create_task_group() as tg:
                for k, (index, r) in enumerate(jobs):
                    tg.start_soon(play, k, index, r, tg.cancel_scope)
        finally:
            await env.aclose()
        if failure:
            raise failure[0]
        return written, solved

    with open(args.out, "w", encoding="utf-8") as out:
        n, solved = anyio.run(play_all, out)
    print(f"wrote {n} episodes to {args.out}; {solved} with reward 1 ({solved / max(n, 1):.0%})")
    return 0


def parse_indices(text: str) -> list[int | str]:
    """``0-3,7,fixed_12`` -> ``[0, 1, 2, 3, 7, "fixed_12"]``: digits are ints, ``a-b`` of digits an
    inclusive range, anything else a string index (the environment then says whether it has it)."""
    from agentrl_core.errors import AgentrlError

    out: list[int | str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            raise AgentrlError(f"--indices {text!r}: an empty entry (two commas, or one at an end)")
        low, dash, high = part.partition("-")
        if dash and low.isdigit() and high.isdigit():
            if int(high) < int(low):
                raise AgentrlError(f"--indices {text!r}: range {part} runs backwards")
            out.extend(range(int(low), int(high) + 1))
        else:
            out.append(int(part) if part.isdigit() else part)
    if len(set(out)) != len(out):
        raise AgentrlError(f"--indices {text!r}: an index appears twice (use --repeats for several episodes)")
    return out
