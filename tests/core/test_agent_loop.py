"""The chat agent loop: token exactness, masks, length stops, aborts, template rewrites.

The engine here is a labelled test double (``ScriptedPool``): it returns scripted token ids
so that every appended token can be checked. The loop against the real engine server is
tested in ``test_agent_loop_engine.py``.
"""

from __future__ import annotations

import json

import anyio
import attrs
import pytest

from agentrl_core.env import Environment, Status, Step, ToolSession, function_tool, tool_result
from agentrl_core.rollout.agent_loop import ChatAgentLoop, LoopSettings, RolloutRequest
from agentrl_core.rollout.chat_encoding import ChatEncoder, TemplateError, probe_template
from agentrl_core.rollout.sampler import CurrentSampler
from agentrl_core.testing.local_env import LocalEnvClient

ADD = function_tool("add", "add two numbers", {"a": {"type": "integer"}, "b": {"type": "integer"}}, ["a", "b"])
ANSWER = function_tool("answer", "final answer", {"value": {"type": "integer"}}, ["value"])


class SumSession(ToolSession):
    """Add 2 + 3 with the add tool, then answer; a test environment for the loop."""

    async def on_start(self):
        return Step([{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "What is 2 + 3?"}])

    async def on_tool_call(self, call, message):
        if call.name == "add":
            return Step([tool_result(call, str(call.arguments["a"] + call.arguments["b"]))])
        ok = call.arguments["value"] == 5
        return Step([tool_result(call, "right" if ok else "wrong")], status=Status.COMPLETED, reward=float(ok))


class SumEnv(Environment):
    name = "sum"
    tools = [ADD, ANSWER]

    def __init__(self, max_rounds=5):
        super().__init__()
        self.max_rounds = max_rounds
        self.closed = 0

    def index_sets(self):
        return {"test": [0]}

    async def open(self, split, index):
        env = self

        class Tracked(SumSession):
            async def on_close(self):
                env.closed += 1

        return Tracked(self.tools, max_rounds=self.max_rounds)


@attrs.frozen
class Generated:
    output_ids: list
    logprobs: list
    finish_reason: str
    weight_version: int
    engine: str = "scripted-0"


class ScriptedPool:
    """TEST DOUBLE for an engine pool: replies with scripted token ids, records prompts."""

    name = "current"

    def __init__(self, replies):
        self.replies = list(replies)  # (ids, finish_reason, version)
        self.prompts = []
        self.params = []

    async def generate(self, key, input_ids, params):
        self.prompts.append(list(input_ids))
        self.params.append(dict(params))
        ids, finish, version = self.replies.pop(0)
        return Generated(list(ids), [-0.25 - 0.01 * i for i in range(len(ids))], finish, version)


def canonical_call(name, args):
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args)}}}\n</tool_call>'


def make_loop(tokenizer, parser, pool, env, **settings):
    return ChatAgentLoop(
        tokenizer=tokenizer, env_client=LocalEnvClient({"sum-test": (env, "test")}), pools={"current": pool},
        sampler=CurrentSampler(), tool_parser=parser, settings=LoopSettings(**settings),
    )


def encode_reply(tokenizer, text, *, end=True):
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids + ([tokenizer.convert_tokens_to_ids("<|im_end|>")] if end else [])


REQUEST = RolloutRequest(task="sum-test", index=0, group_id="g0", uid="g0/0", split="test", env="sum")


