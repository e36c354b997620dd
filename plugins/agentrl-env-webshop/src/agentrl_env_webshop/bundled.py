"""Generate the bundled catalog and goals from the real products WebShop agents were shown.

Source: ``reference_runs/std_observed_products.json`` (package data): 4,332 real listings
(title, price) from WebShop search pages and 415 real item pages (option groups, some
descriptions and feature bullets). Everything else is derived, deterministically:

* type, ``category``, ``query`` and ``product_category`` from the title
  (:mod:`agentrl_env_webshop.taxonomy`);
* ``Attributes`` (``items_ins_v2``): the attribute phrases the product's text contains;
* description and feature bullets where the page had none: from the title's segments, the
  type and the attributes;
* one goal per product with at least one attribute (``items_human_ins``): an instruction
  in the style of ``human_goals.json`` naming the type, one to three of its attributes and,
  for products with option groups, option values; the brand or title words are added only
  when the target would not otherwise be among the top 50 results of a search with the
  instruction's keywords, and a product that stays unfindable gets no goal.

The output is three files in the real WebShop formats plus a manifest (sha256 sums and the
goal index ranges of ``bundled-test``, ``bundled-dev`` and ``bundled-train``), loaded by
the same code as a real catalog. They are committed under ``data/bundled``; regenerate with
``python -m agentrl_env_webshop.bundled --out DIR`` (byte-identical for the same inputs).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import random
import re
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrl_env_webshop.catalog import human_goals, load_products, product_prices, shuffle_goals
from agentrl_env_webshop.keywords import instruction_keywords
from agentrl_env_webshop.search import TOP_N, SearchIndex, product_document
from agentrl_env_webshop.taxonomy import (
    ATTRIBUTE_PHRASES,
    FALLBACK_TYPE,
    FOR_ATTRIBUTES,
    PRODUCT_TYPES,
    WITH_ATTRIBUTES,
)

GENERATOR_VERSION = 1
SEED = 20240617
SPLITS = (("bundled-test", 500), ("bundled-dev", 300))  # in goal order; the rest is bundled-train
FILES = ("items_shuffle_bundled.json.gz", "items_ins_v2_bundled.json.gz", "items_human_ins_bundled.json.gz")
MANIFEST = "manifest.json"

_SPLIT_TITLE = re.compile(r"\s*(?:,|;|\||–|—| - |\[|\]|\(|\))\s*")
_NORMALIZE = re.compile(r"[^a-z0-9]+")


def normalize_text(text: str) -> str:
    """Lower case, hyphens and punctuation as spaces: the form attribute phrases are matched in."""
    return " " + _NORMALIZE.sub(" ", text.lower()).strip() + " "


_TYPE_PATTERNS = [
    (i, re.compile(r"(?<![a-z0-9])(?:" + "|".join(patterns) + r")(?![a-z0-9])"))
    for i, (_, _, _, patterns) in enumerate(PRODUCT_TYPES)
]


def product_type(title: str) -> tuple[tuple[str, str, str], str]:
    """The type (phrase, category, breadcrumb) whose pattern occurs earliest in the title, and
    the title's own words for it ("maple syrup" in a title typed "sauces and condiments").

    Attribute phrases are blanked out first: "Tea Tree Oil Shampoo" is a shampoo, not tea.
    """
    text = _blank_attributes(normalize_text(title))
    best: tuple[int, int, int, str] | None = None
    for i, pattern in _TYPE_PATTERNS:
        m = pattern.search(text)
        # earliest match first; at the same place the longer one ("coat rack" over "coat")
        if m and (best is None or (m.start(), -len(m.group(0))) < best[:2]):
            best = (m.start(), -len(m.group(0)), i, m.group(0))
    if best is None:
        return FALLBACK_TYPE, ""
    start, _, i, matched = best
    name, category, breadcrumb, _ = PRODUCT_TYPES[i]
    before = text[:start].split()
    if len(matched.split()) == 1 and before and _is_modifier(before[-1]):
        matched = f"{before[-1]} {matched}"
    return (name, category, breadcrumb), matched


_NOT_MODIFIERS = frozenset(["for", "with", "and", "or", "of", "the", "a", "an", "in", "on", "to", "by", "from", "set", "pack", "piece", "pcs", "new", "men", "mens", "women", "womens", "kids", "girls", "boys", "baby", "adult", "adults", "unisex", "ladies", "size", "inch", "inches", "oz", "ft"])


def _is_modifier(word: str) -> bool:
    from agentrl_env_webshop.normalize import COLOR_SET

    return word.isalpha() and len(word) > 2 and word not in _NOT_MODIFIERS and word not in COLOR_SET


def attributes_of(*texts: str) -> list[str]:
    """The attribute phrases the texts contain, in vocabulary order.

    Longer phrases are matched first and blanked out, so "sugar free" does not also count
    as "free" or "natural ingredients" as "natural".
    """
    found: set[str] = set()
    _blank_attributes(normalize_text(" ".join(texts)), found)
    return [a for a in ATTRIBUTE_PHRASES if a in found]


def _blank_attributes(text: str, found: set[str] | None = None) -> str:
    for phrase in _BY_LENGTH:
        needle = f" {phrase} "
        if needle in text:
            if found is not None:
                found.add(phrase)
            text = text.replace(needle, " | ")
    return text


_BY_LENGTH = sorted(ATTRIBUTE_PHRASES, key=lambda a: (-len(a.split()), -len(a)))


def _brands(titles: list[str]) -> dict[str, str]:
    """Title -> brand: a first word that is rare elsewhere in titles and no product word."""
    later = Counter()
    for title in titles:
        words = normalize_text(title).split()
        later.update(set(words[1:]))
    vocabulary = {w for _, _, _, patterns in PRODUCT_TYPES for p in patterns for w in re.findall(r"[a-z]+", p)}
    vocabulary |= {w for a in ATTRIBUTE_PHRASES for w in a.split()}
    out = {}
    for title in titles:
        words = normalize_text(title).split()
        if not words:
            continue
        first = words[0]
        if len(first) >= 3 and not first.isdigit() and later[first] < 3 and first not in vocabulary:
            out[title] = first
    return out


def _segments(title: str) -> list[str]:
    parts = [p.strip(" .") for p in _SPLIT_TITLE.split(title)]
    return [p for p in parts if len(p.split()) >= 2]


def _title_words(title: str, n: int) -> str:
    return " ".join(normalize_text(title).split()[:n])


def build_products(
    observed: Mapping[str, Any], rng: random.Random
) -> tuple[list[dict], dict[str, dict], dict[str, tuple[str, str]]]:
    """Products in the items_shuffle format, their items_ins_v2 entries, (brand, type words)."""
    listings, pages = observed["search_listings"], observed["item_pages"]
    asins = sorted(set(listings) | set(pages))
    rng.shuffle(asins)  # items_shuffle.json is, as its name says, shuffled
    titles = {a: (pages.get(a) or listings[a])["title"] for a in asins}
    brands = _brands(list(titles.values()))
    items, ins_v2, heads = [], {}, {}
    for asin in asins:
        page = pages.get(asin, {})
        title = titles[asin]
        price = (page or listings[asin])["price"]
        (type_name, category, breadcrumb), head = product_type(title)
        brand = brands.get(title, "")
        if brand and head.startswith(brand + " "):
            head = head[len(brand) + 1:]
        options = {g: v for g, v in (page.get("options") or {}).items() if g != "*" and v}
        features = [f.strip() for f in page.get("features", "").split("[SEP]") if f.strip()]
        bullets = features or _segments(title)[1:6] or [title]
        description = page.get("description", "")
        attributes = attributes_of(title, description, " ".join(bullets))
        if not description:
            leaf = breadcrumb.split("›")[-1].strip()
            about = f"{brand.capitalize() + ' ' if brand else ''}{type_name} ({leaf.lower()})."
            highlights = f" Highlights: {', '.join(attributes)}." if attributes else ""
            description = f"{about} {'. '.join(_segments(title)) or title}.{highlights}"
        items.append({
            "name": title,
            "product_information": {},
            "brand": brand,
            "brand_url": "",
            "full_description": description,
            "pricing": "" if price == "$100.0" else price,  # upstream shows an empty price as $100.0
            "list_price": "",
            "availability_quantity": None,
            "availability_status": "",
            "images": [""],
            "product_category": breadcrumb,
            "average_rating": "",
            "small_description": bullets,
            "total_reviews": 0,
            "total_answered_questions": 0,
            "customization_options": {g: [{"value": v, "image": None} for v in values] for g, values in options.items()} or "",
            "seller_id": "",
            "seller_name": "",
            "fulfilled_by_amazon": None,
            "fast_track_message": "",
            "aplus_present": None,
            "asin": asin,
            "category": category,
            "query": type_name,
            "page": 1,
            "small_description_old": "",
        })
        ins_v2[asin] = {"attributes": attributes}
        heads[asin] = (brand, head or type_name)
    return items, ins_v2, heads


# -- instructions ------------------------------------------------------------------------

_OPENERS = ("i need", "i'm looking for", "i want", "i would like", "find me", "i am looking for",
            "can you find me", "i want to buy", "get me", "i'd like to purchase", "looking for", "please find")


def _plural(phrase: str) -> bool:
    head = phrase.split()[-1] if phrase.split() else phrase
    return head.endswith("s") and not head.endswith(("ss", "us"))


def _article(phrase: str, rng: random.Random) -> str:
    if _plural(phrase):
        return rng.choice(("", "some "))
    return "an " if phrase[:1] in "aeio" else "a "


def _option_phrase(group: str, value: str, rng: random.Random) -> str:
    if group == "color":
        return rng.choice((f"in {value} color", f"{value} colored", f"the color {value}", f"in {value}"))
    if group == "size":
        return rng.choice((f"in size {value}", f"size {value}", f"{value} size", f"in {value} size"))
    if group in ("flavor name", "flavor"):
        return rng.choice((f"{value} flavor", f"in {value} flavor"))
    if group == "scent":
        return f"{value} scent"
    if group == "style":
        return rng.choice((f"in {value} style", f"the {value} style"))
    return rng.choice((f"with {group} {value}", f"{group}: {value}"))


def _join_and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def compose_instruction(type_phrase: str, attributes: list[str], options: list[tuple[str, str]], rng: random.Random) -> str:
    """An instruction in the style of ``human_goals.json`` (lower case, plain, sometimes clumsy)."""
    opener = rng.choice(_OPENERS)
    adjectives = [a for a in attributes if a not in FOR_ATTRIBUTES and a not in WITH_ATTRIBUTES]
    withs = [a for a in attributes if a in WITH_ATTRIBUTES]
    fors = [a for a in attributes if a in FOR_ATTRIBUTES]
    tail = (f" with {_join_and(withs)}" if withs else "") + (f" for {_join_and(fors)}" if fors else "")
    art = _article(type_phrase, rng)
    verb = "are" if _plural(type_phrase) else "is"
    shape = rng.randrange(4) if adjectives else 0
    if shape == 0 and adjectives and adjectives[-1].split()[-1] == type_phrase.split()[0]:
        shape = 1  # not "human hair hair bundles"
    if not adjectives:
        text = f"{opener} {art}{type_phrase}{tail}"
    elif shape == 0:
        art = _article(adjectives[0] + " " + type_phrase, rng)
        text = f"{opener} {art}{_join_and(adjectives)} {type_phrase}{tail}"
    elif shape == 1:
        text = f"{opener} {art}{type_phrase}{tail} that {verb} {_join_and(adjectives)}"
    elif shape == 2:
        text = f"{opener} {art}{type_phrase}{tail} which {verb} {_join_and(adjectives)}"
    else:
        text = f"{opener} {art}{type_phrase}{tail}. {'they' if verb == 'are' else 'it'} should be {_join_and(adjectives)}"
    if options:
        phrases = [_option_phrase(g, v, rng) for g, v in options]
        glue = rng.choice((", ", ", and also choose ", " ", ", and "))
        if glue == ", and also choose ":
            phrases = [re.sub(r"^(in |with |the )", "", p) for p in phrases]
        text += glue + _join_and(phrases)
    return re.sub(r"\s+", " ", text).strip()


def build_goals(items: list[dict], ins_v2: dict[str, dict], heads: dict[str, tuple[str, str]], rng: random.Random,
                index: SearchIndex) -> tuple[dict[str, list[dict]], Counter]:
    """Findable human-style instructions (items_human_ins format): one per product with
    attributes, and a second one, with other option values, for products with options."""
    products = {p["asin"]: p for p in load_products(items, ins_v2)}
    human: dict[str, list[dict]] = {}
    stats: Counter = Counter()
    for item in items:
        asin = item["asin"]
        attributes = ins_v2[asin]["attributes"]
        if not attributes:
            stats["no attributes"] += 1
            continue
        product = products[asin]
        brand, type_phrase = heads[asin]
        type_words = set(type_phrase.split())
        sayable = [a for a in attributes if not set(a.split()) <= type_words]
        if not sayable:
            stats["attributes only repeat the type"] += 1
            continue
        groups = list(product["options"].items())
        instructions = []
        for _ in range(2 if groups else 1):
            instruction = _findable_instruction(item, brand, type_phrase, sayable, groups, rng, index, stats)
            if instruction is not None and instruction not in instructions:
                instructions.append(instruction)
        if instructions:
            human[asin] = instructions
    return human, stats


def _findable_instruction(item: dict, brand: str, type_phrase: str, sayable: list[str], groups: list, rng: random.Random,
                          index: SearchIndex, stats: Counter) -> dict | None:
    asin = item["asin"]
    chosen = rng.sample(sayable, k=min(len(sayable), rng.choice((1, 1, 2, 2, 3))))
    options = []
    if groups:
        keep = groups if rng.random() < 0.7 else rng.sample(groups, k=rng.randint(1, len(groups)))
        options = [(g, rng.choice(values)) for g, values in keep]
    variants = []
    if brand and rng.random() < 0.3:
        variants.append(f"{brand} {type_phrase}")
    variants.append(type_phrase)
    if brand:
        variants.append(f"{brand} {type_phrase}")
    variants += [f"{_title_words(item['name'], 6)} {type_phrase}", f"{_title_words(item['name'], 10)} {type_phrase}"]
    for attempt, phrase in enumerate(dict.fromkeys(variants)):
        state = rng.getstate()
        text = compose_instruction(phrase, chosen, options, rng)
        if asin in index.search(instruction_keywords(text), TOP_N):
            stats[f"findable at attempt {attempt}"] += 1
            return {"asin": asin, "instruction": text, "instruction_attributes": chosen,
                    "instruction_options": [v for _, v in options]}
        rng.setstate(state)  # the wording stays the same whichever variant is tried
    stats["unfindable"] += 1
    return None


def _gzip_json(data: Any) -> bytes:
    raw = json.dumps(data, ensure_ascii=False, sort_keys=False, separators=(",", ":")).encode("utf-8")
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, filename="", compresslevel=9) as f:
        f.write(raw)
    return out.getvalue()


def generate(observed: Mapping[str, Any], out_dir: str | Path, *, seed: int = SEED) -> dict[str, Any]:
    """Write the bundled catalog into ``out_dir``; returns the manifest."""
    rng = random.Random(seed)
    items, ins_v2, heads = build_products(observed, rng)
    loaded = load_products(items, ins_v2)
    index = SearchIndex.build([p["asin"] for p in loaded], [product_document(p) for p in loaded])
    human, stats = build_goals(items, ins_v2, heads, rng, index)
    goals = shuffle_goals(human_goals(load_products(items, ins_v2, human), product_prices(loaded)))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    blobs = dict(zip(FILES, (_gzip_json(items), _gzip_json(ins_v2), _gzip_json(human)), strict=True))
    splits, start = {}, 0
    for name, size in SPLITS:
        splits[name] = [start, start + size]
        start += size
    splits["bundled-train"] = [start, len(goals)]
    manifest = {
        "generator_version": GENERATOR_VERSION,
        "seed": seed,
        "source": "reference_runs/std_observed_products.json",
        "products": len(items),
        "goals": len(goals),
        "splits": splits,
        "stats": dict(sorted(stats.items())),
        "categories": dict(sorted(Counter(i["category"] for i in items).items())),
        "files": {name: hashlib.sha256(blob).hexdigest() for name, blob in blobs.items()},
    }
    for name, blob in blobs.items():
        (out_dir / name).write_bytes(blob)
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    from agentrl_env_webshop.data import locate_shipped

    parser = argparse.ArgumentParser(description="Generate WebShop's bundled catalog and goals.")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--observed", help="std_observed_products.json (default: the shipped copy)")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    path = args.observed or locate_shipped("reference_runs/std_observed_products.json")
    observed = json.loads(Path(path).read_text(encoding="utf-8"))
    manifest = generate(observed, args.out, seed=args.seed)
    print(json.dumps({k: manifest[k] for k in ("products", "goals", "splits", "stats")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
