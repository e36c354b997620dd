"""Tool-call parsers: OpenAI tool_calls from model text; malformed blocks give a reason, never an exception."""

from __future__ import annotations

import json

import pytest

from agentrl_core.registry import Registry
from agentrl_core.rollout.tool_parsers import HermesParser, Qwen25Parser

TOOLS = [{"type": "function", "function": {"name": "calculate", "parameters": {"type": "object", "properties": {}}}}]


def args_of(call):
    return json.loads(call["function"]["arguments"])


@pytest.mark.parametrize("name", ["qwen25", "hermes"])
def test_registered_parsers_build_from_the_registry(name):
    parser = Registry().build("tool_parser", name)
    calls, text, error = parser.parse('<tool_call>\n{"name": "calculate", "arguments": {"a": 1}}\n</tool_call>', TOOLS)
    assert error is None and text == "" and [c["function"]["name"] for c in calls] == ["calculate"]


def test_qwen25_several_calls_and_surrounding_text():
    text = ('Let me compute.\n<tool_call>\n{"name": "calculate", "arguments": {"a": 12, "op": "+", "b": 7}}\n</tool_call>\n'
            '<tool_call>\n{"name": "submit_answer", "arguments": {"answer": 19}}\n</tool_call>')
    calls, normal, error = Qwen25Parser().parse(text, TOOLS)
    assert error is None
    assert normal == "Let me compute."
    assert [c["function"]["name"] for c in calls] == ["calculate", "submit_answer"]
    assert args_of(calls[0]) == {"a": 12, "op": "+", "b": 7} and args_of(calls[1]) == {"answer": 19}
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert calls[0]["id"] != calls[1]["id"]
    assert Qwen25Parser().parse(text, TOOLS)[0] == calls  # deterministic ids


def test_plain_text_is_not_a_call():
    assert Qwen25Parser().parse("The answer is 4.", TOOLS) == ([], "The answer is 4.", None)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('<tool_call>\n{"name": "calculate", "arguments": {"a": 1,}}\n</tool_call>', "not valid JSON"),
        ("<tool_call>\n\n</tool_call>", "is empty"),
        ('<tool_call>["calculate"]</tool_call>', "must be a JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'no "name"'),
        ('<tool_call>{"name": "calculate", "arguments": [1, 2]}</tool_call>', '"arguments" as a JSON object'),
        ('<tool_call>{"name": "calculate", "arguments": "{oops"}</tool_call>', "string but not JSON"),
        ('{"name": "calculate"}</tool_call>', "without <tool_call>"),
    ],
)
def test_malformed_blocks_give_no_call_and_a_reason(text, reason):
    calls, _, error = Qwen25Parser().parse(text, TOOLS)
    assert calls == [] and error is not None and reason in error


def test_one_bad_block_keeps_the_good_one():
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": b}</tool_call>'
    calls, _, error = Qwen25Parser().parse(text, TOOLS)
    assert [c["function"]["name"] for c in calls] == ["a"]
    assert error.startswith("tool call 2 is not valid JSON")


def test_unclosed_block_at_the_end_and_string_arguments():
    calls, _, error = Qwen25Parser().parse('<tool_call>\n{"name": "f", "arguments": "{\\"x\\": 1}"}', TOOLS)
    assert error is None and args_of(calls[0]) == {"x": 1}
    calls, _, error = Qwen25Parser().parse('<tool_call>{"name": "f", "parameters": {"y": 2}}</tool_call>', TOOLS)
    assert error is None and args_of(calls[0]) == {"y": 2}


def test_hermes_reads_python_dicts_qwen25_does_not():
    text = "<tool_call>\n{'arguments': {'city': 'Paris'}, 'name': 'get_weather'}\n</tool_call>"
    calls, _, error = HermesParser().parse(text, TOOLS)
    assert error is None and calls[0]["function"]["name"] == "get_weather" and args_of(calls[0]) == {"city": "Paris"}
    calls, _, error = Qwen25Parser().parse(text, TOOLS)
    assert calls == [] and "not valid JSON" in error


def test_never_raises_on_odd_input():
    for text in ["<tool_call>", "<tool_call>" * 3, "<tool_call>{\"name\": \"x\", \"arguments\": {\"a\": " + "[" * 5000,
                 None, 42]:
        calls, normal, error = Qwen25Parser().parse(text, TOOLS)
        assert isinstance(calls, list) and isinstance(normal, str)