def test_canonical_episode_equals_full_template_encoding(tokenizer, parser):
    env = SumEnv()
    texts = [canonical_call("add", {"a": 2, "b": 3}), canonical_call("answer", {"value": 5})]
    pool = ScriptedPool([(encode_reply(tokenizer, t), "stop", 7) for t in texts])
    traj = anyio.run(make_loop(tokenizer, parser, pool, env).run, REQUEST)
    assert traj.status is Status.COMPLETED and traj.reward == 1.0 and traj.training_reward == 1.0
    assert env.closed == 1
    # the whole conversation re-encoded by the template equals what the loop built, up to the
    # last assistant turn (the final observation is not appended: nothing follows it)
    messages = traj.messages[:-1]
    full = ChatEncoder(tokenizer, [ADD, ANSWER]).encode(messages, add_generation_prompt=False)
    assert traj.input_ids == full[: len(traj.input_ids)]
    assert full[len(traj.input_ids):] == tokenizer.encode("\n", add_special_tokens=False)  # separator after last eot
    # loss_mask marks exactly the sampled tokens, with their log-probs and version
    sampled = [i for turn in pool_replies(tokenizer, texts) for i in turn]
    assert [t for t, m in zip(traj.input_ids, traj.loss_mask) if m] == sampled
    assert all(v == 7 for v, m in zip(traj.versions, traj.loss_mask) if m)
    assert all(v == -1 and lp == 0.0 for v, lp, m in zip(traj.versions, traj.rollout_logprobs, traj.loss_mask) if not m)
    # the second prompt the engine saw is the first prompt + reply + observation tokens (incl. the newline)
    assert pool.prompts[1][: len(pool.prompts[0])] == pool.prompts[0]
    assert [t.pool for t in traj.turns] == ["current", "current"] and traj.num_turns == 2


def pool_replies(tokenizer, texts):
    return [encode_reply(tokenizer, t) for t in texts]


def test_non_canonical_tool_call_text_keeps_sampled_ids(tokenizer, parser):
    env = SumEnv()
    odd = '<tool_call>\n{ "arguments":{"b":3,"a":2},  "name":"add" }\n</tool_call>'  # valid, not canonical
    replies = [encode_reply(tokenizer, odd), encode_reply(tokenizer, canonical_call("answer", {"value": 5}))]
    pool = ScriptedPool([(r, "stop", 0) for r in replies])
    traj = anyio.run(make_loop(tokenizer, parser, pool, env).run, REQUEST)
    assert traj.status is Status.COMPLETED and traj.reward == 1.0
    assert [t for t, m in zip(traj.input_ids, traj.loss_mask) if m] == replies[0] + replies[1]
    first_end = len(pool.prompts[0]) + len(replies[0])
    observation = traj.input_ids[first_end: len(pool.prompts[1])]
    assert observation == ChatEncoder(tokenizer, [ADD, ANSWER]).encode_observation(traj.messages[3:4])
    assert tokenizer.decode(observation).startswith("\n<|im_start|>user\n<tool_response>\n5")


def test_length_stop_appends_end_of_turn_unmasked(tokenizer, parser):
    env = SumEnv()
    truncated = tokenizer.encode('<tool_call>\n{"name": "add", "argu', add_special_tokens=False)
    pool = ScriptedPool([(truncated, "length", 1), (encode_reply(tokenizer, canonical_call("answer", {"value": 5})), "stop", 1)])
    traj = anyio.run(make_loop(tokenizer, parser, pool, env).run, REQUEST)
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    start = len(pool.prompts[0])
    assert traj.input_ids[start: start + len(truncated) + 1] == truncated + [eot]
    assert traj.loss_mask[start: start + len(truncated) + 1] == [1] * len(truncated) + [0]
    assert traj.metrics["invalid_turns"] == 1  # the env answered the broken call with an error observation
    assert traj.status is Status.COMPLETED


def test_max_total_len_ends_as_context_limit_and_cancels(tokenizer, parser):
    env = SumEnv()
    reply = encode_reply(tokenizer, canonical_call("add", {"a": 2, "b": 3}))
    pool = ScriptedPool([(reply, "stop", 0)] * 3)
    loop = make_loop(tokenizer, parser, pool, env, max_total_len=0)
    prompt_len = len(ChatEncoder(tokenizer, [ADD, ANSWER]).encode_prompt(
        [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "What is 2 + 3?"}]))
    loop.settings = LoopSettings(max_total_len=prompt_len + len(reply) + 5)
    traj = anyio.run(loop.run, REQUEST)
    assert traj.status is Status.AGENT_CONTEXT_LIMIT and traj.training_reward == -0.2
    assert env.closed == 1  # the session was cancelled


