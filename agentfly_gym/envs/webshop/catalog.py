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
the files' content hash and memory-mapped (:class:`ProductStore`); goals are built when read
(:class:`GoalList`).  What a product or goal holds is unchanged: the same dicts, prices, goal
order and weights as loading everything into Python objects.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import io
import json
import logging
import math
import mmap
import os
import random
import re
import shutil
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ...data.paths import cache_dir
from ...errors import ConfigError, DataNotFoundError
from ...utils.files import staged_dir

__all__ = ["DATA_MARKER", "GOAL_SHUFFLE_SEED", "HOW_TO_GET", "PRICE_RANGE", "STORE_FORMAT", "Catalog", "GoalList", "ProductStore", "catalog_hash",
           "find_data_files", "iter_records", "load_catalog"]

log = logging.getLogger(__name__)

#: Version of the catalog cache's layout (``products.jsonl`` + ``offsets.npy`` + ``meta.json``);
#: part of :func:`catalog_hash`, so a new layout never reads an old cache.
STORE_FORMAT = 1

#: Goal price limits are drawn from these (dollars), as upstream's ``goal.PRICE_RANGE``.
PRICE_RANGE = [10.0 * i for i in range(1, 100)]
#: Upstream's fixed goal shuffle seed (``SimServer.__init__``).
GOAL_SHUFFLE_SEED = 233

_DROPPED_KEYS = ("product_information", "brand", "brand_url", "list_price", "availability_quantity",
                 "availability_status", "total_reviews", "total_answered_questions", "seller_id", "seller_name",
                 "fulfilled_by_amazon", "fast_track_message", "aplus_present", "small_description_old")

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


class ProductStore(Sequence):
    """Products as one buffer of JSON lines (one cleaned product per line), decoded when read.

    A product costs its text in the buffer plus 8 bytes of offset here, instead of the few KB of
    Python objects of a decoded dict; the buffer is a memory map of the catalog cache (pages are
    read from disk when touched and shared by every process that maps the file) or, without a
    cache, a ``bytes`` object.  The dicts of the last ``decoded_cache`` products read are kept,
    so repeated reads return the same object; treat them as read-only.

    Args:
        buffer: the JSON lines (``bytes`` or an ``mmap``).
        offsets: int64 array of ``len(asins) + 1`` byte offsets (product ``i`` is
            ``buffer[offsets[i]:offsets[i + 1]]``).
        asins: the products' ASINs in order.
        decoded_cache: number of decoded products kept (least recently read dropped first).

    Raises:
        ConfigError: offsets and ASINs disagree.
    """

    def __init__(self, buffer: Any, offsets: np.ndarray, asins: list[str], decoded_cache: int = 512) -> None:
        if len(offsets) != len(asins) + 1:
            raise ConfigError(f"catalog store: {len(offsets)} offsets for {len(asins)} products (want {len(asins) + 1})")
        self._buffer = buffer
        self._offsets = offsets
        self.asins = asins
        self.index = {a: i for i, a in enumerate(asins)}
        self._decoded: OrderedDict[int, dict[str, Any]] = OrderedDict()
        self._max_decoded = decoded_cache
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.asins)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self.asins)
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"product index must be an int or a slice, not {type(i).__name__}")
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"product index {i} out of range (catalog of {n} products)")
        with self._lock:
            p = self._decoded.get(i)
            if p is not None:
                self._decoded.move_to_end(i)
                return p
        p = json.loads(self._buffer[int(self._offsets[i]):int(self._offsets[i + 1])])
        with self._lock:
            p = self._decoded.setdefault(i, p)
            self._decoded.move_to_end(i)
            while len(self._decoded) > self._max_decoded:
                self._decoded.popitem(last=False)
        return p

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self.asins)):
            yield self[i]

    def text_bytes(self) -> int:
        """Bytes of the JSON lines: the products' text with their keys and JSON quoting."""
        return int(self._offsets[-1])


class _ByAsin(Mapping):
    """ASIN -> ``get(index)``, read-only."""

    def __init__(self, index: dict[str, int], get: Any) -> None:
        self._index, self._get = index, get

    def __getitem__(self, asin: str) -> Any:
        return self._get(self._index[asin])

    def __contains__(self, asin: object) -> bool:
        return asin in self._index

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


def _clean_product(p: dict[str, Any], attributes: dict[str, Any], human: dict[str, Any] | None) -> dict[str, Any]:
    """One raw record -> upstream's cleaned product (the body of ``load_products``' loop)."""
    asin = p["asin"]
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
    return p


