"""WebShop's reward against hand-computed values, on products loaded from the real file format.

reward = (attribute matches + option matches + [price <= bound]) / (attrs + options + 1) * r_type
"""

from __future__ import annotations

import pytest
from agentrl_env_webshop.catalog import load_products
from agentrl_env_webshop.reward import default_nouns, get_option_reward, get_reward, get_type_reward


def nouns_by_table(table):
    """A labelled test double for the tagger: fixed noun lists, so type scores are hand-computable."""
    return lambda text: table[text]


@pytest.fixture
def towel(product_record):
    items = [product_record(
        "B000TOWEL1", "Cotton Bath Towel Set, Quick Drying", pricing="$24.99",
        options={"Color": [{"value": "Navy/Blue"}, {"value": "Grey"}], "Size": [{"value": "Small"}, {"value": "X-Large"}]},
        description="Thick towels. Machine wash cold.", bullets=["Super soft", "Made in Portugal"],
    )]
    attributes = {"B000TOWEL1": {"attributes": ["quick drying", "cotton", "machine wash"]}}
    return load_products(items, attributes)[0]


def goal_for(product, *, attributes, options, price_upper=30.0):
    return {"asin": product["asin"], "query": product["query"], "product_category": product["product_category"],
            "name": product["name"], "attributes": attributes, "goal_options": options, "price_upper": price_upper,
            "instruction_text": "..."}


SAME = nouns_by_table({"Cotton Bath Towel Set, Quick Drying": ["cotton", "bath", "towel", "set"]})


def test_full_match_is_one(towel):
    goal = goal_for(towel, attributes=["quick drying", "cotton"], options=["grey", "x-large"])
    reward, info = get_reward(towel, goal, 24.99, {"color": "grey", "size": "x-large"}, nouns=SAME)
    assert reward == 1.0
    assert (info["r_att"], info["r_option"], info["r_price"], info["r_type"]) == (1.0, 1.0, True, 1.0)
    assert info["w_att"] == 2 / 5 and info["w_option"] == 2 / 5 and info["w_price"] == 1 / 5


def test_partial_attribute_match(towel):
    # "quick drying" is an attribute, "super soft" only a bullet point (substring match),
    # "waterproof" nowhere: 2 of 3 attributes + 0 options + price = 3 / 4.
    goal = goal_for(towel, attributes=["quick drying", "super soft", "waterproof"], options=[])
    reward, info = get_reward(towel, goal, 24.99, {}, nouns=SAME)
    assert info["attribute_matches"] == 2 and info["r_att"] == pytest.approx(2 / 3)
    assert "r_option" not in info
    assert reward == pytest.approx(3 / 4)


def test_wrong_option(towel):
    # one attribute, two options of which "navy | blue" is wrong: (1 + 1 + 1) / (1 + 2 + 1)
    goal = goal_for(towel, attributes=["cotton"], options=["grey", "small"])
    reward, info = get_reward(towel, goal, 24.99, {"color": "navy | blue", "size": "small"}, nouns=SAME)
    assert info["option_matches"] == 1 and info["r_option"] == 0.5
    assert reward == pytest.approx(3 / 4)


def test_over_price(towel):
    # everything right but the price: (2 + 1 + 0) / 4
    goal = goal_for(towel, attributes=["cotton", "quick drying"], options=["grey"], price_upper=20.0)
    reward, info = get_reward(towel, goal, 24.99, {"color": "grey"}, nouns=SAME)
    assert info["r_price"] is False
    assert reward == pytest.approx(3 / 4)
    # the bound is inclusive
    assert get_reward(towel, goal, 20.0, {"color": "grey"}, nouns=SAME)[0] == 1.0