def test_max_turns_and_env_round_limit(tokenizer, parser):
    env = SumEnv(max_rounds=2)
    reply = encode_reply(tokenizer, canonical_call("add", {"a": 2, "b": 3}))
    traj = anyio.run(make_loop(tokenizer, parser, ScriptedPool([(reply, "stop", 0)] * 5), env).run, REQUEST)
    assert traj.status is Status.TASK_LIMIT_REACHED and traj.num_turns == 2 and traj.training_reward == -0.2
    env = SumEnv(max_rounds=10)
    traj = anyio.run(make_loop(tokenizer, parser, ScriptedPool([(reply, "stop", 0)] * 5), env, max_turns=3).run, REQUEST)
    assert traj.status is Status.TASK_LIMIT_REACHED and traj.num_turns == 3 and env.closed == 1


def test_without_partial_rollouts_an_aborted_turn_is_regenerated_with_one_version(tokenizer, parser):
    env = SumEnv()
    partial = tokenizer.encode("<tool_call>", add_special_tokens=False)
    replies = [
        (partial, "abort", 3),  # weights being updated: discarded
        (encode_reply(tokenizer, canonical_call("add", {"a": 2, "b": 3})), "stop", 4),
        (encode_reply(tokenizer, canonical_call("answer", {"value": 5})), "stop", 4),
    ]
    pool = ScriptedPool(replies)
    traj = anyio.run(make_loop(tokenizer, parser, pool, env, partial_rollouts=False).run, REQUEST)
    assert pool.prompts[0] == pool.prompts[1]  # regenerated from the start of the turn
    assert {v for v, m in zip(traj.versions, traj.loss_mask) if m} == {4}
    assert traj.metrics["aborted_turns"] == 1 and traj.turns[0].aborted_retries == 1
    assert traj.metrics["discarded_tokens"] == len(partial) and traj.metrics["interrupted_turns"] == 0


def test_with_partial_rollouts_an_aborted_turn_continues_from_its_tokens(tokenizer, parser):
    """An engine that can only abort (SGLang): the loop keeps the cut tokens and asks for the rest."""
    env = SumEnv()
    call = encode_reply(tokenizer, canonical_call("add", {"a": 2, "b": 3}))
    cut = 3
    replies = [
        (call[:cut], "abort", 3),  # paused for a weight sync after 3 tokens of version 3
        (call[cut:], "stop", 4),  # the rest, sampled by version 4 given the prompt and those 3 tokens
        (encode_reply(tokenizer, canonical_call("answer", {"value": 5})), "stop", 4),
    ]
    pool = ScriptedPool(replies)
    traj = anyio.run(make_loop(tokenizer, parser, pool, env, max_new_tokens=64).run, REQUEST)
    assert traj.status is Status.COMPLETED and traj.reward == 1.0  # the joined reply parsed as one tool call
    assert pool.prompts[1] == pool.prompts[0] + call[:cut]
    assert [p["max_new_tokens"] for p in pool.params[:2]] == [64, 64 - cut]
    first_turn = [(i, v, lp) for i, v, lp, m in zip(traj.input_ids, traj.versions, traj.rollout_logprobs,
                                                    traj.loss_mask, strict=True) if m][: len(call)]
    assert [i for i, _, _ in first_turn] == call
    assert [v for _, v, _ in first_turn] == [3] * cut + [4] * (len(call) - cut)  # each token its own version
    assert [lp for _, _, lp in first_turn] == pytest.approx(
        [-0.25 - 0.01 * i for i in range(cut)] + [-0.25 - 0.01 * i for i in range(len(call) - cut)])
    assert traj.turns[0].version == 3 and traj.turns[0].num_tokens == len(call)
    assert traj.metrics["discarded_tokens"] == 0 and traj.metrics["aborted_turns"] == 1
    assert traj.metrics["interrupted_turns"] == 1 and traj.metrics["mixed_version_tokens"] == len(call)


