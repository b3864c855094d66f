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

Scale (upstream's full catalog is about 1.18 M products in a multi-GB file): the products file is
parsed as a stream, and the cleaned products are kept as JSON lines in an on-disk cache keyed by
the files' content hash and memory-mapped (:class:`~.store.ProductStore`, :mod:`.store`); goals are built
when read (:class:`~.goals.GoalList`, :mod:`.goals`).  What a product or goal holds is unchanged: the same dicts, prices, goal
order and weights as loading everything into Python objects.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ...data.paths import cache_dir
from ...errors import ConfigError, DataNotFoundError
from ...limits import check_int
from .goals import GoalList, prices_and_goals
from .store import ProductStore, ByAsin, group_rows, load_store, catalog_hash

__all__ = ["DATA_MARKER", "HOW_TO_GET", "Catalog", "find_data_files", "load_catalog"]

log = logging.getLogger(__name__)

HOW_TO_GET = ("Run `agentfly-gym data download webshop-small` (1,000 products) or `... webshop` (the full "
              "catalog), or use WebShop's own setup script (clone https://github.com/princeton-nlp/WebShop, run "
              "`./setup.sh -d small`) and point this environment at its data/ folder.")
#: What makes a folder a WebShop data folder for the lookup (:func:`agentfly_gym.data.paths.resolve_data_dir`):
#: an attribute file, which every WebShop data set has (a cache folder of the same name has none).
DATA_MARKER = "items_ins_v2*.json"

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


@dataclasses.dataclass
class Catalog:
    """The loaded catalog.  Read-only after :func:`load_catalog`.

    Attributes:
        products: product dicts in file order with upstream's keys (``asin``, ``Title``,
            ``Description``, ``BulletPoints``, ``Price``, ``pricing``, ``options`` (name -> values),
            ``Attributes``, ``category``, ``query``, ``product_category``, ``name``, ...), as a
            :class:`ProductStore`: a read-only sequence that decodes a product when it is read.
        by_asin: ASIN -> product (a read-only mapping over ``products``).
        prices: ASIN -> the price in dollars used by the reward (a draw inside ranged prices).
        attribute_index: attribute -> indices into ``products`` of the products that have it,
            ascending (upstream's ``attribute_to_asins``, kept as indices).
        category_index, query_index: ``category`` / lower-cased ``query`` -> product indices,
            ascending (the ``<c>`` and ``<q>`` searches).
        goals: the shuffled goals (upstream's order: goal index = task id), a :class:`GoalList`
            that builds a goal dict when it is read.
        human_goals: whether the goals are human instructions.
        content_hash: sha256 (hex) of the files and settings the catalog was built from
            (:func:`catalog_hash`); it keys the on-disk caches of the catalog and its search index.
        cache_path: the cache folder the products are read from, or None (held in memory).
    """

    products: ProductStore
    by_asin: Mapping[str, dict[str, Any]]
    prices: Mapping[str, float]
    attribute_index: dict[str, np.ndarray]
    category_index: dict[str, np.ndarray]
    query_index: dict[str, np.ndarray]
    goals: GoalList
    human_goals: bool
    content_hash: str = ""
    cache_path: Path | None = None

    @property
    def attribute_to_asins(self) -> dict[str, set[str]]:
        """attribute -> ASINs that have it (upstream's ``attribute_to_asins``; built on each call)."""
        asins = self.products.asins
        return {a: {asins[i] for i in idx} for a, idx in self.attribute_index.items()}


def load_catalog(products_path: str | Path, attributes_path: str | Path, human_path: str | Path | None = None, *,
                 num_products: int | None = None, human_goals: bool = True, price_seed: int = 42,
                 cache: bool | str | os.PathLike = True) -> Catalog:
    """Load products and goals as upstream's ``load_products`` + ``get_goals`` + the goal shuffle.

    The products file is parsed as a stream (:func:`iter_records`), cleaned as upstream cleans
    it and written as JSON lines to the catalog cache, ``<cache>/<content hash>/`` (default
    ``agentfly_gym.data.paths.cache_dir("webshop-index", "catalog")``); a later load of the same files
    (:func:`catalog_hash`) maps that cache instead of parsing again.  The cache is written to a
    temporary folder and renamed when complete, so concurrent loaders never read half of it; an
    unreadable cache is rebuilt, and an unwritable one leaves the catalog in memory (a warning).

    Args:
        products_path: ``items_shuffle*.json``.
        attributes_path: ``items_ins_v2*.json``.
        human_path: ``items_human_ins.json``; required when ``human_goals``.
        num_products: keep only the first N product records (upstream's ``num_products``).
        human_goals: human instructions (True) or synthetic ones from the attribute file (False).
        price_seed: seed of the price draws (see the module docstring).
        cache: True (the default folder), a folder, or False (parse every time, products held in
            memory as JSON lines).

    Raises:
        ConfigError: a file has the wrong structure, or ``human_goals`` without ``human_path``.
        OSError / json.JSONDecodeError / ijson.JSONError: a file cannot be read or parsed.
    """
    check_int("num_products", num_products, optional=True)
    if human_goals and human_path is None:
        raise ConfigError("human_goals=True needs items_human_ins.json (human_path)")
    human_path = human_path if human_goals else None
    folder = None if cache is False else cache_dir("webshop-index", "catalog") if cache is True else Path(cache)
    key = catalog_hash(products_path, attributes_path, human_path, num_products,
                       memo=folder / "file-hashes" if folder is not None else None)
    store, meta, cache_path = load_store(Path(products_path), attributes_path, human_path, num_products, key, folder)
    prices, goals = prices_and_goals(store, meta, bool(human_goals), price_seed, cache_path)
    attribute_rows: dict[str, list[int]] = defaultdict(list)
    for i, attrs in enumerate(meta["attributes"]):
        for a in attrs:
            attribute_rows[a].append(i)
    return Catalog(products=store, by_asin=ByAsin(store.index, store.__getitem__),
                   prices=ByAsin(store.index, lambda i: float(prices[i])),
                   attribute_index={a: np.asarray(sorted(set(r)), dtype=np.int32) for a, r in attribute_rows.items()},
                   category_index=group_rows(meta["categories"]), query_index=group_rows(meta["queries"]),
                   goals=goals, human_goals=bool(human_goals), content_hash=key, cache_path=cache_path)
