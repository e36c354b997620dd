"""The scripted shopper: search for the target, open it, select the goal's options, buy.

It reads only what a model reads (the observation and the clickables in the last message)
and knows the goal (target ASIN and options). Queries, in order: the instruction's
keywords, the human queries WebShop recorded for the instruction (real catalog), then the
target's title. It pages through all five result pages before trying the next query.

With ``error_rate`` > 0 it errs on purpose at each decision with that probability: opens and
buys another product from the page, selects a wrong value of an option group, or buys
before selecting the options. Every such episode still ends within the round limit.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl_core.env import assistant_tool_call
from agentrl_core.types import Message
from agentrl_env_webshop.keywords import instruction_keywords

_ACTIONS_MARK = "Available Actions:\n"


def parse_available_actions(content: str) -> dict[str, Any] | None:
    """The ``{'has_search_bar': ..., 'clickables': [...]}`` dict at the end of an observation."""
    at = content.rfind(_ACTIONS_MARK)
    if at < 0:
        return None
    try:
        value = ast.literal_eval(content[at + len(_ACTIONS_MARK):].strip())
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, dict) else None


class WebShopOracle:
    def __init__(self, goal: Mapping[str, Any], product: Mapping[str, Any], queries: Sequence[str], *,
                 error_rate: float = 0.0, seed: int = 0) -> None:
        self.goal = goal
        self.product = product
        self.target = goal["asin"].lower()
        self.queries = [q for q in dict.fromkeys(q.strip() for q in queries) if q]
        self.error_rate = error_rate
        self.rng = random.Random(seed)
        self.query_number = -1
        self.pages_seen = 0
        self.opened: str | None = None
        self.pending_options: list[str] | None = None
        self.calls = 0

    def _err(self) -> bool:
        return self.error_rate > 0 and self.rng.random() < self.error_rate

    def _call(self, name: str, argument: str, thought: str) -> Message:
        self.calls += 1
        key = "keywords" if name == "search_action" else "value"
        return assistant_tool_call(name, {key: argument}, call_id=f"call_{self.calls}", content=thought)

    def act(self, messages: Sequence[Message]) -> Message:
        actions = None
        for message in reversed(messages):
            if message.get("role") in ("tool", "user"):
                actions = parse_available_actions(str(message.get("content") or ""))
                break
        if actions is None:
            return self._call("click_action", "back to search", "I lost track of the page; I will go back to search.")
        clickables = list(actions.get("clickables", []))
        if actions.get("has_search_bar"):
            return self._search()
        if "buy now" in clickables:
            return self._on_item(clickables)
        if "next >" in clickables:
            return self._on_results(clickables)
        return self._call("click_action", "< prev", "This page has what I need to know; back to the product.")

    def _search(self) -> Message:
        self.query_number += 1
        self.pages_seen = 0
        query = self.queries[min(self.query_number, len(self.queries) - 1)]
        return self._call("search_action", query, f"I will search for the product: {query}")

    def _on_results(self, clickables: list[str]) -> Message:
        products = [c for c in clickables if c not in ("back to search", "< prev", "next >")]
        self.pages_seen += 1
        if self.target in products and not self._err():
            self.opened = self.target
            return self._call("click_action", self.target, f"{self.target.upper()} matches the instruction; I will open it.")
        if products and (self.error_rate > 0 and self.rng.random() < self.error_rate):
            self.opened = self.rng.choice(products)
            return self._call("click_action", self.opened, f"{self.opened.upper()} looks right; I will open it.")
        if products and self.pages_seen < 5:
            return self._call("click_action", "next >", "The product is not on this page; I will look at the next one.")
        if self.query_number + 1 < len(self.queries):
            return self._call("click_action", "back to search", "Not found with these keywords; I will search again.")
        if products:  # out of queries: settle for the first result
            self.opened = products[0]
            return self._call("click_action", products[0], f"I will take {products[0].upper()}.")
        return self._call("click_action", "back to search", "No results; I will search again.")

    def _on_item(self, clickables: list[str]) -> Message:
        if self.pending_options is None:
            self.pending_options = self._choose_options(clickables)
        if self.pending_options and not (self.error_rate > 0 and self.rng.random() < self.error_rate / 2):
            value = self.pending_options.pop(0)
            return self._call("click_action", value, f"The instruction asks for '{value}'; I will select it.")
        self.pending_options = None
        return self._call("click_action", "buy now", "Everything asked for is selected; I will buy it.")

    def _choose_options(self, clickables: list[str]) -> list[str]:
        wanted = self.goal["goal_options"]
        values = list(wanted.values()) if isinstance(wanted, Mapping) else list(wanted)
        options = {v for vs in self.product["options"].values() for v in vs} if self.opened == self.target else set()
        available = [c for c in clickables if c in options] or [
            c for c in clickables if c not in ("back to search", "< prev", "description", "features", "reviews",
                                               "attributes", "buy now")]
        chosen = []
        for value in values:
            pick = _closest(str(value).lower(), available)
            if pick is None:
                continue
            if self._err():
                group = next((vs for vs in self.product["options"].values() if pick in vs), available)
                others = [v for v in group if v != pick]
                pick = self.rng.choice(others) if others else pick
            chosen.append(pick)
        return chosen


def _closest(value: str, candidates: list[str]) -> str | None:
    if value in candidates:
        return value
    if not candidates:
        return None
    from thefuzz import fuzz

    best = max(candidates, key=lambda c: fuzz.token_set_ratio(c, value))
    return best if fuzz.token_set_ratio(best, value) > 85 else None


def oracle_queries(goal: Mapping[str, Any], product: Mapping[str, Any], recorded: Sequence[str] = ()) -> list[str]:
    return [instruction_keywords(goal["instruction_text"]), *recorded, product["Title"].lower()]