def iter_records(products_path: str | Path) -> Iterator[dict[str, Any]]:
    """The raw product records of a products file (a JSON list), parsed as a stream with ``ijson``.

    Memory stays flat whatever the file's size (upstream's ``items_shuffle.json`` is several GB):
    one record is in memory at a time.  Numbers parse as ``json.load`` parses them (int or float).

    Raises:
        ConfigError: the file does not hold a JSON list.
        ImportError: ``ijson`` is not installed (``pip install agentfly-gym[webshop]``).
        ijson.JSONError: the file is not valid JSON.
    """
    import ijson

    with open(products_path, "rb") as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
        if not head.startswith(b"["):
            kind = "nothing" if not head else "a JSON object" if head.startswith(b"{") else "no JSON list"
            raise ConfigError(f"{products_path} must hold a JSON list of product records, but it holds {kind}")
        f.seek(0)
        yield from ijson.items(f, "item", use_float=True)


def _file_sha256(path: Path, memo: Path | None = None) -> str:
    """sha256 (hex) of a file's bytes.  With ``memo`` (a folder), the digest is remembered under the
    file's identity and state (real path, device, inode, size, mtime and ctime in ns: any write
    changes the ctime), so an unchanged file is not read again."""
    entry = None
    if memo is not None:
        st = os.stat(path)
        state = f"{os.path.realpath(path)}\0{st.st_dev}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"
        entry = memo / hashlib.sha256(state.encode()).hexdigest()
        try:
            digest = entry.read_text().strip()
            if len(digest) == 64:
                return digest
        except OSError:
            pass
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    digest = h.hexdigest()
    if entry is not None:
        try:
            memo.mkdir(parents=True, exist_ok=True)
            tmp = entry.with_name(f".{entry.name}.{os.getpid()}.{threading.get_ident()}")
            tmp.write_text(digest)
            os.replace(tmp, entry)
        except OSError as e:
            log.debug("cannot remember the hash of %s in %s: %s", path, memo, e)
    return digest


def catalog_hash(products_path: str | Path, attributes_path: str | Path, human_path: str | Path | None,
                 num_products: int | None, *, memo: str | os.PathLike | None = None) -> str:
    """sha256 (hex) of the three files' contents, ``num_products`` and the store's format version.

    It changes whenever anything the loaded products depend on changes, and only then (file
    names, folders and modification times do not count).  Hashing reads every byte once
    (about 1.5 GB/s); with ``memo`` (a folder) a file's digest is remembered while the file's
    inode, size, mtime and ctime stay the same.
    """
    memo_dir = Path(memo) if memo is not None else None
    h = hashlib.sha256(f"webshop-catalog-v{STORE_FORMAT}\0{num_products}\0".encode())
    for path in (products_path, attributes_path, human_path):
        h.update((_file_sha256(Path(path), memo_dir) if path is not None else "-").encode() + b"\0")
    return h.hexdigest()


def _write_store(out: BinaryIO, products_path: Path, attributes: dict[str, Any], human: dict[str, Any] | None,
                 num_products: int | None) -> dict[str, Any]:
    """Stream, clean and write the products as JSON lines to ``out``; returns the store's facts."""
    offsets = [0]
    asins: list[str] = []
    pricing: list[list[float]] = []
    attrs: list[list[str]] = []
    categories: list[str] = []
    queries: list[str] = []
    goal_sources: list[list[Any]] = []
    seen: set[str] = set()
    for n, record in enumerate(iter_records(products_path)):
        if num_products is not None and n >= num_products:
            break
        if not isinstance(record, dict):
            continue
        asin = record.get("asin")
        if not isinstance(asin, str) or asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        p = _clean_product(record, attributes, human)
        line = json.dumps(p, ensure_ascii=False).encode("utf-8") + b"\n"
        out.write(line)
        offsets.append(offsets[-1] + len(line))
        goal_sources.extend([len(asins), *src] for src in _goal_sources(p, human is not None))
        asins.append(asin)
        pricing.append(p["pricing"])
        attrs.append(p["Attributes"])
        categories.append(p["category"])
        queries.append(p["query"])
    return {"format": STORE_FORMAT, "offsets": offsets, "asins": asins, "pricing": pricing, "attributes": attrs,
            "categories": categories, "queries": queries, "goal_sources": goal_sources}


