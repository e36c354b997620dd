"""Load WebShop catalogs in the real file formats and build goals from them.

Three files make a catalog, as in WebShop's ``data/`` folder:

* ``items_shuffle*.json``: a list of products (``asin``, ``name``, ``full_description``,
  ``small_description``, ``pricing``, ``customization_options``, ``category``, ``query``,
  ``product_category``, ``images``, ...);
* ``items_ins_v2*.json``: ``{asin: {"attributes": [...], "instruction": ...,
  "instruction_attributes": [...]}}``;
* ``items_human_ins.json``: ``{asin: [{"instruction", "instruction_attributes",
  "instruction_options", ...}]}``, the human goals.

:func:`load_products` turns them into product records with upstream's derived fields
(``Title``, ``Description``, ``BulletPoints``, ``Price``, ``pricing``, ``options``,
``Attributes``, ...); :func:`human_goals` and :func:`synthetic_goals` build goals exactly
as ``web_agent_site/engine/goal.py`` does, then :func:`shuffle_goals` orders them as
upstream's server does (``random.seed(233); random.shuffle(goals)``), so goal *i* is
upstream's goal *i*.

The one deliberate difference: upstream draws each ranged price and each goal's price bound
from the unseeded global RNG, so they change at every server start. Here they come from
RNGs seeded by ``(price_seed, asin)`` and ``(price_seed, asin, instruction number)``.
"""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import os
import random
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from agentrl_core.errors import EnvError

log = logging.getLogger(__name__)

PRICE_RANGE = [10.0 * i for i in range(1, 100)]
NO_PRICE_BOUND = 1000000
GOAL_SHUFFLE_SEED = 233


class CatalogError(EnvError):
    """A catalog file is missing or not in the WebShop format."""


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file (``.gz`` transparently), failing with one clear sentence."""
    path = Path(path)
    if not path.exists():
        raise CatalogError(f"WebShop data file {path} does not exist; check the path in environments.webshop.")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, OSError, UnicodeDecodeError) as exc:
        raise CatalogError(f"WebShop data file {path} is not valid JSON ({exc}).") from None


def parse_pricing(pricing: Any) -> tuple[list[float], str]:
    """Upstream's price parsing: ``"$12.99"`` -> ([12.99], "$12.99"); a range keeps two ends."""
    if not pricing:
        return [100.0], "$100.0"
    values = []
    for part in str(pricing).split("$")[1:]:
        digits = re.sub(r"[^\d.]", "", part)
        try:
            values.append(float(Decimal(digits)))
        except InvalidOperation:
            raise CatalogError(f"cannot read the price {pricing!r}") from None
    if not values:
        raise CatalogError(f"cannot read the price {pricing!r}: no '$' amount in it")
    if len(values) == 1:
        return values, f"${values[0]}"
    return values[:2], f"${values[0]} to ${values[1]}"


def parse_options(customization_options: Any) -> dict[str, list[str]]:
    """``{"Color": [{"value": "Navy/Blue", ...}]}`` -> ``{"color": ["navy | blue"]}`` (upstream)."""
    options: dict[str, list[str]] = {}
    if not customization_options:
        return options
    for name, contents in customization_options.items():
        if contents is None:
            continue
        options[name.lower()] = [str(c["value"]).strip().replace("/", " | ").lower() for c in contents]
    return options


_REQUIRED_KEYS = ("asin", "name", "full_description", "small_description", "pricing", "customization_options",
                  "category", "query", "product_category")


def load_products(
    items: str | os.PathLike | list[dict[str, Any]],
    attributes: str | os.PathLike | Mapping[str, Any],
    human_instructions: str | os.PathLike | Mapping[str, Any] | None = None,
    *,
    num_products: int | None = None,
) -> list[dict[str, Any]]:
    """Product records as upstream's ``load_products`` makes them (duplicates and bad ASINs skipped)."""
    raw = read_json(items) if not isinstance(items, list) else items
    if not isinstance(raw, list):
        raise CatalogError(f"{items}: the items file must hold a JSON list of products (items_shuffle format).")
    attrs_map = read_json(attributes) if not isinstance(attributes, Mapping) else attributes
    human = None
    if human_instructions is not None:
        human = read_json(human_instructions) if not isinstance(human_instructions, Mapping) else human_instructions
    if num_products is not None:
        raw = raw[:num_products]
    seen: set[str] = set()
    products = []
    for position, p in enumerate(raw):
        missing = [k for k in _REQUIRED_KEYS if k not in p]
        if missing:
            raise CatalogError(f"{items}: product #{position} lacks {', '.join(missing)} (items_shuffle format expected).")
        asin = p["asin"]
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        pricing, price_tag = parse_pricing(p.get("pricing"))
        bullets = p["small_description"] if isinstance(p["small_description"], list) else [p["small_description"]]
        images = p.get("images") or [""]
        record = {
            "asin": asin,
            "name": p["name"],
            "category": p["category"],
            "query": p["query"].lower().strip(),
            "product_category": p["product_category"],
            "Title": p["name"],
            "Description": p["full_description"],
            "BulletPoints": bullets,
            "Reviews": [],  # upstream's reviews file is not loaded either (commented out there)
            "Rating": "N.A.",
            "pricing": pricing,
            "Price": price_tag,
            "options": parse_options(p["customization_options"]),
            "MainImage": images[0],
        }
        entry = attrs_map.get(asin)
        record["Attributes"] = entry["attributes"] if entry and "attributes" in entry else ["DUMMY_ATTR"]
        if entry:
            record["instruction_text"] = entry.get("instruction")
            record["instruction_attributes"] = entry.get("instruction_attributes")
        if human is not None and asin in human:
            record["instructions"] = human[asin]
        products.append(record)
    if not products:
        raise CatalogError(f"{items}: no usable product in the catalog.")
    return products


