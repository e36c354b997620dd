"""The shop a worker serves: catalog, prices, goals in upstream order, index sets, BM25 index.

One :class:`Shop` is loaded per environment and shared by its sessions (read-only after
loading; the search index is built on first use, in a worker thread, and cached on disk).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from agentrl_env_webshop.catalog import (
    CatalogError,
    human_goals,
    load_products,
    matches_upstream_order,
    normalize_instruction,
    product_prices,
    shuffle_goals,
    synthetic_goals,
)
from agentrl_env_webshop.config import WebShopConfig
from agentrl_env_webshop.data import bundled_file, bundled_manifest, default_cache_dir, locate_shipped
from agentrl_env_webshop.keywords import strip_price_clause
from agentrl_env_webshop.reward import SpacyNouns
from agentrl_env_webshop.search import TOP_N, SearchIndex, product_document

log = logging.getLogger(__name__)

STD = range(0, 200)  # AgentBench-FC webshop-std
TRAIN = range(1000, 12000)  # AgentBench-FC webshop-env_train


class Shop:
    def __init__(self, config: WebShopConfig, products: list[dict[str, Any]], goals: list[dict[str, Any]],
                 index_sets: dict[str, list[int]], kind: str, load_seconds: float = 0.0) -> None:
        self.config = config
        self.products = products
        self.by_asin = {p["asin"]: p for p in products}
        self.prices = product_prices(products, config.price_seed)
        self.goals = goals
        self.index_sets = index_sets
        self.kind = kind  # "bundled" or "real"
        self.load_seconds = load_seconds
        self.nouns = SpacyNouns(config.spacy_model)
        self._index: SearchIndex | None = None
        self._index_lock = threading.Lock()
        self._goal_queries: dict[str, list[str]] | None = None

    # -- loading ------------------------------------------------------------------------

    @classmethod
    def load(cls, config: WebShopConfig) -> Shop:
        started = time.perf_counter()
        shop = cls._load_real(config) if config.items_path else cls._load_bundled(config)
        shop.load_seconds = time.perf_counter() - started
        log.info("WebShop %s catalog: %d products, %d goals (%.1fs)", shop.kind, len(shop.products), len(shop.goals),
                 shop.load_seconds)
        return shop

    @classmethod
    def _load_bundled(cls, config: WebShopConfig) -> Shop:
        folder, manifest = bundled_manifest(config.data_dir)
        items, attributes, human = (bundled_file(name, folder, manifest) for name in (
            "items_shuffle_bundled.json.gz", "items_ins_v2_bundled.json.gz", "items_human_ins_bundled.json.gz"))
        products = load_products(items, attributes, human)
        goals = shuffle_goals(human_goals(products, product_prices(products, config.price_seed), config.price_seed))
        if len(goals) != manifest["goals"]:
            raise CatalogError(
                f"the bundled catalog in {folder} yields {len(goals)} goals, its manifest says {manifest['goals']}; "
                "reinstall agentrl-env-webshop."
            )
        sets = {name: list(range(lo, hi)) for name, (lo, hi) in manifest["splits"].items()}
        return cls(config, products, goals, sets, "bundled")

    @classmethod
    def _load_real(cls, config: WebShopConfig) -> Shop:
        human = config.human_instructions_path if config.goal_source == "human" else None
        products = load_products(config.items_path, config.attributes_path, human, num_products=config.num_products)
        prices = product_prices(products, config.price_seed)
        build = human_goals if config.goal_source == "human" else synthetic_goals
        goals = shuffle_goals(build(products, prices, config.price_seed))
        if not goals:
            raise CatalogError(f"the catalog {config.items_path} yields no goal; check human_instructions_path.")
        reference = json.loads(locate_shipped("human_goals.json", config.data_dir).read_text(encoding="utf-8"))
        if config.goal_source == "human" and matches_upstream_order(goals, reference):
            sets = {"std": list(STD)}
            train = [i for i in TRAIN if i < len(goals)]
            if train:
                sets["train"] = train
        else:
            log.info("the goals of %s are not AgentBench's (that needs the full catalog): serving them as 'all'",
                     config.items_path)
            sets = {"all": list(range(len(goals)))}
        return cls(config, products, goals, sets, "real")

    # -- search -------------------------------------------------------------------------

    def cache_dir(self) -> Path | None:
        value = self.config.index_cache_dir
        if value == "":
            return None
        return Path(value) if value else default_cache_dir()

    def index(self) -> SearchIndex:
        """The BM25 index, built (or loaded from the cache) on first use. Blocking."""
        if self._index is None:
            with self._index_lock:
                if self._index is None:
                    self._index = SearchIndex.build(
                        [p["asin"] for p in self.products], (product_document(p) for p in self.products), self.cache_dir()
                    )
                    log.info("WebShop BM25 index ready in %.2fs (cached: %s)", self._index.build_seconds,
                             self._index.loaded_from_cache)
        return self._index

    def search(self, query: str) -> list[str]:
        return self.index().search(query, TOP_N)

    def goal_queries(self, instruction: str) -> list[str]:
        """Human search queries recorded for an instruction (WebShop's goal_query_map)."""
        if self._goal_queries is None:
            try:
                path = locate_shipped("goal_query_map.json", self.config.data_dir)
                raw = json.loads(path.read_text(encoding="utf-8"))
                self._goal_queries = {normalize_instruction(k): list(v) for k, v in raw.items()}
            except Exception as exc:  # the oracle works without them
                log.warning("goal_query_map.json unavailable (%s); the oracle uses instruction keywords only", exc)
                self._goal_queries = {}
        return list(self._goal_queries.get(normalize_instruction(strip_price_clause(instruction)), []))
