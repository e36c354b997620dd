"""Registration only (imported at plugin discovery); the environment is imported lazily."""

from agentrl_core import hookimpl
from agentrl_core.types import AgentLoopSpec, EnvironmentSpec


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


@hookimpl
def agentrl_agent_loops():
    return [
        AgentLoopSpec(
            name="longtail",
            factory="agentrl_bench_replay.longtail:LongTailAgentLoop",
            config_schema="agentrl_bench_replay.longtail:LongTailConfig",
            description="the chat loop with log-normal action lengths, ignore_eos (benchmarks only)",
        )
    ]
