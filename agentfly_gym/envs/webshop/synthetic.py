"""A synthetic WebShop catalog of any size, grown from a real sample, for scale measurements.

WebShop trains on about 1.18 M scraped products (``items_shuffle.json``, several GB); the project
keeps only a small sample.  :func:`write_synthetic_catalog` writes files in upstream's formats
(a products file like ``items_shuffle*.json`` and an attribute file like ``items_ins_v2*.json``)
with ``n`` products, each a variation of a random sample product (its template):

- ``asin``: unique, ``"B0"`` + 8 upper-case letters and digits;
- ``name`` (title): a brand from a pool of about ``n / 20`` invented brands, the template's title
  with about one word in five replaced by a title word of another sample product, and a model
  code (``"XR-4821"``) on one product in three, so the vocabulary grows with ``n`` as in a real
  catalog;
- ``full_description`` and ``small_description`` (bullets): the template's sentences / bullets,
  shuffled, some dropped, sometimes one borrowed from another product;
- ``pricing``: the template's price (one price or a range, as the template) times a log-normal
  factor (sigma 0.35), in upstream's ``"$12.34"`` / ``"$12.34$23.45"`` text;
- ``customization_options``: the template's option names, each with a random non-empty subset
  (at most 6) of the template's values in their order;
- attributes: the template's, shuffled, sometimes one dropped and sometimes one from another
  product added; products whose template has an instruction keep that instruction and its
  ``instruction_attributes`` (all of which are kept among the attributes, so a goal can be met);
- every other field (``product_category``, ``category``, ``query``, ``images``, the scraped fields
  that the loader drops) is the template's, so the file's size per product is realistic.

Deterministic: the same sample, ``n`` and ``seed`` give byte-identical files.  The products file
is written as a stream (one record at a time), so ``n`` is bounded by disk, not memory.
"""

from __future__ import annotations

import json
import os
import random
import re
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ...limits import check_int

__all__ = ["SAMPLE_ATTRIBUTES", "SAMPLE_PRODUCTS", "iter_synthetic_products", "write_synthetic_catalog"]

#: The sample files of the project's data folder (see its README).
SAMPLE_PRODUCTS = "items_shuffle_sample.json"
SAMPLE_ATTRIBUTES = "items_ins_v2_1000.json"

_SYLLABLES = ("ka", "lo", "ri", "ven", "tor", "sa", "mi", "no", "zu", "pel", "qua", "dex", "lin", "ora", "bel",
              "tek", "vi", "ra", "mon", "gar")
_MAX_OPTION_VALUES = 6


def _split_sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]


class _Pools:
    """Words, sentences, bullets and attributes of the whole sample, to borrow from."""

    def __init__(self, products: list[dict[str, Any]], attributes: dict[str, Any]) -> None:
        self.title_words = sorted({w for p in products for w in str(p.get("name", "")).split() if w.isalpha()})
        self.sentences = [s for p in products for s in _split_sentences(str(p.get("full_description") or ""))]
        self.bullets = [b for p in products for b in (p.get("small_description") or []) if isinstance(b, str) and b]
        self.attributes = sorted({a for p in products for a in (attributes.get(p["asin"]) or {}).get("attributes", [])})


