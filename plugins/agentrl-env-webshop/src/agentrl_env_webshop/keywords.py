"""Search keywords from an instruction: what the oracle types, and what goal generation checks.

The instruction minus its price clause and the request phrasing ("i'm looking for", "i would
like", "also choose") is a fair query: it names only what the shopper asked for.
"""

from __future__ import annotations

import re

FILLER = frozenset(
    ["i", "im", "i'm", "id", "i'd", "am", "looking", "look", "for", "need", "want", "would", "like", "to", "buy", "find", "me", "get", "some", "please", "can", "could", "you", "purchase", "it", "should", "be", "that", "is", "with", "and", "also", "choose", "in", "a", "an", "the", "of", "which", "has", "have", "my", "are", "this", "one", "something", "help", "shopping", "order"]
)
_PRICE_CLAUSE = re.compile(r",? and price lower than [\d.]+ dollars\s*$")
_WORD = re.compile(r"[\w'’.#&+-]+")


def strip_price_clause(instruction: str) -> str:
    return _PRICE_CLAUSE.sub("", instruction.strip())


def instruction_keywords(instruction: str) -> str:
    """``"i need a gluten free snack, and price lower than 30.00 dollars"`` -> ``"gluten free snack"``."""
    words = []
    for word in _WORD.findall(strip_price_clause(instruction).lower()):
        word = word.strip(".,;:-'’")
        if word and word not in FILLER:
            words.append(word)
    return " ".join(words)