def _group(keys: list[Any]) -> dict[Any, np.ndarray]:
    rows: dict[Any, list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        rows[k].append(i)
    return {k: np.asarray(v, dtype=np.int32) for k, v in rows.items()}


def _open_cached_store(folder: Path) -> tuple[ProductStore, dict[str, Any]]:
    with open(folder / "meta.json", encoding="utf-8") as f:
        meta = json.load(f)
    if meta.get("format") != STORE_FORMAT:
        raise ConfigError(f"catalog cache {folder} has format {meta.get('format')!r}, not {STORE_FORMAT}")
    offsets = np.load(folder / "offsets.npy")
    with open(folder / "products.jsonl", "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size != int(offsets[-1]):
            raise ConfigError(f"catalog cache {folder}: products.jsonl holds {size} bytes, its offsets say "
                              f"{int(offsets[-1])}")
        buffer: Any = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    return ProductStore(buffer, offsets, meta["asins"]), meta


def _build_cached_store(root: Path, key: str, products_path: Path, attributes: dict[str, Any],
                        human: dict[str, Any] | None, num_products: int | None) -> Path:
    """Write the store to ``root/<key>``: built in a temporary folder, renamed when complete."""
    final = root / key
    with staged_dir(final, complete="meta.json", prefix=f".{key[:16]}.") as tmp:
        with open(tmp / "products.jsonl", "wb") as f:
            meta = _write_store(f, products_path, attributes, human, num_products)
        np.save(tmp / "offsets.npy", np.asarray(meta.pop("offsets"), dtype=np.int64))
        with open(tmp / "meta.json", "w", encoding="utf-8") as f:
            json.dump(meta, f, ensure_ascii=False)
    return final


def _read_json(path: str | Path, kind: type, what: str) -> Any:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, kind):
        raise ConfigError(f"{path} must hold a JSON {'object keyed by ASIN' if kind is dict else 'list'} ({what}), "
                          f"got {type(data).__name__}")
    return data


def _load_store(products_path: Path, attributes_path: str | Path, human_path: str | Path | None,
                num_products: int | None, key: str,
                cache: Path | None) -> tuple[ProductStore, dict[str, Any], Path | None]:
    """The cached store of ``key``, else a new one (cached when possible).  The attribute and
    human files are read only when the store is built."""
    if cache is not None and (cache / key / "meta.json").is_file():
        try:
            store, meta = _open_cached_store(cache / key)
            return store, meta, cache / key
        except (OSError, ValueError, KeyError, ConfigError) as e:
            log.warning("WebShop catalog cache %s is unreadable (%s); rebuilding it", cache / key, e)
            shutil.rmtree(cache / key, ignore_errors=True)
    attributes = _read_json(attributes_path, dict, "attributes")
    human = _read_json(human_path, dict, "human instructions") if human_path is not None else None
    if cache is not None:
        try:
            folder = _build_cached_store(cache, key, products_path, attributes, human, num_products)
            store, meta = _open_cached_store(folder)
            return store, meta, folder
        except OSError as e:
            log.warning("WebShop catalog cache %s cannot be written (%s); keeping the catalog in memory", cache, e)
    buf = io.BytesIO()
    meta = _write_store(buf, products_path, attributes, human, num_products)
    store = ProductStore(buf.getvalue(), np.asarray(meta.pop("offsets"), dtype=np.int64), meta["asins"])
    return store, meta, None


def _price_limit(rng: random.Random, price: float) -> tuple[float, str]:
    start = bisect.bisect_right(PRICE_RANGE, price)  # PRICE_RANGE is sorted: the first four values above price
    candidates = PRICE_RANGE[start:start + 4]
    if len(candidates) >= 2:
        _, upper = sorted(rng.sample(candidates, 2))
        return upper, f", and price lower than {upper:.2f} dollars"
    return 1000000, ""


def _price_text(upper: float) -> str:
    return "" if upper == 1000000 else f", and price lower than {upper:.2f} dollars"


class GoalList(Sequence):
    """The shuffled goals, built when read: a read-only sequence of goal dicts.

    Holds per goal only its product row, a sub-index (the option combination of a synthetic goal,
    the instruction of a human one), its price limit and its weight (about 30 bytes, instead of
    the ~1 KB of a goal dict); ``goals[i]`` decodes the product and builds the dict that upstream's
    ``get_synthetic_goals`` / ``get_human_goals`` would have put at position ``i`` after the
    shuffle, with ``goal_idx = i``.  The dicts of the last 512 goals read are kept.

    Keys of a goal: ``asin``, ``category``, ``query``, ``name``, ``product_category``,
    ``instruction_text``, ``attributes``, ``price_upper`` (dollars; 1000000 when the product's
    price leaves no limit to draw), ``goal_options`` (dict name -> value for synthetic goals, the
    instruction's option list for human ones), ``weight``, ``goal_idx``.
    """

    def __init__(self, products: ProductStore, human: bool, rows: np.ndarray, subs: np.ndarray, uppers: np.ndarray,
                 weights: np.ndarray, order: np.ndarray) -> None:
        self._products, self._human = products, human
        self._rows, self._subs, self._uppers, self._weights, self._order = rows, subs, uppers, weights, order
        self._built: OrderedDict[int, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._order)

    def weights(self) -> list[float]:
        """``[goal["weight"] for goal in self]`` without building the goals."""
        return [float(w) for w in self._weights[self._order]]

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"goal index must be an int or a slice, not {type(i).__name__}")
        n = len(self._order)
        i = int(i) + (n if i < 0 else 0)
        if not 0 <= i < n:
            raise IndexError(f"goal index {i} out of range ({n} goals)")
        with self._lock:
            g = self._built.get(i)
            if g is not None:
                self._built.move_to_end(i)
                return g
        g = self._build(i)
        with self._lock:
            g = self._built.setdefault(i, g)
            while len(self._built) > 512:
                self._built.popitem(last=False)
        return g

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self._order)):
            yield self[i]

    def _build(self, i: int) -> dict[str, Any]:
        k = int(self._order[i])
        p = self._products[int(self._rows[k])]
        sub = int(self._subs[k])
        upper: float = float(self._uppers[k])
        if upper == 1000000:
            upper = 1000000  # upstream's int
        weight: float = float(self._weights[k])
        if self._human:
            ins = p["instructions"][sub]
            g = {"asin": p["asin"], "category": p["category"], "query": p["query"], "name": p["name"],
                 "product_category": p["product_category"],
                 "instruction_text": ins["instruction"].strip(".") + _price_text(upper),
                 "attributes": ins.get("instruction_attributes") or [], "price_upper": upper,
                 "goal_options": ins.get("instruction_options") or [], "weight": 1}
        else:
            names = sorted(p["options"])
            goal_options: dict[str, str] = {}
            rest = sub
            for name in reversed(names):  # itertools.product varies the last option fastest
                values = p["options"][name]
                rest, j = divmod(rest, len(values))
                goal_options[name] = values[j]
            goal_options = {name: goal_options[name] for name in names}
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = " with " + option_text if option_text else ""
            g = {"asin": p["asin"], "category": p["category"], "query": p["query"], "name": p["Title"],
                 "product_category": p["product_category"],
                 "instruction_text": f"{p['instruction_text']}{option_text}{_price_text(upper)}",
                 "attributes": p["instruction_attributes"] or [], "price_upper": upper, "goal_options": goal_options,
                 "weight": weight}
        g["goal_idx"] = i
        return g


