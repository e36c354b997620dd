"""Registration only (imported at plugin discovery); the environment is imported lazily."""

from agentrl_core import hookimpl
from agentrl_core.types import EnvironmentSpec


@hookimpl
def agentrl_environments():
    return [
        EnvironmentSpec(
            name="replay",
            factory="agentrl_bench_replay.env:ReplayEnvironment",
            config_schema="agentrl_bench_replay.env:ReplayConfig",
            description="replays recorded turn counts and latencies of the real environments (benchmarks only)",
        )
    ]