def test_an_answer_with_per_token_versions_is_kept_as_it_is(tokenizer, parser):
    """An engine that retracts (hf, vllm) answers once, with several versions: nothing is resent."""

    @attrs.frozen
    class Spanned(Generated):
        versions: list = attrs.field(factory=list)

    class SpannedPool(ScriptedPool):
        async def generate(self, key, input_ids, params):
            out = await super().generate(key, input_ids, params)
            return Spanned(out.output_ids, out.logprobs, out.finish_reason, out.weight_version,
                           versions=[1] * 2 + [2] * (len(out.output_ids) - 2))

    env = SumEnv()
    texts = [canonical_call("add", {"a": 2, "b": 3}), canonical_call("answer", {"value": 5})]
    pool = SpannedPool([(encode_reply(tokenizer, t), "stop", 2) for t in texts])
    traj = anyio.run(make_loop(tokenizer, parser, pool, env).run, REQUEST)
    actions = [v for v, m in zip(traj.versions, traj.loss_mask) if m]
    n1, n2 = (t.num_tokens for t in traj.turns)
    assert actions == [1, 1] + [2] * (n1 - 2) + [1, 1] + [2] * (n2 - 2) and len(pool.prompts) == 2
    assert traj.metrics["interrupted_turns"] == 2 and traj.metrics["mixed_version_tokens"] == n1 + n2


def test_engine_failure_is_infra_and_session_ends(tokenizer, parser):
    class Broken(ScriptedPool):
        async def generate(self, key, input_ids, params):
            raise ConnectionError("engine went away")

    env = SumEnv()
    traj = anyio.run(make_loop(tokenizer, parser, Broken([]), env).run, REQUEST)
    assert traj.failure.value == "infra" and traj.training_reward is None
    assert "engine went away" in traj.metrics["infra_error"] and env.closed == 1


def test_cancellation_still_ends_the_session(tokenizer, parser):
    class Hanging(ScriptedPool):
        async def generate(self, key, input_ids, params):
            await anyio.sleep_forever()

    env = SumEnv()
    loop = make_loop(tokenizer, parser, Hanging([]), env)

    async def main():
        with anyio.move_on_after(0.2):
            await loop.run(REQUEST)

    anyio.run(main)
    assert env.closed == 1


def test_template_rewrite_is_detected(tokenizer, parser):
    assert probe_template(tokenizer, [ADD]) == []
    rewriting = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    # strip <think> blocks from earlier assistant turns, as Qwen3's template does
    original = "{{- '\\n' + message.content }}"
    assert original in rewriting.chat_template
    rewriting.chat_template = rewriting.chat_template.replace(
        original,
        "{%- if loop.index0 < messages|length - 2 and '</think>' in message.content %}"
        "{{- '\\n' + message.content.split('</think>')[-1].lstrip('\\n') }}"
        "{%- else %}{{- '\\n' + message.content }}{%- endif %}",
    )
    problems = probe_template(rewriting, [ADD])
    assert problems == ["the template rewrites earlier turns with reasoning blocks once tool results follow",
                        "the template rewrites earlier turns with reasoning blocks once a new user message follows"]
    loop = make_loop(rewriting, parser, ScriptedPool([]), SumEnv(), on_template_rewrite="error")
    with pytest.raises(TemplateError, match="rewrites earlier turns"):
        loop.encoder_for([ADD, ANSWER])


def test_failed_setup_is_an_infra_failure_without_tokens(tokenizer, parser):
    class BrokenSetup(SumEnv):
        async def open(self, split, index):
            env = self

            class Failing(SumSession):
                async def on_start(self):
                    raise RuntimeError("the sandbox did not come up")

                async def on_close(self):
                    env.closed += 1

            return Failing(self.tools, max_rounds=3)

    env = BrokenSetup()
    pool = ScriptedPool([])
    traj = anyio.run(make_loop(tokenizer, parser, pool, env).run, REQUEST)
    assert traj.status is Status.TASK_ERROR and traj.failure.value == "infra" and traj.training_reward is None
    assert traj.input_ids == [] and pool.prompts == [] and env.closed == 1


