from __future__ import annotations

import json
from pathlib import Path

import pytest
from agentrl_env_webshop.config import WebShopConfig
from agentrl_env_webshop.env import WebShopEnvironment


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path_factory, monkeypatch):
    """Indexes built by tests go to a temporary cache, never the user's."""
    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(scope="session")
def bundled_env(tmp_path_factory) -> WebShopEnvironment:
    return WebShopEnvironment(WebShopConfig(index_cache_dir=str(tmp_path_factory.mktemp("index"))))


def _product_record(asin: str, name: str, *, pricing: str = "$10.00", options=None, query: str = "towels",
                   product_category: str = "Home & Kitchen › Bath › Towels", category: str = "garden",
                   description: str = "", bullets=None) -> dict:
    """One product in the items_shuffle*.json format (all of upstream's keys)."""
    return {
        "name": name, "product_information": {"Brand": "Test"}, "brand": "Test", "brand_url": "",
        "full_description": description, "pricing": pricing, "list_price": "", "availability_quantity": 5,
        "availability_status": "In Stock.", "images": ["https://example.invalid/a.jpg"],
        "product_category": product_category, "average_rating": "4.5 out of 5 stars",
        "small_description": bullets if bullets is not None else ["Soft and absorbent"], "total_reviews": 3,
        "total_answered_questions": 0,
        "customization_options": options if options is not None else "",
        "seller_id": "S1", "seller_name": "Seller", "fulfilled_by_amazon": True, "fast_track_message": "",
        "aplus_present": False, "asin": asin, "category": category, "query": query, "page": 1,
        "small_description_old": "",
    }


@pytest.fixture
def product_record():
    """Build a product in the items_shuffle*.json format."""
    return _product_record


@pytest.fixture
def tiny_catalog(tmp_path: Path) -> dict[str, Path]:
    """A six-product catalog in the three real WebShop file formats."""
    colors = [{"value": "Navy/Blue", "image": None}, {"value": "Grey", "image": None}]
    sizes = [{"value": "Small", "image": None}, {"value": "X-Large", "image": None}]
    items = [
        _product_record("B000TOWEL1", "Cotton Bath Towel Set, Quick Drying", pricing="$24.99",
                       options={"Color": colors, "Size": sizes, "Style": None}),
        _product_record("B000TOWEL2", "Microfiber Bath Towel, Super Soft", pricing="$12.49 - $18.99",
                       options={"Color": colors}),
        _product_record("B000SNACK1", "Organic Trail Mix Snack Pack", pricing="$8.50", query="snacks",
                       product_category="Grocery & Gourmet Food › Snack Foods", category="food"),
        _product_record("B000SNACK1", "duplicate ASIN, skipped as upstream does"),
        _product_record("nan", "bad ASIN, skipped"),
        _product_record("B000LAMP01", "Brass Desk Lamp with USB Port", pricing="", query="lamps",
                       product_category="Tools & Home Improvement › Lighting & Ceiling Fans › Lamps & Shades"),
    ]
    attributes = {
        "B000TOWEL1": {"attributes": ["quick drying", "cotton"], "instruction": "i want a quick drying towel",
                       "instruction_attributes": ["quick drying"]},
        "B000TOWEL2": {"attributes": ["super soft"], "instruction": None, "instruction_attributes": None},
        "B000SNACK1": {"attributes": ["organic", "gluten free"]},
    }
    human = {
        "B000TOWEL1": [
            {"asin": "B000TOWEL1", "instruction": "i need a quick drying cotton towel in grey.",
             "instruction_attributes": ["quick drying", "cotton"], "instruction_options": ["grey", "x-large"],
             "assignment_id": "A1", "worker_id": "W1"},
            {"asin": "B000TOWEL1", "instruction": "towel without attributes", "instruction_attributes": [],
             "instruction_options": []},
        ],
        "B000SNACK1": [{"asin": "B000SNACK1", "instruction": "i want organic trail mix",
                        "instruction_attributes": ["organic"], "instruction_options": []}],
        "B000LAMP01": [{"asin": "B000LAMP01", "instruction": "find me a desk lamp with a usb port",
                        "instruction_attributes": ["usb port"], "instruction_options": []}],
    }
    paths = {"items": tmp_path / "items_shuffle_test.json", "attributes": tmp_path / "items_ins_v2_test.json",
             "human": tmp_path / "items_human_ins.json"}
    paths["items"].write_text(json.dumps(items))
    paths["attributes"].write_text(json.dumps(attributes))
    paths["human"].write_text(json.dumps(human))
    return paths
