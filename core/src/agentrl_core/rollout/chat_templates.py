"""Chat templates: an OpenAI conversation -> prompt token ids (the ``agentrl_chat_templates`` hook).

A template is what the model reads; the gateway and the chat encoder render every prompt
through one (``ChatTemplate.render(messages, tools, *, add_generation_prompt, **kwargs)``),
so a model family whose prompt format the tokenizer does not carry is a plugin.

* ``hf``: the tokenizer's own Jinja template (``model.chat_template`` replaces it, see
  :mod:`agentrl_core.rollout.tokenizer`), rendered by ``apply_chat_template``;
* ``qwen3``: Qwen3's conversation format for any tokenizer with ChatML tokens: tools in the
  system turn, ``<tool_call>`` JSON blocks, ``<tool_response>`` blocks in a user turn, and
  reasoning (``reasoning_content``, or a ``<think>`` block inside ``content``) rendered as
  ``<think>\\n...\\n</think>\\n\\n`` only for assistant turns after the last user query.
  Earlier turns lose their reasoning once a new user message arrives, exactly the rewrite
  that makes Qwen3 conversations fork in the gateway (docs/architecture.md section 5).
  ``enable_thinking=False`` (a template keyword) writes an empty think block after the
  generation prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrl_core.types import Message

__all__ = ["HFChatTemplate", "JinjaChatTemplate", "Qwen3ChatTemplate", "QWEN3_CHAT_TEMPLATE", "as_ids"]


def as_ids(encoded: Any) -> list[int]:
    """``apply_chat_template(tokenize=True)`` returns a list or a BatchEncoding by version."""
    if isinstance(encoded, dict) or hasattr(encoded, "keys"):
        encoded = encoded["input_ids"]
    if hasattr(encoded, "tolist"):
        encoded = encoded.tolist()
    if encoded and isinstance(encoded[0], list):
        encoded = encoded[0]
    return [int(i) for i in encoded]


class HFChatTemplate:
    """The tokenizer's own chat template."""

    name = "hf"
    template: str | None = None  # None: the tokenizer's

    def __init__(self, config: Any = None, *, tokenizer: Any, **kwargs: Any) -> None:
        self.tokenizer = tokenizer

    def render(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None, *,
               add_generation_prompt: bool, **template_kwargs: Any) -> list[int]:
        if self.template is not None:
            template_kwargs = {**template_kwargs, "chat_template": self.template}
        return as_ids(self.tokenizer.apply_chat_template(
            list(messages), tools=list(tools) if tools else None, add_generation_prompt=add_generation_prompt,
            tokenize=True, **template_kwargs))

    def render_text(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None, *,
                    add_generation_prompt: bool, **template_kwargs: Any) -> str:
        if self.template is not None:
            template_kwargs = {**template_kwargs, "chat_template": self.template}
        return self.tokenizer.apply_chat_template(
            list(messages), tools=list(tools) if tools else None, add_generation_prompt=add_generation_prompt,
            tokenize=False, **template_kwargs)


class JinjaChatTemplate(HFChatTemplate):
    """A template given as Jinja text, rendered with the run's tokenizer (subclass and set ``template``)."""

    name = "jinja"


# Written for agentrl after Qwen3's documented behaviour (see the module docstring).
QWEN3_CHAT_TEMPLATE = """
{%- macro render_call(call) -%}
    {%- if call.function is defined %}{%- set call = call.function %}{%- endif -%}
    {{- '<tool_call>\\n{"name": "' + call.name + '", "arguments": ' -}}
    {%- if call.arguments is string %}{{- call.arguments -}}{%- else %}{{- call.arguments | tojson -}}{%- endif -%}
    {{- '}\\n</tool_call>' -}}
{%- endmacro -%}
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages and messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
    {{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
    {%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within '
        '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": '
        '<args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages and messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set state = namespace(last_query=-1) %}
{%- for message in messages %}
    {%- if message.role == 'user' and not (message.content is string and message.content.startswith('<tool_response>')
                                            and message.content.endswith('</tool_response>')) %}
        {%- set state.last_query = loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set content = message.content or '' %}
        {%- set reasoning = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].split('<think>')[-1] %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\\n' }}
        {%- if loop.index0 > state.last_query and reasoning.strip('\\n') %}
            {{- '<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' }}
        {%- endif %}
        {{- content }}
        {%- for call in message.tool_calls or [] %}
            {%- if content or not loop.first %}{{- '\\n' }}{%- endif %}
            {{- render_call(call) }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\\n<tool_response>\\n' + (message.content or '') + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}
"""


class Qwen3ChatTemplate(JinjaChatTemplate):
    name = "qwen3"
    template = QWEN3_CHAT_TEMPLATE