def test_type_mismatch_scales_the_reward(towel):
    lamp_goal = goal_for(towel, attributes=["cotton"], options=[])
    lamp_goal.update(query="lamps", product_category="Tools & Home Improvement › Lighting › Lamps",
                     name="Brass Desk Lamp")
    # no query, category (only "Home" is not shared) or noun overlap: r_type 0, reward 0
    nouns = nouns_by_table({"Cotton Bath Towel Set, Quick Drying": ["cotton", "bath", "towel", "set"],
                            "Brass Desk Lamp": ["brass", "desk", "lamp"]})
    reward, info = get_reward(towel, lamp_goal, 24.99, {}, nouns=nouns)
    assert (info["r_type"], info["title_score"], reward) == (0.0, 0.0, 0.0)
    # one noun of seven shared (1/7 = 0.143: at least 0.1, at most 0.2, nothing else): r_type 0.5
    nouns = nouns_by_table({"Cotton Bath Towel Set, Quick Drying": ["cotton", "bath", "towel", "set"],
                            "Brass Desk Lamp": ["brass", "desk", "lamp", "bath", "a", "b", "c"]})
    reward, info = get_reward(towel, lamp_goal, 24.99, {}, nouns=nouns)
    assert info["r_type"] == 0.5 and reward == pytest.approx(0.5 * (1 + 1) / 2)
    # under 10 % of the nouns: 0.1
    nouns = nouns_by_table({"Cotton Bath Towel Set, Quick Drying": ["bath"],
                            "Brass Desk Lamp": ["bath"] + [f"n{i}" for i in range(10)]})
    assert get_type_reward(towel, lamp_goal, nouns)["r_type"] == 0.1
    # the same query rescues a weak title match
    lamp_goal["query"] = towel["query"]
    nouns = nouns_by_table({"Cotton Bath Towel Set, Quick Drying": ["bath"],
                            "Brass Desk Lamp": ["bath", "desk", "lamp", "brass", "x"]})
    assert get_type_reward(towel, lamp_goal, nouns)["r_type"] == 1.0
    # a goal name without nouns scores 0.2, as upstream
    assert get_type_reward(towel, {**lamp_goal, "name": "x"}, nouns_by_table({"x": [], towel["name"]: ["a"]}))["title_score"] == 0.2


def test_fuzzy_threshold_edge():
    # thefuzz token_set_ratio: 86 matches, 85 does not (the threshold is "> 85")
    from thefuzz import fuzz

    assert fuzz.token_set_ratio("machine wash", "machine washable") == 86
    assert fuzz.token_set_ratio("1 feet (2 pack)", "3 feet (4 pack)") == 85
    assert get_option_reward(["1 feet (2 pack)"], ["3 feet (4 pack)"]) == (0.0, 0)
    assert get_option_reward(["#01-wine"], ["#03-wine"]) == (1.0, 1)  # 86: a different shade still matches
    # colours are normalized first (first listed colour contained): "navy blue" and "light blue"
    # both become "blue" and match; "heather blue" becomes "blue", "heather grey" "grey"
    assert get_option_reward(["navy blue"], ["light blue"]) == (1.0, 1)
    assert get_option_reward(["heather blue"], ["heather grey"]) == (0.0, 0)


def test_attribute_fuzzy_edge(towel):
    goal = goal_for(towel, attributes=["machine washable"], options=[])
    reward, info = get_reward(towel, goal, 24.99, {}, nouns=SAME)  # "machine wash" scores 86
    assert info["attribute_matches"] == 1 and reward == 1.0


def test_spacy_nouns_on_upstream_examples():
    """The tagger's part: upstream's own test pairs, with en_core_web_sm 3.8.

    Upstream's test expects title scores 0.333, 0.3 and 0.15 (computed with an older model);
    the shipped model gives 0.4, 0.3125 and 0.1667: the same r_type buckets (1, 1, 0.5, 0).
    """
    nouns = default_nouns()
    goal = {"query": "q1", "product_category": "a › b › c"}
    bought = {"query": "q2", "product_category": "d › e › f"}
    pairs = [
        ("Mens D.O.N. Issue 2 Gca Basketball Sneakers Shoes Casual - Off White",
         "PEAK High Top Mens Basketball Shoes Lou Williams Streetball Master Breathable Non Slip Outdoor Sneakers",
         0.4, 1.0),
        ("Saireed UL Listed 2 Prong Power Cord for JBL Bar 3.1 Bar 2.1 Channel 4K Ultra HD Soundbar",
         "BRST AC Power Cord Outlet Socket Cable Plug Lead for Panasonic SC-HT830V DVD/VCR Combo Home Theater System",
         2 / 12, 0.5),
        ("Rusticware 921ORB Kitchen and Bath Cabinet Knob",
         "Minkissy 2pcs Stainless Steel Eyebrow Tweezers Blackhead Acne Remover Portable Makeup Tweezers (Silver)",
         0.0, 0.0),
    ]
    for desired, purchased, title_score, r_type in pairs:
        info = get_type_reward({**bought, "name": purchased}, {**goal, "name": desired}, nouns)
        assert info["title_score"] == pytest.approx(title_score)
        assert info["r_type"] == r_type
    assert nouns("Rusticware 921ORB Kitchen and Bath Cabinet Knob") == ("rusticware", "921orb", "kitchen", "bath", "cabinet", "knob")
