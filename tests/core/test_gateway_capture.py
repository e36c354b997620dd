"""Gateway token capture without an engine: append, realign, fork, concurrent calls, replays, sessions.

The "engine output" here is a list of token ids chosen by the test (the capture logic does
not care where they came from); the gateway against real engines and real OpenAI clients is
``test_gateway.py``.
"""

from __future__ import annotations

import json

import pytest

from agentrl_core.gateway.capture import (
    APPEND,
    FORK,
    NEW,
    REALIGN,
    Conversation,
    Renderer,
    Sampled,
    align,
    commit,
    plan_chat,
    plan_text,
)
from agentrl_core.gateway.sessions import SessionGone, SessionStore
from agentrl_core.rollout.chat_templates import Qwen3ChatTemplate, as_ids
from agentrl_core.rollout.reasoning_parsers import ThinkParser
from agentrl_core.types import Status

TOOLS = [{"type": "function", "function": {"name": "add", "description": "add two numbers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
FIRST = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def reply_of(tokenizer, text):
    """The ids a model would sample for ``text``, ending with <|im_end|>, and the message the gateway returns."""
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    return ids, {"role": "assistant", "content": text}


def call(conv, renderer, messages, sampled_ids, message, tools=TOOLS, reasoning=None):
    plan = plan_chat(conv, renderer, messages, tools, {})
    kind = commit(conv, plan, Sampled(sampled_ids, [-0.5] * len(sampled_ids), [3] * len(sampled_ids), True),
                  reply=message, reasoning=reasoning, close_turn_id=None)
    return plan, kind


def test_turns_append_only_the_new_messages_and_equal_a_full_render(tokenizer):
    renderer = Renderer(tokenizer)
    conv = Conversation()
    ids1, msg1 = reply_of(tokenizer, "I will add them.")
    plan1, kind1 = call(conv, renderer, FIRST, ids1, msg1)
    messages = [*FIRST, msg1, {"role": "user", "content": "And 4 + 4?"}]
    ids2, msg2 = reply_of(tokenizer, "Eight.")
    plan2, kind2 = call(conv, renderer, messages, ids2, msg2)
    assert (kind1, kind2) == (NEW, APPEND)
    [sample] = conv.samples
    full = tokenizer.apply_chat_template([*messages, msg2], tools=TOOLS, tokenize=False)
    assert tokenizer.decode(sample.ids) == full.rstrip("\n")  # the template's text, token for token
    assert sample.ids[: len(plan2.prompt_ids)] == plan2.prompt_ids
    assert [i for i, m in zip(sample.ids, sample.mask) if m] == ids1 + ids2
    assert sample.prompt_length == len(plan1.prompt_ids) and sample.calls == 2
    assert sample.versions == [3 if m else -1 for m in sample.mask]


def test_a_reply_in_non_canonical_tokens_is_realigned_and_kept_as_sampled(tokenizer):
    renderer = Renderer(tokenizer)
    conv = Conversation()
    canonical, msg1 = reply_of(tokenizer, "I will add them.")
    split = []  # the same text, one character per token: what the tokenizer would never produce
    for ch in "I will add them.":
        split += tokenizer.encode(ch, add_special_tokens=False)
    split.append(canonical[-1])
    assert split != canonical and tokenizer.decode(split) == tokenizer.decode(canonical)
    call(conv, renderer, FIRST, split, msg1)
    messages = [*FIRST, msg1, {"role": "user", "content": "And 4 + 4?"}]
    plan, kind = call(conv, renderer, messages, *reply_of(tokenizer, "Eight."))
    assert kind == REALIGN and len(conv.samples) == 1
    assert plan.prompt_ids[plan.reuse - len(split): plan.reuse] == split  # the engine saw the sampled tokens
    assert conv.counts == {NEW: 1, REALIGN: 1}


def test_edited_history_and_changed_tools_fork_into_new_samples(tokenizer):
    renderer = Renderer(tokenizer)
    conv = Conversation()
    ids1, msg1 = reply_of(tokenizer, "I will add them.")
    call(conv, renderer, FIRST, ids1, msg1)
    edited = [*FIRST, {**msg1, "content": "Something else."}, {"role": "user", "content": "And 4 + 4?"}]
    plan, kind = call(conv, renderer, edited, *reply_of(tokenizer, "Eight."))
    assert kind == FORK and len(conv.samples) == 2
    assert plan.prompt_ids == as_ids(tokenizer.apply_chat_template(edited, tools=TOOLS, add_generation_prompt=True))
    _, kind = call(conv, renderer, [*edited, {"role": "assistant", "content": "Eight."},
                                     {"role": "user", "content": "ok"}], *reply_of(tokenizer, "Done."), tools=None)
    assert kind == FORK and conv.fork_reasons["the tools or chat_template_kwargs changed"] == 1
    assert [s.calls for s in conv.samples] == [1, 1, 1]
    for sample in conv.samples:  # each sample is a whole sequence: prompt (mask 0), then sampled tokens
        assert sample.mask[0] == 0 and sum(sample.mask) > 0


def test_a_qwen3_template_that_drops_earlier_reasoning_forks(tokenizer):
    renderer = Renderer(tokenizer, Qwen3ChatTemplate(tokenizer=tokenizer))
    parser = ThinkParser()
    conv = Conversation()
    text = "<think>\nAdd 2 and 3.\n</think>\n\nFive."
    ids1 = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    reasoning, content = parser.parse(text)
    assert (reasoning, content) == ("Add 2 and 3.", "Five.")
    msg1 = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    call(conv, renderer, FIRST, ids1, msg1, tools=None, reasoning=reasoning)
    # the client sends the reply back without its reasoning (as OpenAI SDK clients do), then a new question
    messages = [*FIRST, {"role": "assistant", "content": "Five."}, {"role": "user", "content": "And 4 + 4?"}]
    plan, kind = call(conv, renderer, messages, *reply_of(tokenizer, "Eight."), tools=None)
    assert kind == FORK and len(conv.samples) == 2
    assert "Add 2 and 3" not in tokenizer.decode(plan.prompt_ids)  # the template dropped it: the model sees that
    assert "Add 2 and 3" in tokenizer.decode(conv.samples[0].ids)  # the first sample keeps what was sampled


def test_keep_history_appends_what_the_model_wrote_instead_of_forking(tokenizer):
    renderer = Renderer(tokenizer, Qwen3ChatTemplate(tokenizer=tokenizer))
    conv = Conversation()
    text = "<think>\nAdd 2 and 3.\n</think>\n\nFive."
    ids1 = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    msg1 = {"role": "assistant", "content": "Five.", "reasoning_content": "Add 2 and 3."}
    call(conv, renderer, FIRST, ids1, msg1, tools=None, reasoning="Add 2 and 3.")
    messages = [*FIRST, {"role": "assistant", "content": "Five."}, {"role": "user", "content": "And 4 + 4?"}]
    plan = plan_chat(conv, renderer, messages, None, {}, keep_history=True)
    assert plan.kind == REALIGN and plan.prompt_ids[: plan.reuse] == conv.current.ids
    assert "Add 2 and 3." in tokenizer.decode(plan.prompt_ids)  # the model keeps seeing what it wrote
    edited = [*FIRST, {"role": "assistant", "content": "Six."}, {"role": "user", "content": "And 4 + 4?"}]
    assert plan_chat(conv, renderer, edited, None, {}, keep_history=True).kind == FORK


def test_reasoning_is_kept_through_a_tool_loop_with_qwen3(tokenizer):
    renderer = Renderer(tokenizer, Qwen3ChatTemplate(tokenizer=tokenizer))
    conv = Conversation()
    call_text = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    text = "<think>\nUse the tool.\n</think>\n\n" + call_text
    ids1 = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    tool_call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    msg1 = {"role": "assistant", "content": None, "tool_calls": [tool_call], "reasoning_content": "Use the tool."}
    call(conv, renderer, FIRST, ids1, msg1, reasoning="Use the tool.")
    echoed = {"role": "assistant", "content": "", "tool_calls": [{**tool_call, "id": "other-id"}]}
    messages = [*FIRST, echoed, {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
    _, kind = call(conv, renderer, messages, *reply_of(tokenizer, "Five."))
    assert kind in (APPEND, REALIGN) and len(conv.samples) == 1


def test_concurrent_calls_of_one_session_do_not_mix(tokenizer):
    renderer = Renderer(tokenizer)
    conv = Conversation()
    ids1, msg1 = reply_of(tokenizer, "I will add them.")
    call(conv, renderer, FIRST, ids1, msg1)
    messages = [*FIRST, msg1, {"role": "user", "content": "And 4 + 4?"}]
    first = plan_chat(conv, renderer, messages, TOOLS, {})
    second = plan_chat(conv, renderer, messages, TOOLS, {})  # planned before the first one committed
    a, _ = reply_of(tokenizer, "Eight.")
    b, _ = reply_of(tokenizer, "Nine.")
    assert commit(conv, first, Sampled(a, [-1.0] * len(a), [0] * len(a), True), reply={"role": "assistant",
                  "content": "Eight."}, reasoning=None, close_turn_id=None) == APPEND
    assert commit(conv, second, Sampled(b, [-2.0] * len(b), [0] * len(b), True), reply={"role": "assistant",
                  "content": "Nine."}, reasoning=None, close_turn_id=None) == FORK
    assert len(conv.samples) == 2
    assert conv.samples[1].ids == [*second.prompt_ids, *b] and conv.samples[1].mask[: len(second.prompt_ids)] == \
        [0] * len(second.prompt_ids)


def test_a_length_stop_closes_the_turn_with_an_untrained_end_token(tokenizer):
    renderer = Renderer(tokenizer)
    conv = Conversation()
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    cut = tokenizer.encode("I will", add_special_tokens=False)
    plan = plan_chat(conv, renderer, FIRST, TOOLS, {})
    commit(conv, plan, Sampled(cut, [-1.0] * len(cut), [0] * len(cut), False),
           reply={"role": "assistant", "content": "I will"}, reasoning=None, close_turn_id=eot)
    sample = conv.samples[0]
    assert sample.ids[-1] == eot and sample.mask[-1] == 0 and sample.mask[-1 - len(cut):-1] == [1] * len(cut)
    _, kind = call(conv, renderer, [*FIRST, {"role": "assistant", "content": "I will"},
                                    {"role": "user", "content": "go on"}], *reply_of(tokenizer, "ok"))
    assert kind == APPEND


def test_completion_calls_align_as_text(tokenizer):
    renderer = Renderer(tokenizer)
    conv = Conversation()
    first = renderer.tokenize("Question: 2 + 3 =")
    plan = plan_text(conv, renderer, first)
    out = renderer.tokenize(" 5.")
    commit(conv, plan, Sampled(out, [-0.1] * len(out), [1] * len(out), True), reply=None, reasoning=None,
           close_turn_id=None)
    following = renderer.tokenize("Question: 2 + 3 = 5. Question: 4 + 4 =")
    plan = plan_text(conv, renderer, following)
    assert plan.kind in (APPEND, REALIGN) and plan.prompt_ids[: plan.reuse] == conv.current.ids
    assert renderer.decode(plan.prompt_ids) == "Question: 2 + 3 = 5. Question: 4 + 4 ="
    assert plan_text(conv, renderer, renderer.tokenize("Something else")).kind == FORK


def test_align_by_hand():
    pieces = {1: "ab", 2: "a", 3: "b", 4: "c", 5: "abc"}

    def decode(ids):
        return "".join(pieces[i] for i in ids)

    assert align([1, 4], [1, 4, 9], decode) == 2  # token for token
    assert align([2, 3, 4], [1, 4, 9], decode) == 2  # the same text, other tokens
    assert align([2, 3, 4], [5, 9], decode) == 1
    assert align([2, 3], [2, 4, 9], decode) is None  # "ab" vs "ac"


def test_sessions_expire_keys_answer_ended_and_outcomes_follow_the_status_table():
    ended = []
    store = SessionStore(idle_timeout=10.0, max_duration=100.0, on_end=ended.append)
    a = store.create(task="t")
    b = store.create(task="t")
    assert store.for_key(a.key) is a and store.get(b.id) is b
    b.post_reward(0.5)
    expired = store.expire_due(now=a.last_active + 11.0)
    assert {s.id for s in expired} == {a.id, b.id} and ended == expired
    with pytest.raises(SessionGone, match="has ended"):
        store.for_key(a.key)
    with pytest.raises(SessionGone, match="unknown session key"):
        store.for_key("sk-nope")
    assert a.outcome() == (Status.CANCELLED.value, None)  # no reward: an infrastructure failure
    assert b.outcome() == (Status.COMPLETED.value, 0.5)
    assert store.counters["infra"] == 1 and store.find(a.id) is a
    store.expire_due(now=a.last_active + 11.0 + store.finished_ttl + 1)
    with pytest.raises(SessionGone):
        store.find(a.id)


def test_sessions_with_a_call_in_flight_are_not_idle():
    store = SessionStore(idle_timeout=1.0)
    s = store.create()
    s.in_flight = 1
    assert store.expire_due(now=s.last_active + 5) == []
    s.in_flight = 0
    assert store.expire_due(now=s.last_active + 5) == [s]


def test_trajectory_sequences_split_into_train_samples():
    import torch

    from agentrl_core.train.batching import train_samples
    from agentrl_core.types import Trajectory

    traj = Trajectory(group_id="g", uid="g/0", task="t", split="s", index=0, input_ids=[1, 2, 3, 4, 5],
                      loss_mask=[0, 1, 0, 0, 1], rollout_logprobs=[0, -1, 0, 0, -2], versions=[-1, 0, -1, -1, 0],
                      turns=[], reward=1.0, training_reward=1.0, status="completed", failure="none",
                      sequence_lengths=[2, 3])
    samples = train_samples([traj], torch.tensor([[0.0, 0.7, 0.0, 0.0, 0.7]]))
    assert [s.input_ids for s in samples] == [[1, 2], [3, 4, 5]]
    assert [s.advantages for s in samples] == [[0.0, pytest.approx(0.7)], [0.0, 0.0, pytest.approx(0.7)]]
    with pytest.raises(ValueError, match="add up"):
        Trajectory(group_id="g", uid="g/0", task="t", split="s", index=0, input_ids=[1, 2], loss_mask=[0, 1],
                   rollout_logprobs=[0, 0], versions=[0, 0], turns=[], reward=0.0, training_reward=0.0,
                   status="completed", failure="none", sequence_lengths=[1, 2])


def test_think_parser_and_qwen3_coder_tool_calls():
    from agentrl_core.rollout.tool_parsers import Qwen3CoderParser

    parser = ThinkParser()
    assert parser.parse("<think>\nplan\n</think>\n\nanswer") == ("plan", "answer")
    assert parser.parse("plan only</think>answer") == ("plan only", "answer")  # the template opened the block
    assert parser.parse("<think>\nstill thinking") == ("still thinking", "")
    assert parser.parse("no reasoning") == (None, "no reasoning")
    text = ("Let me add.\n<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n3\n"
            "</parameter>\n</function>\n</tool_call>")
    calls, normal, error = Qwen3CoderParser().parse(text, TOOLS)
    assert error is None and normal == "Let me add."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("add", {"a": 2, "b": 3})]