def test_full_workers_are_waited_for_not_failed(tokenizer, parser):
    from agentrl_core.controlplane.client import NoCapacity

    class BusyThenFree(LocalEnvClient):
        refusals = 2

        async def start(self, task, index):
            if self.refusals:
                self.refusals -= 1
                raise NoCapacity("every worker of task 'sum-test' is full", status=406)
            return await super().start(task, index)

    env = SumEnv()
    texts = [canonical_call("add", {"a": 2, "b": 3}), canonical_call("answer", {"value": 5})]
    loop = ChatAgentLoop(tokenizer=tokenizer, env_client=BusyThenFree({"sum-test": (env, "test")}),
                         pools={"current": ScriptedPool([(encode_reply(tokenizer, t), "stop", 0) for t in texts])},
                         sampler=CurrentSampler(), tool_parser=parser, settings=LoopSettings())
    traj = anyio.run(loop.run, REQUEST)
    assert traj.status is Status.COMPLETED and traj.reward == 1.0
    loop.env_client = BusyThenFree({"sum-test": (env, "test")})
    loop.env_client.refusals = 100
    loop.settings = LoopSettings(start_wait=1.0)
    traj = anyio.run(loop.run, REQUEST)
    assert traj.failure.value == "infra" and "full" in traj.metrics["infra_error"]


def test_a_template_that_fails_still_ends_the_session(tokenizer, parser):
    # the chat template raises before the first turn (a tool schema it cannot render, a broken
    # template): the session was already started on a worker and must not be left open there
    broken = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    broken.chat_template = "{{ raise_exception('this template cannot render tools') }}"
    env = SumEnv()
    loop = make_loop(broken, parser, ScriptedPool([]), env)
    with pytest.raises(Exception, match="cannot render tools"):
        anyio.run(loop.run, REQUEST)
    assert env.closed == 1


def test_sampling_settings_reach_the_engine(tokenizer, parser):
    from agentrl_core.config import RolloutConfig

    class Recording(ScriptedPool):
        async def generate(self, key, input_ids, params):
            self.params = dict(params)
            return await super().generate(key, input_ids, params)

    settings = LoopSettings.from_rollout_config(RolloutConfig(temperature=0.7, top_p=0.9, top_k=20))
    pool = Recording([(encode_reply(tokenizer, canonical_call("answer", {"value": 5})), "stop", 0)])
    loop = ChatAgentLoop(tokenizer=tokenizer, env_client=LocalEnvClient({"sum-test": (SumEnv(), "test")}),
                         pools={"current": pool}, sampler=CurrentSampler(), tool_parser=parser, settings=settings)
    anyio.run(loop.run, REQUEST)
    assert (pool.params["temperature"], pool.params["top_p"], pool.params["top_k"]) == (0.7, 0.9, 20)


def test_a_subclass_sets_each_turns_sampling_and_the_stop_tokens_it_sends_are_the_ones_used(tokenizer, parser):
    class FixedLengths(ChatAgentLoop):
        def sampling_params(self, context, encoder, max_new):
            return {**super().sampling_params(context, encoder, max_new),
                    "max_new_tokens": 3 + context.turn, "ignore_eos": True, "stop_token_ids": []}

    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    call = encode_reply(tokenizer, canonical_call("add", {"a": 2, "b": 3}), end=False)
    # turn 0 is cut by a weight sync after [im_end]: with no stop tokens it is not a stop, so it continues
    pool = ScriptedPool([([im_end], "abort", 0), (call[:2], "length", 1),
                         (encode_reply(tokenizer, canonical_call("answer", {"value": 5})), "stop", 1)])
    loop = FixedLengths(tokenizer=tokenizer, env_client=LocalEnvClient({"sum-test": (SumEnv(), "test")}),
                        pools={"current": pool}, sampler=CurrentSampler(), tool_parser=parser, settings=LoopSettings())
    traj = anyio.run(loop.run, REQUEST)
    assert [p["max_new_tokens"] for p in pool.params] == [3, 2, 4]  # turn 0: 3, then the 2 left; turn 1: 4
    assert all(p["ignore_eos"] and p["stop_token_ids"] == [] for p in pool.params)
    assert [t.num_tokens for t in traj.turns[:1]] == [3]
