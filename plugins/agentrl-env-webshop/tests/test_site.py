"""Pages, clickables and transitions of the text site, and the session's messages."""

from __future__ import annotations

import anyio
import pytest
from agentrl_env_webshop.catalog import load_products, product_prices
from agentrl_env_webshop.search import SearchIndex, product_document
from agentrl_env_webshop.site import Site

from agentrl_core.env import assistant_tool_call
from agentrl_core.errors import SessionError


@pytest.fixture
def site(tiny_catalog):
    products = load_products(tiny_catalog["items"], tiny_catalog["attributes"])
    index = SearchIndex.build([p["asin"] for p in products], [product_document(p) for p in products])
    goal = {"asin": "B000TOWEL1", "instruction_text": "i need a grey towel", "query": "towels",
            "product_category": products[0]["product_category"], "name": products[0]["name"],
            "attributes": ["cotton"], "goal_options": ["grey"], "price_upper": 30.0}
    by_asin = {p["asin"]: p for p in products}
    return Site(goal, by_asin, product_prices(products), index.search)


def test_search_page(site):
    assert site.observation() == "WebShop [SEP] Instruction: [SEP] i need a grey towel [SEP] Search"
    assert site.available_actions() == {"has_search_bar": True, "clickables": ["search"]}
    assert str(site.available_actions()) == "{'has_search_bar': True, 'clickables': ['search']}"


def test_results_item_and_sub_pages(site):
    out = site.search("Bath TOWEL")
    assert out.valid and site.keywords == ["bath", "towel"]
    assert out.observation.startswith(
        "Instruction: [SEP] i need a grey towel [SEP] Back to Search [SEP] Page 1 (Total results: 2) [SEP] Next > [SEP] "
    )
    assert "B000TOWEL1 [SEP] Cotton Bath Towel Set, Quick Drying [SEP] $24.99" in out.observation
    assert "$12.49 to $18.99" in out.observation
    assert site.available_actions()["clickables"][:2] == ["back to search", "next >"]
    assert set(site.available_actions()["clickables"][2:]) == {"b000towel1", "b000towel2"}

    out = site.click("B000TOWEL1")  # upstream lower-cases the value
    assert out.observation == (
        "Instruction: [SEP] i need a grey towel [SEP] Back to Search [SEP] < Prev [SEP] color [SEP] navy | blue [SEP] grey "
        "[SEP] size [SEP] small [SEP] x-large [SEP] Cotton Bath Towel Set, Quick Drying [SEP] Price: $24.99 [SEP] "
        "Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now"
    )
    assert site.available_actions() == {"has_search_bar": False, "clickables": [
        "back to search", "< prev", "description", "features", "reviews", "buy now", "navy | blue", "grey", "small", "x-large"]}
    assert site.click("grey").valid and site.options == {"color": "grey"}
    assert site.click("X-Large").valid and site.options == {"color": "grey", "size": "x-large"}
    out = site.click("features")
    assert out.observation.endswith("Back to Search [SEP] < Prev [SEP] Soft and absorbent")
    assert site.available_actions()["clickables"] == ["back to search", "< prev"]
    assert site.click("< prev").observation.startswith("Instruction:") and site.page == "item"
    assert site.options == {"color": "grey", "size": "x-large"}  # kept on the item
    site.click("< prev")  # item -> results: the item and its options are dropped, as upstream
    assert site.page == "results" and site.options == {} and site.asin is None
    site.click("back to search")
    assert site.page == "search" and site.has_search_bar()


def test_invalid_actions_leave_the_page_and_say_why(site):
    out = site.click("search")
    assert not out.valid and "search_action" in out.error and site.page == "search"
    out = site.click("b000towel1")
    assert not out.valid and "'b000towel1' is not a clickable value" in out.error
    assert not site.search("   ").valid
    site.search("towel")
    out = site.search("lamp")
    assert not out.valid and "no search box" in out.error and site.keywords == ["towel"]
    site.search_anywhere = True  # upstream's text env searches from any page
    assert site.search("lamp").valid and site.results[0] == "B000LAMP01"


def test_pagination(bundled_env):
    shop = bundled_env.shop
    goal = shop.goals[0]
    site = Site(goal, shop.by_asin, shop.prices, shop.search)
    site.search("women shoes")
    assert len(site.results) == 50
    first = site.available_actions()["clickables"]
    assert "< prev" not in first and len(first) == 12
    site.click("next >")
    assert site.page_number == 2 and "< Prev [SEP] Next >" in site.observation()
    assert site.available_actions()["clickables"][:3] == ["back to search", "< prev", "next >"]
    for _ in range(4):
        site.click("next >")
    assert site.page_number == 6 and "Page 6 (Total results: 50)" in site.observation()
    assert site.available_actions()["clickables"] == ["back to search", "< prev", "next >"]  # empty page, as upstream
    site.click("< prev")
    assert site.page_number == 5


def test_buy_now_scores_and_finishes(site):
    site.search("towel")
    site.click("b000towel1")
    site.click("grey")
    out = site.click("buy now")
    assert out.done and out.reward == 1.0 and out.info["purchased_target"]
    assert out.observation == "Thank you for shopping with us! [SEP] Your score (min 0.0, max 1.0) [SEP] 1.0"
    assert not site.click("back to search").valid and not site.search("x").valid


def test_session_messages_errors_and_round_limit(bundled_env):
    async def main():
        session = await bundled_env.open("bundled-dev", 500)
        first = await session.start()
        assert [m["role"] for m in first.messages] == ["system", "user"]
        assert first.messages[0]["content"].startswith("\nYou are web shopping.")
        assert first.messages[1]["content"].startswith("The initial observation:\nWebShop [SEP] Instruction: [SEP] ")
        assert first.messages[1]["content"].endswith("Available Actions:\n{'has_search_bar': True, 'clickables': ['search']}")
        step = await session.step(assistant_tool_call("click_action", {"value": "buy now"}, call_id="c1"))
        assert step.status.value == "running" and step.metrics["invalid_turns"] == 1
        assert step.messages[0]["tool_call_id"] == "c1"
        assert step.messages[0]["content"].startswith(
            "Action: click[buy now]\n\nObservation:\nInvalid action: 'buy now' is not a clickable value on this page")
        step = await session.step(assistant_tool_call("search_action", {"keywords": "soft blanket"}))
        assert step.messages[0]["content"].startswith("Action: search[soft blanket]\n\nObservation:\nInstruction: [SEP]")
        assert "Available Actions:\n{'has_search_bar': False, 'clickables': ['back to search', 'next >', " in step.messages[0]["content"]
        for _ in range(17):
            step = await session.step(assistant_tool_call("click_action", {"value": "next >"}))
            assert step.status.value == "running"
        step = await session.step(assistant_tool_call("click_action", {"value": "< prev"}))
        assert step.status.value == "task limit reached" and step.metrics["rounds"] == 20 and step.reward == 0.0
        with pytest.raises(SessionError):
            await session.step(assistant_tool_call("click_action", {"value": "< prev"}))
        await session.close()
        assert bundled_env.resource_count() == 0

    anyio.run(main)
