"""The WebShop site as text: pages, clickables, transitions and the purchase, for one session.

This follows ``web_agent_site/envs/web_agent_text_env.py`` in its ``text`` observation mode
(what AgentBench-FC uses): each page is the visible text of upstream's HTML template joined
with ``" [SEP] "``, and the clickables are upstream's: the page's buttons (lower-cased),
the result ASINs (lower-cased) and, on an item page, the option values.

Pages: search (instruction and a search box) -> results (10 per page of the top 50, with
"< Prev"/"Next >") -> item (option groups, "Description", "Features", "Reviews", "Buy Now")
-> sub-pages. "Back to Search" returns to the search page from anywhere; "< Prev" goes one
page up. Upstream silently ignores an invalid action; here it gets an error line on top of
the unchanged page (docs/architecture.md section 4), and so does a search on a page without a search
box (upstream would run it; ``search_anywhere: true`` restores that).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from agentrl_env_webshop.reward import NounParser, get_reward

PRODUCT_WINDOW = 10
BUY_NOW = "Buy Now"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
BACK_TO_SEARCH = "Back to Search"
SUB_PAGES = ("Description", "Features", "Reviews", "Attributes")
SEP = " [SEP] "


@attrs.frozen
class Outcome:
    """What one action did: the page now shown and, after "Buy Now", the reward."""

    observation: str
    valid: bool = True
    done: bool = False
    reward: float = 0.0
    info: dict[str, Any] = attrs.field(factory=dict)
    error: str | None = None


class Site:
    """One shopper's browser on the shop. Methods are synchronous and CPU-bound."""

    def __init__(
        self,
        goal: Mapping[str, Any],
        products: Mapping[str, Mapping[str, Any]],
        prices: Mapping[str, float],
        search: Callable[[str], list[str]],
        *,
        nouns: NounParser | None = None,
        show_attrs: bool = False,
        search_anywhere: bool = False,
    ) -> None:
        self.goal = goal
        self.products = products
        self.prices = prices
        self._search = search
        self._nouns = nouns
        self.show_attrs = show_attrs
        self.search_anywhere = search_anywhere
        self.page = "search"  # search | results | item | Description | Features | Reviews | Attributes | done
        self.keywords: list[str] = []
        self.results: list[str] = []
        self.page_number = 1
        self.asin: str | None = None
        self.options: dict[str, str] = {}
        self.visited: list[str] = []
        self.counts = {"searches": 0, "clicks": 0, "pages_viewed": 0, "items_viewed": 0, "option_clicks": 0}

    # -- what the agent sees --------------------------------------------------------------

    @property
    def instruction(self) -> str:
        return self.goal["instruction_text"]

    def has_search_bar(self) -> bool:
        return self.page == "search"

    def clickables(self) -> dict[str, tuple[str, str | None]]:
        """Clickable value -> (kind, option group); in upstream's order (buttons, links, options)."""
        out: dict[str, tuple[str, str | None]] = {}
        if self.page == "search":
            out["search"] = ("search", None)
        elif self.page == "results":
            out[BACK_TO_SEARCH.lower()] = ("back", None)
            if self.page_number > 1:
                out[PREV_PAGE.lower()] = ("prev", None)
            out[NEXT_PAGE.lower()] = ("next", None)
            for asin in self._page_results():
                out[asin.lower()] = ("product", asin)
        elif self.page == "item":
            out[BACK_TO_SEARCH.lower()] = ("back", None)
            out[PREV_PAGE.lower()] = ("prev", None)
            subs = SUB_PAGES if self.show_attrs else SUB_PAGES[:3]
            for name in subs:
                out[name.lower()] = ("sub", name)
            out[BUY_NOW.lower()] = ("buy", None)
            for group, values in self._product()["options"].items():
                for value in values:
                    out[value] = ("option", group)  # a value shared by two groups: the last wins, as upstream
        elif self.page in SUB_PAGES:
            out[BACK_TO_SEARCH.lower()] = ("back", None)
            out[PREV_PAGE.lower()] = ("prev", None)
        return out

    def available_actions(self) -> dict[str, Any]:
        return {"has_search_bar": self.has_search_bar(), "clickables": list(self.clickables())}

    def observation(self) -> str:
        head = ["Instruction:", self.instruction]
        if self.page == "search":
            parts = ["WebShop", *head, "Search"]
        elif self.page == "results":
            parts = [*head, BACK_TO_SEARCH, f"Page {self.page_number} (Total results: {len(self.results)})"]
            if self.page_number > 1:
                parts.append(PREV_PAGE)
            parts.append(NEXT_PAGE)
            for asin in self._page_results():
                product = self.products[asin]
                parts += [asin, product["Title"], product["Price"]]
        elif self.page == "item":
            product = self._product()
            parts = [*head, BACK_TO_SEARCH, PREV_PAGE]
            for group, values in product["options"].items():
                parts += [group, *values]
            parts += [product["Title"], f"Price: {product['Price']}", f"Rating: {product['Rating']}"]
            parts += list(SUB_PAGES if self.show_attrs else SUB_PAGES[:3]) + [BUY_NOW]
        elif self.page in SUB_PAGES:
            parts = [*head, BACK_TO_SEARCH, PREV_PAGE, *self._sub_page_text(self.page)]
        else:
            parts = ["Thank you for shopping with us!"]
        return SEP.join(p.strip() for p in parts if p and p.strip())

    # -- actions ------------------------------------------------------------------------

    def search(self, keywords: str) -> Outcome:
        keywords = keywords.lower()
        if not keywords.strip():
            return self._invalid("the search keywords are empty; call search_action with some keywords")
        if self.page == "done":
            return self._invalid("the purchase is complete; there is nothing left to do")
        if not self.search_anywhere and not self.has_search_bar():
            return self._invalid("there is no search box on this page; click 'back to search' first")
        self.counts["searches"] += 1
        self.keywords = keywords.split(" ")
        self.results = self._search(" ".join(self.keywords))
        self._show_results(1)
        return Outcome(self.observation())

    def click(self, value: str) -> Outcome:
        value = value.lower()
        clickables = self.clickables()
        if value == "search" and self.page == "search":
            return self._invalid("'search' is the search button: call search_action with your keywords instead")
        if value not in clickables:
            return self._invalid(f"{value!r} is not a clickable value on this page; choose one of the clickables listed")
        self.counts["clicks"] += 1
        kind, arg = clickables[value]
        if kind == "back":
            self.page, self.keywords, self.results, self.asin, self.options = "search", [], [], None, {}
        elif kind == "next":
            self._show_results(self.page_number + 1)
        elif kind == "prev" and self.page == "results":
            self._show_results(self.page_number - 1)
        elif kind == "prev" and self.page == "item":
            self._show_results(self.page_number)
        elif kind == "prev":  # from a sub-page back to its item page
            self.page = "item"
        elif kind == "product":
            self.asin, self.page = arg, "item"
            self.visited.append(arg)
            self.counts["items_viewed"] += 1
        elif kind == "option":
            self.options[arg] = value
            self.counts["option_clicks"] += 1
        elif kind == "sub":
            self.page = arg
        elif kind == "buy":
            return self._buy()
        self.counts["pages_viewed"] += 1
        return Outcome(self.observation())

    # -- internals ------------------------------------------------------------------------

    def _show_results(self, page_number: int) -> None:
        # Upstream resets the chosen item and its options whenever results are shown.
        self.page, self.page_number, self.asin, self.options = "results", page_number, None, {}

    def _page_results(self) -> list[str]:
        start = (self.page_number - 1) * PRODUCT_WINDOW
        return self.results[start:start + PRODUCT_WINDOW]

    def _product(self) -> Mapping[str, Any]:
        assert self.asin is not None
        return self.products[self.asin]

    def _sub_page_text(self, name: str) -> list[str]:
        product = self._product()
        if name == "Description":
            return [product["Description"]]
        if name == "Features":
            return list(product["BulletPoints"])
        if name == "Reviews":
            out = []
            for review in product["Reviews"]:
                out += [f'"{review.get("title", "")}"', str(review.get("score", "")), review.get("body", "")]
            return out
        return [*product["Attributes"], product["category"], product["query"], product["product_category"]]

    def _invalid(self, reason: str) -> Outcome:
        return Outcome(self.observation(), valid=False, error=reason)

    def _buy(self) -> Outcome:
        product = self._product()
        reward, info = get_reward(product, self.goal, price=self.prices[self.asin], options=self.options, nouns=self._nouns)
        info["purchased_target"] = self.asin == self.goal["asin"]
        self.page = "done"
        text = SEP.join(["Thank you for shopping with us!", "Your score (min 0.0, max 1.0)", f"{reward}"])
        return Outcome(text, done=True, reward=reward, info=info)
