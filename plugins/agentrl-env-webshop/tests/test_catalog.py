"""Loaders for the real WebShop file formats, goal building and upstream's goal order."""

from __future__ import annotations

import json
import random

import anyio
import pytest
from agentrl_env_webshop.catalog import (
    CatalogError,
    human_goals,
    load_products,
    matches_upstream_order,
    parse_pricing,
    price_bound,
    product_prices,
    shuffle_goals,
    synthetic_goals,
)
from agentrl_env_webshop.config import WebShopConfig
from agentrl_env_webshop.env import WebShopEnvironment

from agentrl_core.env import play_episode


def test_loader_reads_the_real_formats(tiny_catalog):
    products = load_products(tiny_catalog["items"], tiny_catalog["attributes"], tiny_catalog["human"])
    assert [p["asin"] for p in products] == ["B000TOWEL1", "B000TOWEL2", "B000SNACK1", "B000LAMP01"]
    towel, towel2, snack, lamp = products
    # upstream's derived fields
    assert towel["Title"] == "Cotton Bath Towel Set, Quick Drying"
    assert towel["options"] == {"color": ["navy | blue", "grey"], "size": ["small", "x-large"]}  # "Style": None dropped
    assert (towel["pricing"], towel["Price"]) == ([24.99], "$24.99")
    assert (towel2["pricing"], towel2["Price"]) == ([12.49, 18.99], "$12.49 to $18.99")
    assert (lamp["pricing"], lamp["Price"]) == ([100.0], "$100.0")  # empty price
    assert towel["Attributes"] == ["quick drying", "cotton"] and lamp["Attributes"] == ["DUMMY_ATTR"]
    assert towel["BulletPoints"] == ["Soft and absorbent"] and towel["Rating"] == "N.A." and towel["Reviews"] == []
    assert len(towel["instructions"]) == 2 and "instructions" not in towel2
    assert snack["query"] == "snacks" and towel["instruction_text"] == "i want a quick drying towel"


def test_num_products_and_bad_files(tiny_catalog, tmp_path):
    assert len(load_products(tiny_catalog["items"], tiny_catalog["attributes"], num_products=2)) == 2
    bad = tmp_path / "items.json"
    bad.write_text(json.dumps([{"asin": "B1", "name": "x"}]))
    with pytest.raises(CatalogError, match="lacks full_description"):
        load_products(bad, tiny_catalog["attributes"])
    bad.write_text("{not json")
    with pytest.raises(CatalogError, match="not valid JSON"):
        load_products(bad, tiny_catalog["attributes"])
    with pytest.raises(CatalogError, match="does not exist"):
        load_products(tmp_path / "missing.json", tiny_catalog["attributes"])


def test_pricing_parse():
    assert parse_pricing("$1,299.99") == ([1299.99], "$1299.99")
    assert parse_pricing("$86.00") == ([86.0], "$86.0")  # upstream prints the float
    assert parse_pricing("$10.41 - $15.85 - $20.00") == ([10.41, 15.85], "$10.41 to $15.85")
    with pytest.raises(CatalogError):
        parse_pricing("ten dollars")


def test_price_bounds_are_reproducible_and_upstream_shaped():
    # 24.99 -> the four tens above are 30, 40, 50, 60; the bound is the larger of two drawn
    bounds = {price_bound(24.99, random.Random(s))[0] for s in range(200)}
    assert bounds == {40.0, 50.0, 60.0}
    assert price_bound(24.99, random.Random(7)) == price_bound(24.99, random.Random(7))
    upper, text = price_bound(24.99, random.Random(7))
    assert text == f", and price lower than {upper:.2f} dollars"
    assert price_bound(985.0, random.Random(0)) == (1000000, "")  # one ten left: no price clause