def _brand(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


def _asin(rng: random.Random, seen: set[str]) -> str:
    alphabet = string.ascii_uppercase + string.digits
    while True:
        a = "B0" + "".join(rng.choice(alphabet) for _ in range(8))
        if a not in seen:
            seen.add(a)
            return a


def _price_text(template: Any, rng: random.Random) -> str:
    prices = [float(x) for x in re.findall(r"\$([\d,]*\.?\d+)", str(template or "").replace(",", ""))]
    if not prices:
        return "" if rng.random() < 0.5 else f"${rng.uniform(5, 80):.2f}"
    factor = rng.lognormvariate(0.0, 0.35)
    return "".join(f"${max(0.5, x * factor):.2f}" for x in prices[:2])


def _title(template: str, brands: list[str], pools: _Pools, rng: random.Random) -> str:
    words = template.split()
    words = [rng.choice(pools.title_words) if (w.isalpha() and pools.title_words and rng.random() < 0.2) else w
             for w in words]
    parts = [rng.choice(brands), *words]
    if rng.random() < 1 / 3:
        parts.append(f"{rng.choice(string.ascii_uppercase)}{rng.choice(string.ascii_uppercase)}-{rng.randint(100, 9999)}")
    return " ".join(parts)


def _shuffled_subset(items: list[Any], rng: random.Random, borrow: list[Any]) -> list[Any]:
    out = list(items)
    rng.shuffle(out)
    if len(out) > 1 and rng.random() < 0.3:
        out.pop()
    if borrow and rng.random() < 0.3:
        out.insert(rng.randint(0, len(out)), rng.choice(borrow))
    return out


def _options(template: Any, rng: random.Random) -> Any:
    if not isinstance(template, dict) or not template:
        return template
    out: dict[str, Any] = {}
    for name, values in template.items():
        if not values:
            out[name] = values
            continue
        k = rng.randint(1, min(len(values), _MAX_OPTION_VALUES))
        keep = sorted(rng.sample(range(len(values)), k))
        out[name] = [values[i] for i in keep]
    return out


def _attributes(template: dict[str, Any], pools: _Pools, rng: random.Random) -> dict[str, Any]:
    attrs = list(template.get("attributes") or [])
    required = list(template.get("instruction_attributes") or []) if template.get("instruction") else []
    rng.shuffle(attrs)
    if len(attrs) > 1 and rng.random() < 0.3:
        dropped = attrs.pop()
        if dropped in required:
            attrs.append(dropped)
    if pools.attributes and rng.random() < 0.3:
        extra = rng.choice(pools.attributes)
        if extra not in attrs:
            attrs.append(extra)
    entry: dict[str, Any] = {"attributes": attrs}
    if template.get("instruction"):
        entry["instruction"] = template["instruction"]
        entry["instruction_attributes"] = list(template.get("instruction_attributes") or [])
    return entry


def iter_synthetic_products(sample_products: list[dict[str, Any]], sample_attributes: dict[str, Any], n: int,
                            seed: int = 0) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """Yield ``n`` (product record, attribute entry) pairs grown from the sample (module docstring).

    Args:
        sample_products: raw product records (``items_shuffle*.json``); each needs an ``asin``.
        sample_attributes: the attribute file's object (ASIN -> ``{"attributes": [...], ...}``).
        n: number of products (>= 1).
        seed: seed of every random choice.

    Raises:
        ConfigError: ``n`` < 1 or an empty sample.
    """
    check_int("n", n)
    templates = [p for p in sample_products if isinstance(p.get("asin"), str)]
    if not templates:
        raise ConfigError("the sample holds no product record with an asin")
    rng = random.Random(seed)
    pools = _Pools(templates, sample_attributes)
    brands = sorted({_brand(rng) for _ in range(max(4, n // 20))})
    seen: set[str] = set()
    for _ in range(n):
        t = rng.choice(templates)
        p = dict(t)
        p["asin"] = _asin(rng, seen)
        p["name"] = _title(str(t.get("name", "")), brands, pools, rng)
        p["full_description"] = " ".join(_shuffled_subset(_split_sentences(str(t.get("full_description") or "")),
                                                          rng, pools.sentences))
        bullets = t.get("small_description")
        if isinstance(bullets, list):
            p["small_description"] = _shuffled_subset(bullets, rng, pools.bullets)
        p["pricing"] = _price_text(t.get("pricing"), rng)
        p["customization_options"] = _options(t.get("customization_options"), rng)
        yield p, _attributes(sample_attributes.get(t["asin"]) or {}, pools, rng)


def write_synthetic_catalog(sample_dir: str | os.PathLike, out_dir: str | os.PathLike, n: int, *, seed: int = 0,
                            products_name: str | None = None,
                            attributes_name: str | None = None) -> tuple[Path, Path]:
    """Write an ``n``-product synthetic catalog grown from the sample in ``sample_dir``.

    Args:
        sample_dir: folder holding ``items_shuffle_sample.json`` (or any ``items_shuffle*.json``) and
            ``items_ins_v2_1000.json`` (or any ``items_ins_v2*.json``).
        out_dir: folder for the two files (created if missing).
        n: number of products.
        seed: seed of the generator.
        products_name, attributes_name: file names; default ``items_shuffle_synth_<n>.json`` and
            ``items_ins_v2_synth_<n>.json``.

    Returns:
        (products file, attribute file).  Each is written to a temporary name and renamed when
        complete, so a reader never sees half a file.

    Raises:
        DataNotFoundError: no sample files in ``sample_dir``.
        ConfigError: bad ``n`` or an empty sample.
    """
    from .catalog import find_data_files

    sample = Path(sample_dir)
    products_file = SAMPLE_PRODUCTS if (sample / SAMPLE_PRODUCTS).is_file() else None
    products_path, attributes_path, _ = find_data_files(sample, products_file=products_file, human_goals=False)
    with open(products_path, encoding="utf-8") as f:
        sample_products = json.load(f)
    with open(attributes_path, encoding="utf-8") as f:
        sample_attributes = json.load(f)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    p_out = out / (products_name or f"items_shuffle_synth_{n}.json")
    a_out = out / (attributes_name or f"items_ins_v2_synth_{n}.json")
    p_tmp, a_tmp = p_out.with_name(p_out.name + f".tmp{os.getpid()}"), a_out.with_name(a_out.name + f".tmp{os.getpid()}")
    attributes: dict[str, Any] = {}
    try:
        with open(p_tmp, "w", encoding="utf-8") as f:
            f.write("[")
            for i, (product, entry) in enumerate(iter_synthetic_products(sample_products, sample_attributes, n, seed)):
                if i:
                    f.write(", ")
                f.write(json.dumps(product))
                attributes[product["asin"]] = entry
            f.write("]")
        with open(a_tmp, "w", encoding="utf-8") as f:
            json.dump(attributes, f)
        os.replace(p_tmp, p_out)
        os.replace(a_tmp, a_out)
    finally:
        for tmp in (p_tmp, a_tmp):
            tmp.unlink(missing_ok=True)
    return p_out, a_out
