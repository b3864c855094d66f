"""WebShop's goals as upstream's ``goal.get_goals`` and the goal shuffle make them, built when read.

Source: princeton-nlp/WebShop (MIT), ``web_agent_site/engine/goal.py`` (``get_human_goals``,
``get_synthetic_goals``) and ``engine.generate_product_prices``, re-implemented; the price draws come from
``random.Random(price_seed)`` and the shuffle from ``random.Random(GOAL_SHUFFLE_SEED)`` (see :mod:`.catalog` for
why).  :class:`GoalList` keeps a goal as a few numbers and builds its dict when it is read.
"""

from __future__ import annotations

import bisect
import logging
import os
import random
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .store import ProductStore

__all__ = ["GOAL_SHUFFLE_SEED", "PRICE_RANGE", "GoalList", "prices_and_goals"]

log = logging.getLogger(__name__)

#: Goal price limits are drawn from these (dollars), as upstream's ``goal.PRICE_RANGE``.
PRICE_RANGE = [10.0 * i for i in range(1, 100)]

#: Upstream's fixed goal shuffle seed (``SimServer.__init__``).
GOAL_SHUFFLE_SEED = 233


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


def prices_and_goals(store: ProductStore, meta: dict[str, Any], human: bool, price_seed: int,
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
