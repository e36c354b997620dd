"""Colour normalization of option values, as WebShop's reward applies it.

``normalize_color`` maps an option value to the first colour word of WebShop's list that
occurs in it as a substring (so "heather grey" becomes "heather", "light blue" becomes
"blue"); values without a listed colour are returned unchanged. The list and its order are
WebShop's (``web_agent_site/engine/normalize.py``): the order decides which colour wins.
"""

from __future__ import annotations

COLOR_SET = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure",
    "banana", "beige", "black", "blue", "blush", "bordeaux", "bronze",
    "brown", "burgundy", "camel", "camo", "caramel", "champagne",
    "charcoal", "cheetah", "chestnut", "chocolate", "christmas", "coffee",
    "cognac", "copper", "coral", "cranberry", "cream", "crystal", "dark",
    "denim", "eggplant", "elephant", "espresso", "fuchsia", "gold", "granite",
    "grape", "graphite", "grass", "gray", "green", "grey", "heather", "indigo",
    "ivory", "ivy", "khaki", "lavender", "lemon", "leopard", "light", "lilac",
    "lime", "magenta", "maroon", "mauve", "merlot", "midnight", "mint", "mocha",
    "multicolor", "mushroom", "mustard", "natural", "navy", "nude", "olive",
    "orange", "peach", "pewter", "pink", "plum", "purple", "rainbow", "red",
    "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver", "skull",
    "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal",
    "tiger", "turquoise", "violet", "walnut", "wheat", "white", "wine", "yellow",
)


def normalize_color(value: str) -> str:
    """The first listed colour contained in ``value``, else ``value`` itself."""
    for color in COLOR_SET:
        if color in value:
            return color
    return value