def test_human_goals_as_upstream(tiny_catalog):
    products = load_products(tiny_catalog["items"], tiny_catalog["attributes"], tiny_catalog["human"])
    prices = product_prices(products, seed=3)
    assert 12.49 <= prices["B000TOWEL2"] <= 18.99 and prices["B000LAMP01"] == 100.0
    assert prices == product_prices(products, seed=3) and prices != product_prices(products, seed=4)
    goals = human_goals(products, prices, seed=3)
    assert [g["asin"] for g in goals] == ["B000TOWEL1", "B000SNACK1", "B000LAMP01"]  # no-attribute one skipped
    towel = goals[0]
    assert towel["instruction_text"].startswith("i need a quick drying cotton towel in grey, and price lower than ")
    assert towel["goal_options"] == ["grey", "x-large"] and towel["weight"] == 1
    assert towel["price_upper"] in (40.0, 50.0, 60.0)
    assert human_goals(products, prices, seed=3) == goals  # reproducible
    # upstream's order: random.seed(233); random.shuffle(goals)
    expected = list(goals)
    random.seed(233)
    random.shuffle(expected)
    assert shuffle_goals(goals) == expected


def test_synthetic_goals_one_per_option_combination(tiny_catalog):
    products = load_products(tiny_catalog["items"], tiny_catalog["attributes"])
    goals = synthetic_goals(products, product_prices(products))
    assert len(goals) == 4  # 2 colours x 2 sizes of the one product with an instruction
    assert goals[0]["goal_options"] == {"color": "navy | blue", "size": "small"}
    assert " with color: navy | blue, and size: small" in goals[0]["instruction_text"]
    assert goals[0]["weight"] == pytest.approx(1 / 4)


def test_std_needs_upstream_goal_order():
    goals = [{"instruction_text": f"i'm looking for item {i}, and price lower than 30.00 dollars"} for i in range(200)]
    reference = [f"im looking for item {i}" for i in range(200)]
    assert matches_upstream_order(goals, reference)
    assert not matches_upstream_order(goals, reference[1:] + reference[:1])
    assert not matches_upstream_order(goals[:10], reference)


def test_environment_on_a_real_format_catalog(tiny_catalog, tmp_path):
    config = WebShopConfig(items_path=str(tiny_catalog["items"]), attributes_path=str(tiny_catalog["attributes"]),
                           human_instructions_path=str(tiny_catalog["human"]), index_cache_dir=str(tmp_path / "c"))
    env = WebShopEnvironment(config)
    assert env.index_sets() == {"all": [0, 1, 2]}  # not AgentBench's goals: no std/train

    async def main():
        rewards = []
        for i in range(3):
            episode = await play_episode(env, "all", i, env.oracle("all", i))
            rewards.append(episode.reward)
        await env.aclose()
        return rewards

    assert anyio.run(main) == [1.0, 1.0, 1.0]


def test_std_appears_when_the_goals_are_agentbenchs(tmp_path, product_record):
    """A catalog whose shuffled goals are human_goals.json's first 250 serves ``std`` (0-199)."""
    from agentrl_env_webshop.data import locate_shipped


    reference = json.loads(locate_shipped("human_goals.json").read_text())[:250]
    order = list(range(250))
    random.Random(233).shuffle(order)  # shuffled[i] = goals[order[i]]
    instructions = [""] * 250
    for i, k in enumerate(order):
        instructions[k] = reference[i]
    items = [product_record(f"B{k:09d}", f"Product {k}") for k in range(250)]
    attrs = {f"B{k:09d}": {"attributes": ["a"]} for k in range(250)}
    human = {f"B{k:09d}": [{"instruction": instructions[k], "instruction_attributes": ["a"], "instruction_options": []}]
             for k in range(250)}
    for name, data in (("items.json", items), ("ins.json", attrs), ("human.json", human)):
        (tmp_path / name).write_text(json.dumps(data))
    env = WebShopEnvironment(WebShopConfig(items_path=str(tmp_path / "items.json"), attributes_path=str(tmp_path / "ins.json"),
                                           human_instructions_path=str(tmp_path / "human.json"), index_cache_dir=""))
    assert env.index_sets() == {"std": list(range(200))}  # train (1000-11999) needs the full catalog's 12,087 goals
    assert env.goal("std", 5)["instruction_text"].startswith(reference[5])
