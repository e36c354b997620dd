"""Building the configured engine driver with the run's options (train, eval and the GPU check).

A driver factory (``agentrl_rollout_engines``) is called as::

    factory(None, engine=config.engine, model=config.model, max_context=config.rollout.max_total_len,
            seed=config.run.seed, host=HOST, log_dir=DIR)

``model`` carries ``dtype``, ``tool_parser``, ``chat_template`` and ``trust_remote_code``;
``max_context`` bounds prompt plus completion (the agent loop never needs more); ``host`` is
the address the engines bind and are reached at (127.0.0.1 on one machine, the node's
address on a Ray cluster). A driver tells how many ranks of the learner's weight-update
group one of its engines takes with ``ranks_per_engine`` (1 unless the engine is tensor
parallel; SGLang: ``engine.sglang.tp_size``).
"""

from __future__ import annotations

from typing import Any

from agentrl_core.config import Config
from agentrl_core.types import RolloutEngineSpec

__all__ = ["build_engine_driver", "ranks_per_engine"]


def build_engine_driver(config: Config, *, registry: Any = None, log_dir: str | None = None,
                        host: str = "127.0.0.1") -> Any:
    """The driver named by ``engine.driver``, given the run's options."""
    if registry is None:
        from agentrl_core.registry import Registry

        registry = Registry()
    return registry.build(RolloutEngineSpec, config.engine.driver, None, engine=config.engine, model=config.model,
                          max_context=config.rollout.max_total_len, seed=config.run.seed, host=host, log_dir=log_dir)


def ranks_per_engine(driver: Any) -> int:
    """Weight-update group ranks one engine of ``driver`` takes (1 when the driver does not say)."""
    return int(getattr(driver, "ranks_per_engine", 1))