def _goal_sources(p: dict[str, Any], human: bool) -> list[list[Any]]:
    """[sub-index, attributes, combinations] of each goal source of a cleaned product."""
    if human:
        return [[k, ins.get("instruction_attributes") or [], 1] for k, ins in enumerate(p.get("instructions") or ())
                if ins.get("instruction_attributes")]
    attrs = p.get("instruction_attributes") or []
    if p.get("instruction_text") is None or not attrs:
        return []
    return [[0, attrs, math.prod(len(v) for v in p["options"].values())]]


def _make_goals(products: ProductStore, human: bool, sources: list[list[Any]], prices: np.ndarray,
                rng: random.Random) -> GoalList:
    """Upstream's goal list, price draws and shuffle, as :class:`GoalList` indices.

    ``sources``: [row, sub-index, attributes, combinations] in catalog order (``_goal_sources``).
    The price limits are drawn in upstream's order (one per synthetic product, one per human
    instruction); shuffling the goal indices permutes exactly as shuffling the goal dicts.
    """
    rows: list[int] = []
    subs: list[int] = []
    uppers: list[float] = []
    per_source: list[tuple[int, list[str]]] = []
    counts: dict[str, int] = defaultdict(int)
    for row, sub, attrs, combos in sources:
        upper, _ = _price_limit(rng, float(prices[row]))
        if human:
            rows.append(row)
            subs.append(sub)
            uppers.append(upper)
            continue
        rows.extend([row] * combos)
        subs.extend(range(combos))
        uppers.extend([upper] * combos)
        per_source.append((combos, attrs))
        for a in attrs:
            counts[a] += combos
    if human:
        weights = np.ones(len(rows), dtype=np.float64)
    else:
        weights = np.empty(len(rows), dtype=np.float64)
        at = 0
        for combos, attrs in per_source:
            weights[at:at + combos] = sum(1.0 / counts[a] for a in attrs) / len(attrs)
            at += combos
    order = list(range(len(rows)))
    random.Random(GOAL_SHUFFLE_SEED).shuffle(order)
    return GoalList(products, human, np.asarray(rows, dtype=np.int32), np.asarray(subs, dtype=np.int32),
                    np.asarray(uppers, dtype=np.float64), weights, np.asarray(order, dtype=np.int64))


