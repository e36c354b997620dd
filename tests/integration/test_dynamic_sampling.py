"""Dynamic sampling through the real rollout path: the rollout manager runs the chat agent loop
on the calc example environment against the hf engine serving the tiny model, and sync mode's
rounds, the filter and the fallback meet real trajectories (statuses, training rewards).

The tiny model is untrained: it never submits an answer, every episode ends at the turn limit
with the same punishment (-0.2), so every group is filtered, as at the start of a run on a task
too hard for the model. The run therefore goes through sync mode's rounds up to the bound and
the fill, with real trajectories (measured: 4 groups started, 2 of them extra, 2 filled); the
assertions hold whichever groups have a reward spread, and the useful path is checked with
hand-built rewards in tests/core/test_dynamic_sampling.py. docs/architecture.md section 6.
"""

from __future__ import annotations

import anyio


def test_sync_batch_through_the_real_rollout_manager(tiny_model_dir):
    from agentrl_plugin_example.env import CalcConfig, CalcEnvironment
    from transformers import AutoTokenizer

    from agentrl_core.engine.process import BackgroundEngine
    from agentrl_core.engine.server import EngineServer
    from agentrl_core.rollout.agent_loop import ChatAgentLoop, LoopSettings
    from agentrl_core.rollout.engine_client import EnginePool
    from agentrl_core.rollout.sampler import CurrentSampler
    from agentrl_core.rollout.tool_parsers import Qwen25Parser
    from agentrl_core.testing.local_env import LocalEnvClient
    from agentrl_core.train.buffer import GroupBuffer
    from agentrl_core.train.rollout_manager import RolloutManager
    from agentrl_core.train.task_stream import StreamTask, TaskStream

    batch_groups, n, max_extra = 2, 2, 2
    env = CalcEnvironment(CalcConfig(compact_prompt=True))
    env_client = LocalEnvClient({"calc-train": (env, "train")})
    stream = TaskStream([StreamTask("calc-train", "calc", "train", tuple(range(16)))], n_samples=n, seed=5)
    buffer = GroupBuffer(n, 4 * batch_groups * n, filter_equal_rewards=True, max_extra_groups=max_extra, fallback="fill")
    settings = LoopSettings(max_turns=2, max_total_len=768, max_new_tokens=16, temperature=1.0)

    async def main(url):
        async with EnginePool("current", [url], timeout=120) as pool:
            loop = ChatAgentLoop(tokenizer=AutoTokenizer.from_pretrained(tiny_model_dir), env_client=env_client,
                                 pools={"current": pool}, sampler=CurrentSampler(), tool_parser=Qwen25Parser(None),
                                 settings=settings, seed=5)
            manager = RolloutManager(agent_loop=loop, buffer=buffer, stream=stream, concurrency=4,
                                     batch_groups=batch_groups)
            with anyio.fail_after(300):
                await manager.run_batch(batch_groups)
            return manager

    with BackgroundEngine(EngineServer(tiny_model_dir, max_running_requests=4, dtype="float32")) as engine:
        manager = anyio.run(main, engine.url)

    batch = buffer.take_ready(batch_groups * n)
    take = buffer.last_take
    groups = {}
    for t in batch:
        groups.setdefault(t.group_id, []).append(t.training_reward)
    equal = [g for g, rewards in groups.items() if len(set(rewards)) == 1]
    print(f"started {manager.groups_started} groups ({manager.extra_groups_started} extra), {take}, "
          f"statuses {dict(manager.statuses)}")

    assert manager.groups_dropped == 0 and all(r is not None for rs in groups.values() for r in rs)
    assert take.useful + take.filtered == manager.groups_started == batch_groups + manager.extra_groups_started
    assert manager.extra_groups_started <= max_extra
    assert len(equal) == take.filled  # an all-equal group reaches the learner only as a counted fill
    assert take.useful == len(groups) - take.filled
    if take.useful < batch_groups:  # short of the batch: the bound was spent, and the fallback filled
        assert take.fallback and manager.extra_groups_started == max_extra and len(groups) == batch_groups
    else:
        assert not take.fallback and take.filled == 0
    stream.mark_done(sorted(groups))
    stream.mark_done(buffer.take_spent())
    assert stream.outstanding == []