def product_prices(products: Iterable[Mapping[str, Any]], seed: int = 0) -> dict[str, float]:
    """One price per product: the listed price, or a draw inside a price range (seeded)."""
    prices = {}
    for p in products:
        pricing = p["pricing"]
        if len(pricing) == 1:
            prices[p["asin"]] = pricing[0]
        else:
            prices[p["asin"]] = random.Random(f"{seed}/price/{p['asin']}").uniform(*pricing[:2])
    return prices


def price_bound(price: float, rng: random.Random) -> tuple[float, str]:
    """Upstream's price clause: the larger of two of the four round tens above the price."""
    candidates = [p for p in PRICE_RANGE if p > price][:4]
    if len(candidates) >= 2:
        _, upper = sorted(rng.sample(candidates, 2))
        return upper, f", and price lower than {upper:.2f} dollars"
    return NO_PRICE_BOUND, ""


def human_goals(products: Iterable[Mapping[str, Any]], prices: Mapping[str, float], seed: int = 0) -> list[dict[str, Any]]:
    """Goals from the human instructions, in catalog order (``get_human_goals``)."""
    goals = []
    skipped = 0
    for item in products:
        asin = item["asin"]
        for number, instruction in enumerate(item.get("instructions") or ()):
            attributes = instruction["instruction_attributes"]
            if len(attributes) == 0:
                skipped += 1
                continue
            upper, price_text = price_bound(prices[asin], random.Random(f"{seed}/goal/{asin}/{number}"))
            goals.append({
                "asin": asin,
                "category": item["category"],
                "query": item["query"],
                "name": item["name"],
                "product_category": item["product_category"],
                "instruction_text": instruction["instruction"].strip(".") + price_text,
                "attributes": attributes,
                "price_upper": upper,
                "goal_options": instruction["instruction_options"],
                "weight": 1,
            })
    log.info("built %d human goals (%d instructions without attributes skipped)", len(goals), skipped)
    return goals


def synthetic_goals(products: Iterable[Mapping[str, Any]], prices: Mapping[str, float], seed: int = 0) -> list[dict[str, Any]]:
    """Goals from ``items_ins_v2`` instructions, one per option combination (``get_synthetic_goals``)."""
    goals = []
    counts: dict[str, int] = defaultdict(int)
    for product in products:
        if product.get("instruction_text") is None:
            continue
        asin = product["asin"]
        attributes = product.get("instruction_attributes") or []
        if not attributes:
            raise CatalogError(f"product {asin} has a synthetic instruction but no instruction_attributes.")
        upper, price_text = price_bound(prices[asin], random.Random(f"{seed}/goal/{asin}/synthetic"))
        options = product["options"]
        names = sorted(options)
        for combination in itertools.product(*(options[n] for n in names)):
            goal_options = dict(zip(names, combination, strict=True))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = " with " + option_text if option_text else ""
            goals.append({
                "asin": asin,
                "category": product["category"],
                "query": product["query"],
                "name": product["Title"],
                "product_category": product["product_category"],
                "instruction_text": f"{product['instruction_text']}{option_text}{price_text}",
                "attributes": attributes,
                "price_upper": upper,
                "goal_options": goal_options,
            })
            for att in attributes:
                counts[att] += 1
    for goal in goals:
        goal["weight"] = sum(1.0 / counts[a] for a in goal["attributes"]) / len(goal["attributes"])
    return goals


def shuffle_goals(goals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Upstream's goal order: ``random.seed(233); random.shuffle(goals)``."""
    goals = list(goals)
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    return goals


def normalize_instruction(text: str) -> str:
    """Lower case, letters and digits only: how transcripts and ``human_goals.json`` compare."""
    return re.sub(r"[^a-z0-9]", "", text.lower())


def matches_upstream_order(goals: list[Mapping[str, Any]], reference: list[str], n: int = 200) -> bool:
    """Whether the first ``n`` goals are upstream's (AgentBench ``std`` needs the full catalog)."""
    if len(goals) < n or len(reference) < n:
        return False
    for goal, instruction in zip(goals[:n], reference[:n], strict=True):
        text = goal["instruction_text"]
        cut = text.rfind(", and price lower than ")
        if cut >= 0:
            text = text[:cut]
        if normalize_instruction(text) != normalize_instruction(instruction):
            return False
    return True