def _prices_and_goals(store: ProductStore, meta: dict[str, Any], human: bool, price_seed: int,
                      cache_path: Path | None) -> tuple[np.ndarray, GoalList]:
    """Draw the prices and build the goals; with a cache folder, remember both per seed (the
    draws and the shuffle are the bulk of a second start) and read them back next time."""
    arrays = ("prices", "rows", "subs", "uppers", "weights", "order")
    saved = cache_path / f"goals-{'human' if human else 'synthetic'}-seed{int(price_seed)}.npz" if cache_path else None
    if saved is not None and saved.is_file():
        try:
            with np.load(saved) as z:
                a = {k: z[k] for k in arrays}
            if len(a["prices"]) == len(store) and len(a["order"]) == len(a["rows"]):
                return a["prices"], GoalList(store, human, a["rows"], a["subs"], a["uppers"], a["weights"], a["order"])
        except (OSError, ValueError, KeyError) as e:
            log.warning("cached WebShop goals %s are unreadable (%s); drawing them again", saved, e)
    rng = random.Random(price_seed)
    prices = np.empty(len(store), dtype=np.float64)
    for i, pricing in enumerate(meta["pricing"]):
        prices[i] = 100.0 if not pricing else pricing[0] if len(pricing) == 1 else rng.uniform(*pricing[:2])
    goals = _make_goals(store, human, meta["goal_sources"], prices, rng)
    if saved is not None:
        tmp = saved.with_name(f".{saved.stem}.{os.getpid()}.{threading.get_ident()}.npz")
        try:
            np.savez(tmp, prices=prices, rows=goals._rows, subs=goals._subs, uppers=goals._uppers,
                     weights=goals._weights, order=goals._order)
            os.replace(tmp, saved)
        except OSError as e:
            log.warning("cannot cache WebShop goals in %s: %s", saved, e)
            tmp.unlink(missing_ok=True)
    return prices, goals


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
    if num_products is not None and (isinstance(num_products, bool) or not isinstance(num_products, int)
                                     or num_products < 1):
        raise ConfigError(f"num_products={num_products!r} must be None or an integer >= 1")
    if human_goals and human_path is None:
        raise ConfigError("human_goals=True needs items_human_ins.json (human_path)")
    human_path = human_path if human_goals else None
    folder = None if cache is False else cache_dir("webshop-index", "catalog") if cache is True else Path(cache)
    key = catalog_hash(products_path, attributes_path, human_path, num_products,
                       memo=folder / "file-hashes" if folder is not None else None)
    store, meta, cache_path = _load_store(Path(products_path), attributes_path, human_path, num_products, key, folder)
    prices, goals = _prices_and_goals(store, meta, bool(human_goals), price_seed, cache_path)
    attribute_rows: dict[str, list[int]] = defaultdict(list)
    for i, attrs in enumerate(meta["attributes"]):
        for a in attrs:
            attribute_rows[a].append(i)
    return Catalog(products=store, by_asin=_ByAsin(store.index, store.__getitem__),
                   prices=_ByAsin(store.index, lambda i: float(prices[i])),
                   attribute_index={a: np.asarray(sorted(set(r)), dtype=np.int32) for a, r in attribute_rows.items()},
                   category_index=_group(meta["categories"]), query_index=_group(meta["queries"]),
                   goals=goals, human_goals=bool(human_goals), content_hash=key, cache_path=cache_path)
