"""WebShop's product catalog and goals, loaded as upstream's ``engine.load_products`` and ``goal.get_goals`` do.

Source: princeton-nlp/WebShop (MIT), ``web_agent_site/engine/engine.py`` (``load_products``,
``clean_product_keys``, ``generate_product_prices``) and ``web_agent_site/engine/goal.py``
(``get_human_goals``, ``get_synthetic_goals``), re-implemented.

Files (upstream's standard names, from WebShop's ``setup.sh`` data download):

- products: ``items_shuffle_1000.json`` (``-d small``) or ``items_shuffle.json`` (``-d all``), a JSON
  list of scraped product records;
- attributes and synthetic instructions: ``items_ins_v2_1000.json`` / ``items_ins_v2.json``, a JSON
  object keyed by ASIN;
- human instructions: ``items_human_ins.json``, a JSON object ASIN -> list of instructions.

Differences from upstream, all deliberate:

- upstream draws ranged prices and goal price limits from Python's global, unseeded ``random``
  (so ``price_upper`` and the "price lower than ..." text vary between runs); here they come from
  ``random.Random(price_seed)`` (default 42, the seed verl-agent's WebShop wrapper sets globally
  before loading), in upstream's order, so a task id always means the same goal text;
- the goal shuffle uses ``random.Random(233)``, which permutes exactly as upstream's
  ``random.seed(233); random.shuffle(goals)``;
- malformed records that crash upstream (a price part without digits, an ASIN missing from the
  attribute file, a synthetic instruction without attributes) are skipped or defaulted instead;
- reviews are not loaded (upstream's current ``load_products`` has review loading commented out:
  every product has ``Reviews = []`` and ``Rating = "N.A."``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import re
from collections import defaultdict
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from ...errors import ConfigError, DataNotFoundError

__all__ = ["GOAL_SHUFFLE_SEED", "HOW_TO_GET", "PRICE_RANGE", "Catalog", "find_data_files", "load_catalog"]

#: Goal price limits are drawn from these (dollars), as upstream's ``goal.PRICE_RANGE``.
PRICE_RANGE = [10.0 * i for i in range(1, 100)]
#: Upstream's fixed goal shuffle seed (``SimServer.__init__``).
GOAL_SHUFFLE_SEED = 233

_DROPPED_KEYS = ("product_information", "brand", "brand_url", "list_price", "availability_quantity",
                 "availability_status", "total_reviews", "total_answered_questions", "seller_id", "seller_name",
                 "fulfilled_by_amazon", "fast_track_message", "aplus_present", "small_description_old")

HOW_TO_GET = ("Get WebShop's data with its own setup script: clone https://github.com/princeton-nlp/WebShop and run "
              "`./setup.sh -d small` (1,000 products: items_shuffle_1000.json, items_ins_v2_1000.json, "
              "items_human_ins.json into WebShop/data/; `-d all` for the full catalog), then point this "
              "environment at that data/ folder.")

PRODUCT_FILES = ("items_shuffle_1000.json", "items_shuffle.json")
ATTRIBUTE_FILES = ("items_ins_v2_1000.json", "items_ins_v2.json")
HUMAN_FILE = "items_human_ins.json"


def _pick(folder: Path, explicit: str | None, preferred: tuple[str, ...], pattern: str, what: str) -> Path:
    if explicit is not None:
        p = Path(explicit)
        p = p if p.is_absolute() else folder / p
        if not p.is_file():
            raise DataNotFoundError(f"WebShop {what} file {str(p)!r} does not exist. {HOW_TO_GET}")
        return p
    for name in preferred:
        if (folder / name).is_file():
            return folder / name
    found = sorted(folder.glob(pattern))
    if found:
        return found[0]
    raise DataNotFoundError(f"no WebShop {what} file ({' or '.join(preferred)} or {pattern}) in {folder}. {HOW_TO_GET}")


def find_data_files(folder: Path, *, products_file: str | None = None, attributes_file: str | None = None,
                    human_file: str | None = None, human_goals: bool = True) -> tuple[Path, Path, Path | None]:
    """The (products, attributes, human instructions) files in ``folder``.

    Names given explicitly (relative to ``folder`` or absolute) win; otherwise the standard names
    are tried in order (the 1,000-product files first, as upstream's ``utils.DEFAULT_FILE_PATH``),
    then the first ``items_shuffle*.json`` / ``items_ins_v2*.json`` match.

    Raises:
        DataNotFoundError: a file is missing (the human file only when ``human_goals``).
    """
    products = _pick(folder, products_file, PRODUCT_FILES, "items_shuffle*.json", "products")
    attributes = _pick(folder, attributes_file, ATTRIBUTE_FILES, "items_ins_v2*.json", "attributes")
    human = None
    if human_goals:
        human = _pick(folder, human_file, (HUMAN_FILE,), HUMAN_FILE, "human instructions")
    return products, attributes, human


def _parse_pricing(raw: Any) -> tuple[list[float], str]:
    """``"$19.99$27.99"`` -> ``([19.99, 27.99], "$19.99 to $27.99")``; empty -> ``([100.0], "$100.0")``."""
    if not raw or not isinstance(raw, str):
        return [100.0], "$100.0"
    prices: list[float] = []
    for part in raw.split("$")[1:]:
        digits = re.sub(r"[^\d.]", "", part)
        try:
            prices.append(float(Decimal(digits)))
        except (InvalidOperation, ValueError):
            continue
    if not prices:
        return [100.0], "$100.0"
    if len(prices) == 1:
        return prices, f"${prices[0]}"
    return prices[:2], f"${prices[0]} to ${prices[1]}"


@dataclasses.dataclass
class Catalog:
    """The loaded catalog.  Read-only after :func:`load_catalog`.

    Attributes:
        products: product dicts in file order with upstream's keys (``asin``, ``Title``,
            ``Description``, ``BulletPoints``, ``Price``, ``pricing``, ``options`` (name -> values),
            ``Attributes``, ``category``, ``query``, ``product_category``, ``name``, ...).
        by_asin: ASIN -> product.
        prices: ASIN -> the price in dollars used by the reward (a draw inside ranged prices).
        attribute_to_asins: attribute -> ASINs that have it.
        goals: the shuffled goals (upstream's order: goal index = task id).
        human_goals: whether the goals are human instructions.
    """

    products: list[dict[str, Any]]
    by_asin: dict[str, dict[str, Any]]
    prices: dict[str, float]
    attribute_to_asins: dict[str, set[str]]
    goals: list[dict[str, Any]]
    human_goals: bool


def _load_products(products_path: Path, attributes: dict[str, Any], human: dict[str, Any] | None,
                   num_products: int | None) -> list[dict[str, Any]]:
    with open(products_path, encoding="utf-8") as f:
        records = json.load(f)
    if not isinstance(records, list):
        raise ConfigError(f"{products_path} must hold a JSON list of product records, got {type(records).__name__}")
    if num_products is not None:
        records = records[:num_products]
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for p in records:
        asin = p.get("asin")
        if not isinstance(asin, str) or asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        for k in _DROPPED_KEYS:
            p.pop(k, None)
        p["Title"] = p.get("name", "")
        p["Description"] = p.get("full_description", "")
        p["Reviews"] = []
        p["Rating"] = "N.A."
        small = p.get("small_description", "")
        p["BulletPoints"] = small if isinstance(small, list) else [small]
        p["pricing"], p["Price"] = _parse_pricing(p.get("pricing"))
        options: dict[str, list[str]] = {}
        option_to_image: dict[str, Any] = {}
        custom = p.get("customization_options")
        if custom and isinstance(custom, dict):
            for name, contents in custom.items():
                if contents is None:
                    continue
                values = []
                for c in contents:
                    v = str(c["value"]).strip().replace("/", " | ").lower()
                    values.append(v)
                    option_to_image[v] = c.get("image")
                options[name.lower()] = values
        p["options"] = options
        p["option_to_image"] = option_to_image
        entry = attributes.get(asin) or {}
        p["Attributes"] = entry.get("attributes", ["DUMMY_ATTR"])
        if human is not None:
            if asin in human:
                p["instructions"] = human[asin]
        else:
            p["instruction_text"] = entry.get("instruction")
            p["instruction_attributes"] = entry.get("instruction_attributes")
        images = p.get("images") or [""]
        p["MainImage"] = images[0]
        p["query"] = str(p.get("query", "")).lower().strip()
        p.setdefault("category", "")
        p.setdefault("product_category", "")
        out.append(p)
    return out


def _price_limit(rng: random.Random, price: float) -> tuple[float, str]:
    candidates = [x for x in PRICE_RANGE if x > price][:4]
    if len(candidates) >= 2:
        _, upper = sorted(rng.sample(candidates, 2))
        return upper, f", and price lower than {upper:.2f} dollars"
    return 1000000, ""


def _human_goals(products: list[dict[str, Any]], prices: dict[str, float], rng: random.Random) -> list[dict[str, Any]]:
    goals = []
    for item in products:
        for ins in item.get("instructions", ()):
            attrs = ins.get("instruction_attributes") or []
            if not attrs:
                continue  # upstream skips (and counts) these
            upper, price_text = _price_limit(rng, prices[item["asin"]])
            goals.append({
                "asin": item["asin"], "category": item["category"], "query": item["query"], "name": item["name"],
                "product_category": item["product_category"],
                "instruction_text": ins["instruction"].strip(".") + price_text,
                "attributes": attrs, "price_upper": upper, "goal_options": ins.get("instruction_options") or [],
                "weight": 1,
            })
    return goals


def _synthetic_goals(products: list[dict[str, Any]], prices: dict[str, float], rng: random.Random) -> list[dict[str, Any]]:
    goals = []
    counts: dict[str, int] = defaultdict(int)
    for product in products:
        text = product.get("instruction_text")
        attrs = product.get("instruction_attributes") or []
        if text is None or not attrs:
            continue
        upper, price_text = _price_limit(rng, prices[product["asin"]])
        names = sorted(product["options"])
        for combination in itertools.product(*(product["options"][n] for n in names)):
            goal_options = dict(zip(names, combination))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = " with " + option_text if option_text else ""
            goals.append({
                "asin": product["asin"], "category": product["category"], "query": product["query"],
                "name": product["Title"], "product_category": product["product_category"],
                "instruction_text": f"{text}{option_text}{price_text}", "attributes": attrs,
                "price_upper": upper, "goal_options": goal_options,
            })
            for a in attrs:
                counts[a] += 1
    for g in goals:
        g["weight"] = sum(1.0 / counts[a] for a in g["attributes"]) / len(g["attributes"])
    return goals


def load_catalog(products_path: str | Path, attributes_path: str | Path, human_path: str | Path | None = None, *,
                 num_products: int | None = None, human_goals: bool = True, price_seed: int = 42) -> Catalog:
    """Load products and goals as upstream's ``load_products`` + ``get_goals`` + the goal shuffle.

    Args:
        products_path: ``items_shuffle*.json``.
        attributes_path: ``items_ins_v2*.json``.
        human_path: ``items_human_ins.json``; required when ``human_goals``.
        num_products: keep only the first N product records (upstream's ``num_products``).
        human_goals: human instructions (True) or synthetic ones from the attribute file (False).
        price_seed: seed of the price draws (see the module docstring).

    Raises:
        ConfigError: a file has the wrong structure, or ``human_goals`` without ``human_path``.
        OSError / json.JSONDecodeError: a file cannot be read.
    """
    if num_products is not None and (not isinstance(num_products, int) or num_products < 1):
        raise ConfigError(f"num_products={num_products!r} must be None or an integer >= 1")
    with open(attributes_path, encoding="utf-8") as f:
        attributes = json.load(f)
    if not isinstance(attributes, dict):
        raise ConfigError(f"{attributes_path} must hold a JSON object keyed by ASIN")
    human = None
    if human_goals:
        if human_path is None:
            raise ConfigError("human_goals=True needs items_human_ins.json (human_path)")
        with open(human_path, encoding="utf-8") as f:
            human = json.load(f)
    products = _load_products(Path(products_path), attributes, human, num_products)
    rng = random.Random(price_seed)
    prices: dict[str, float] = {}
    for p in products:
        pricing = p["pricing"]
        prices[p["asin"]] = 100.0 if not pricing else pricing[0] if len(pricing) == 1 else rng.uniform(*pricing[:2])
    goals = _human_goals(products, prices, rng) if human_goals else _synthetic_goals(products, prices, rng)
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    for i, g in enumerate(goals):
        g["goal_idx"] = i
    attribute_to_asins: dict[str, set[str]] = defaultdict(set)
    for p in products:
        for a in p["Attributes"]:
            attribute_to_asins[a].add(p["asin"])
    return Catalog(products=products, by_asin={p["asin"]: p for p in products}, prices=prices,
                   attribute_to_asins=dict(attribute_to_asins), goals=goals, human_goals=human_goals)
