"""WebShop's products as upstream's ``engine.load_products`` cleans them, kept as JSON lines on disk.

Source: princeton-nlp/WebShop (MIT), ``web_agent_site/engine/engine.py`` (``load_products``,
``clean_product_keys``), re-implemented.  The products file is parsed as a stream (:func:`iter_records`); each
cleaned product is one JSON line of a store keyed by the files' content hash (:func:`catalog_hash`), memory-mapped
and decoded when read (:class:`ProductStore`).  The catalog (:mod:`.catalog`) is built on it.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import mmap
import os
import re
import shutil
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ...errors import ConfigError
from ...utils.files import staged_dir

__all__ = ["STORE_FORMAT", "ByAsin", "ProductStore", "catalog_hash", "group_rows", "iter_records", "load_store"]

log = logging.getLogger(__name__)

#: Version of the catalog cache's layout (``products.jsonl`` + ``offsets.npy`` + ``meta.json``);
#: part of :func:`catalog_hash`, so a new layout never reads an old cache.
STORE_FORMAT = 1

_DROPPED_KEYS = ("product_information", "brand", "brand_url", "list_price", "availability_quantity",
                 "availability_status", "total_reviews", "total_answered_questions", "seller_id", "seller_name",
                 "fulfilled_by_amazon", "fast_track_message", "aplus_present", "small_description_old")


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


class ByAsin(Mapping):
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


def group_rows(keys: list[Any]) -> dict[Any, np.ndarray]:
    """Key -> the rows (int32, ascending) of ``keys`` that hold it (the category and query indices)."""
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


def load_store(products_path: Path, attributes_path: str | Path, human_path: str | Path | None,
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


def _goal_sources(p: dict[str, Any], human: bool) -> list[list[Any]]:
    """[sub-index, attributes, combinations] of each goal source of a cleaned product."""
    if human:
        return [[k, ins.get("instruction_attributes") or [], 1] for k, ins in enumerate(p.get("instructions") or ())
                if ins.get("instruction_attributes")]
    attrs = p.get("instruction_attributes") or []
    if p.get("instruction_text") is None or not attrs:
        return []
    return [[0, attrs, math.prod(len(v) for v in p["options"].values())]]
