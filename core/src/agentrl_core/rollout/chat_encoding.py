"""Token-exact encoding of a multi-turn conversation with the model's chat template.

The agent loop never re-encodes history: it appends exactly the ids the engine sampled
(loss_mask 1) and, after each environment reply, the *observation tokens* (loss_mask 0).
Observation tokens are the difference between encoding a fixed base conversation with and
without the new messages, cut right after the base's last end-of-turn token, so they
include the separator the template puts after end-of-turn (Qwen's ``\\n`` after
``<|im_end|>``; upstream AgentRL dropped it) and end with the generation prompt. This is
robust to the model writing its tool calls in a non-canonical way, since the model's own
tokens are never re-rendered.

Some templates rewrite earlier turns when the conversation grows (Qwen3 strips
``<think>`` blocks from earlier assistant turns). :func:`probe_template` detects that;
the agent loop then keeps the history exactly as the model saw it while generating (the
only correct training data) and reports ``template_rewrites_history`` in its metrics,
or refuses to run when ``on_template_rewrite: error``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from agentrl_core.errors import AgentrlError
from agentrl_core.rollout.chat_templates import as_ids
from agentrl_core.types import Message

log = logging.getLogger(__name__)


class TemplateError(AgentrlError):
    """The chat template cannot be used for token-exact multi-turn rollouts."""


def _tool_call(name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


class ChatEncoder:
    """Encodes prompts and observation deltas for one tokenizer and tool list.

    ``template`` (a :class:`~agentrl_core.protocols.ChatTemplate`, with ``template_kwargs``)
    renders the conversations; ``None`` is the tokenizer's own template.
    """

    def __init__(self, tokenizer: Any, tools: Sequence[dict[str, Any]] | None, *, template: Any = None,
                 template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.tools = list(tools) if tools else None
        self.template = template
        self.template_kwargs = dict(template_kwargs or {})
        name = self.tools[0]["function"]["name"] if self.tools else "tool"
        self._base: list[Message] = [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U"},
            {"role": "assistant", "content": "", "tool_calls": [_tool_call(name, {}, "call_base")]},
        ]
        base_ids = self.encode(self._base, add_generation_prompt=False)
        end_of_turn = self._end_of_turn_ids()
        cut = max((i + 1 for i, t in enumerate(base_ids) if t in end_of_turn), default=None)
        if cut is None:
            raise TemplateError(
                "the chat template's rendering of an assistant turn contains no end-of-turn token "
                f"(looked for ids {sorted(end_of_turn)}); set the tokenizer's eos_token to the turn terminator"
            )
        self._base_prefix = base_ids[:cut]
        self._assistant_prefix: list[int] | None = None
        self.eot_id = base_ids[cut - 1]
        self.stop_token_ids = sorted(end_of_turn)

    def _end_of_turn_ids(self) -> set[int]:
        tok = self.tokenizer
        ids = set()
        for token in ("<|im_end|>", "<|eot_id|>", "<|end|>", tok.eos_token):
            if token is None:
                continue
            tid = tok.convert_tokens_to_ids(token)
            if isinstance(tid, int) and tid != tok.unk_token_id and tid >= 0:
                ids.add(tid)
        return ids

    def encode(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> list[int]:
        if self.template is not None:
            return self.template.render(messages, self.tools, add_generation_prompt=add_generation_prompt,
                                        **self.template_kwargs)
        return as_ids(
            self.tokenizer.apply_chat_template(
                list(messages), tools=self.tools, add_generation_prompt=add_generation_prompt, tokenize=True,
                **self.template_kwargs,
            )
        )

    def encode_prompt(self, messages: Sequence[Message]) -> list[int]:
        """The first prompt: system/user messages (and tools) plus the generation prompt."""
        return self.encode(messages, add_generation_prompt=True)

    def encode_observation(self, new_messages: Sequence[Message]) -> list[int]:
        """Tokens to append after an assistant turn that ended with end-of-turn."""
        full = self.encode([*self._base, *new_messages], add_generation_prompt=True)
        n = len(self._base_prefix)
        if full[:n] != self._base_prefix:
            raise TemplateError(
                "the chat template renders the base conversation differently once messages follow it; "
                "observation tokens cannot be computed by difference for this template"
            )
        return full[n:]

    def encode_assistant(self, message: Message) -> list[int]:
        """The tokens a model would generate for ``message``, ending with end-of-turn.

        Rendered by the template after a fixed user turn, so tool calls come out in the
        template's canonical form; used to turn demonstrations into training sequences that
        look exactly like rollouts.
        """
        if self._assistant_prefix is None:
            self._assistant_prefix = self.encode(self._base[:2], add_generation_prompt=True)
        prefix = self._assistant_prefix
        full = self.encode([*self._base[:2], message], add_generation_prompt=False)
        if full[: len(prefix)] != prefix:
            raise TemplateError("the chat template renders the generation prompt differently from an assistant turn")
        turn = full[len(prefix):]
        ends = [i for i, t in enumerate(turn) if t in self.stop_token_ids]
        if not ends:
            raise TemplateError("the chat template's assistant turn has no end-of-turn token")
        return turn[: ends[-1] + 1]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)


def probe_template(tokenizer: Any, tools: Sequence[dict[str, Any]] | None, *, template: Any = None,
                   template_kwargs: dict[str, Any] | None = None) -> list[str]:
    """Return how the template rewrites earlier turns as the conversation grows (empty if never).

    It renders conversations turn by turn and checks that each prompt (with the generation
    prompt, as the model sees it while generating), then that prompt with the reply the model
    wrote, is a prefix of the next prompt: assistant turns with plain text, with a ``<think>``
    block in the content and with ``reasoning_content``, each followed by tool results and by
    a new user message.
    """
    enc = ChatEncoder(tokenizer, tools, template=template, template_kwargs=template_kwargs)
    name = enc.tools[0]["function"]["name"] if enc.tools else "tool"
    problems = []
    cases: dict[str, dict[str, Any]] = {
        "plain assistant turns": {"content": "I will call the tool."},
        "reasoning blocks": {"content": "<think>\nreasoning\n</think>\n\nI will call the tool."},
        "reasoning_content": {"content": "I will call the tool.", "reasoning_content": "reasoning"},
    }
    for label, fields in cases.items():
        for follow in ("tool", "user"):
            turns: list[Message] = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
            seen = enc.encode(turns, add_generation_prompt=True)
            for k in range(2):
                reply = {"role": "assistant", **fields, "tool_calls": [_tool_call(name, {}, f"call_{k}")]}
                after = ({"role": "tool", "tool_call_id": f"call_{k}", "content": f"result {k}"} if follow == "tool"
                         else {"role": "user", "content": f"next {k}"})
                replied = enc.encode([*turns, reply], add_generation_prompt=False)
                turns = [*turns, reply, after]
                grown = enc.encode(turns, add_generation_prompt=True)
                if replied[: len(seen)] != seen or grown[: len(replied)] != replied:
                    where = "tool results follow" if follow == "tool" else "a new user message follows"
                    problems.append(f"the template rewrites earlier turns with {label} once {where}")
                    break
                seen = grown
    return problems
