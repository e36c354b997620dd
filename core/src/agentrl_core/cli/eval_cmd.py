"""``agentrl eval``: success rate, pass@k and termination statuses over repeats."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate models on tasks through the control plane (pass@k, statuses)")
    p.add_argument("config", nargs="?", help="YAML config with an eval section (tasks, repeats, models, mode), "
                                             "or the folder of a finished `agentrl train` run: its final policy "
                                             "on its eval tasks")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key, e.g. --set eval.repeats=4 (repeatable)")
    p.add_argument("--engine", choices=["agentrl", "openai"], default="agentrl",
                   help="agentrl: token-level engines (hf/sglang); openai: any OpenAI-compatible endpoint")
    p.add_argument("--base-url", help="with --engine openai: the endpoint, e.g. http://host:8000/v1")
    p.add_argument("--model", dest="model_name", help="with --engine openai: the model name to request")
    p.add_argument("--api-key", help="with --engine openai: bearer token (default: $OPENAI_API_KEY)")
    p.add_argument("--out", help="output folder (default: eval.output_dir or <run dir>/eval)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    from agentrl_core.config import load_config
    from agentrl_core.errors import ConfigError
    from agentrl_core.jobs.evaluation import Evaluation, tokenizer_source
    from agentrl_core.modelpath import check_model_path
    from agentrl_core.registry import Registry

    registry = Registry()
    if args.config and Path(args.config).is_dir():  # a run folder: its trained policy, on its config's tasks
        import attrs

        from agentrl_core.jobs.run_folder import trained_policy

        run_dir = Path(args.config)
        config_path, final_model = trained_policy(run_dir)
        config = load_config(config_path, args.overrides, registry=registry)
        config = attrs.evolve(config, model=attrs.evolve(config.model, path=str(final_model)),
                              eval=attrs.evolve(config.eval, models={}))
        out = Path(args.out or run_dir / "eval")
        print(f"evaluating the trained policy of run folder {run_dir}: {final_model}")
    else:
        config = load_config(args.config, args.overrides, registry=registry)
        out = Path(args.out or config.eval.output_dir or config.run.dir / "eval")
        _point_at_the_trained_policy(config)
    if args.engine == "openai":
        if not args.base_url or not args.model_name:
            raise ConfigError("--engine openai needs --base-url and --model")
        openai = {"base_url": args.base_url, "model": args.model_name,
                  "api_key": args.api_key or os.environ.get("OPENAI_API_KEY")}
    else:
        openai = None
        if not config.eval.models:
            check_model_path(config.model.path)
        for name, model in config.eval.models.items():
            if model.path and not model.urls:
                check_model_path(model.path, key=f"eval.models.{name}.path")
        path, key = tokenizer_source(config)  # models given by urls: the tokenizer is model.path's
        check_model_path(path, key=key)
    Evaluation(config, registry=registry, out_dir=out, openai=openai).run()
    return 0


def _point_at_the_trained_policy(config) -> None:
    """A config whose run folder holds a trained policy, evaluated at model.path instead: say which is which."""
    from pathlib import Path

    final = config.run.dir / "final_model"
    if config.eval.models or not (final / "config.json").is_file() or not config.model.path:
        return
    if Path(config.model.path).resolve() != final.resolve():
        print(f"note: this evaluates model.path {config.model.path}, not the trained policy of run folder "
              f"{config.run.dir} ({final}); `agentrl eval {config.run.dir}` evaluates that one")
