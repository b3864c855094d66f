"""The WebShop server: catalog, search index, spaCy model and goals loaded once, many sessions.

It plays the role of upstream's ``SimServer`` + ``SimBrowser`` (princeton-nlp/WebShop,
``web_agent_site/envs/web_agent_text_env.py``): each session (one rollout) has its own page state;
actions are upstream's ``search[...]`` / ``click[...]`` with upstream's transitions.

Thread safety: the catalog, index and goals are read-only after construction; sessions live in a
dict guarded by a lock and each session is only touched by its own rollout.  Environments reach
one shared server as a *global* resource (``InProcessSpec(factory=SERVER_FACTORY)``) through a
:class:`WebShopServerProxy`; ``isolation="process"`` runs the same server in a child process.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import random
import re
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from ...data.paths import cache_dir
from ...errors import ConfigError, EnvError
from ...resources.inprocess import ObjectProxy, forward
from .catalog import Catalog, load_catalog
from .pages import (
    BACK_TO_SEARCH,
    END_BUTTON,
    NEXT_PAGE,
    PREV_PAGE,
    PRODUCT_WINDOW,
    SUB_PAGES,
    Page,
    render_done,
    render_index,
    render_item,
    render_results,
    render_sub_page,
    to_text,
)
from .reward import DEFAULT_SPACY_MODEL, SpacyNouns, get_reward
from .search import SEARCH_RETURN_N, ProductSearch

__all__ = ["OBSERVATION_MODES", "SERVER_FACTORY", "SPLITS", "WebShopServer", "WebShopServerProxy", "parse_action"]

log = logging.getLogger(__name__)

#: Goal index ranges of upstream's ``baseline_models/env.py`` (used when the whole catalog is loaded).
SPLITS = {"test": (0, 500), "eval": (500, 1500), "validation": (500, 1500), "train": (1500, None)}
OBSERVATION_MODES = ("text", "text_rich")
#: The ``InProcessSpec`` factory of the server.
SERVER_FACTORY = "agentfly_gym.envs.webshop.server:WebShopServer"
SEARCH_BAR_ACTION = "search[<your query>]"


def parse_action(action: str) -> tuple[str, str | None]:
    """``"click[Buy Now]"`` -> ``("click", "Buy Now")``; no brackets -> ``(action, None)`` (upstream's ``parse_action``).

    Returns exactly what upstream's ``re.compile(r'(.+)\\[(.+)\\]').match(action)`` gives (pinned by a
    property test), in time linear in ``len(action)``: the regex backtracks quadratically (31 s on
    ``"[" * 65536``, holding the GIL).  Its semantics: within the first line, the name is everything
    before the last ``[`` that has at least one character and then a ``]`` after it, the argument runs
    from there to the line's last ``]``.
    """
    nl = action.find("\n")
    line = action if nl < 0 else action[:nl]
    close = line.rfind("]")
    open_ = line.rfind("[", 1, max(close - 1, 0))
    if close < 0 or open_ < 1:
        return action, None
    return line[:open_], line[open_ + 1:close]


@dataclasses.dataclass
class _Session:
    goal: dict[str, Any]
    mode: str
    rng: random.Random
    kind: str = "index"
    keywords: list[str] | None = None
    page_num: int | None = None
    asin: str | None = None
    asins: set[str] = dataclasses.field(default_factory=set)
    options: dict[str, str] = dataclasses.field(default_factory=dict)
    actions: dict[str, int] = dataclasses.field(default_factory=lambda: defaultdict(int))
    results: list[str] = dataclasses.field(default_factory=list)  # ASINs
    page: Page | None = None
    done: bool = False
    reward: float = 0.0
    reward_info: dict[str, Any] | None = None
    plan: tuple[str, int | None] | None = None


class WebShopServer:
    """WebShop's shop for many concurrent sessions.

    Args:
        products_path, attributes_path, human_path: data files (see :mod:`.catalog`).
        num_products: keep the first N product records.
        human_goals: human instructions (needs ``human_path``) or synthetic ones.
        show_attrs: show the "Attributes" button on item pages (upstream's ``show_attrs``).
        price_seed: seed of the price draws.
        spacy_model: spaCy model for the reward's type match.
        search_requires_search_bar: refuse ``search[...]`` on pages without the search bar
            (upstream's text env accepts a search from any page; default False).
        cache: where the parsed catalog and its search index are cached, keyed by the catalog's
            content hash: True (``agentfly_gym.data.paths.cache_dir("webshop-index")``, subfolders ``catalog``
            and ``bm25``), a folder (the same subfolders in it), or False (nothing written; every
            start parses and indexes again).  See :func:`.catalog.load_catalog`.

    Raises:
        ConfigError, OSError, ImportError: bad data or a missing dependency.
    """

    def __init__(self, products_path: str, attributes_path: str, human_path: str | None = None, *,
                 num_products: int | None = None, human_goals: bool = False, show_attrs: bool = False,
                 price_seed: int = 42, spacy_model: str = DEFAULT_SPACY_MODEL,
                 search_requires_search_bar: bool = False, cache: bool | str | os.PathLike = True) -> None:
        t0 = time.perf_counter()
        root = None if cache is False else cache_dir("webshop-index") if cache is True else Path(cache)
        self.catalog: Catalog = load_catalog(products_path, attributes_path, human_path, num_products=num_products,
                                             human_goals=human_goals, price_seed=price_seed,
                                             cache=False if root is None else root / "catalog")
        index_cache = None if root is None else root / "bm25"
        self.search_engine = ProductSearch(self.catalog.products, cache=index_cache, key=self.catalog.content_hash)
        self.nouns = SpacyNouns(spacy_model)
        self.show_attrs = show_attrs
        self.search_requires_search_bar = search_requires_search_bar
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()
        self._instruction_index: tuple[dict[str, int], dict[str, int]] | None = None
        self.load_seconds = time.perf_counter() - t0
        log.info("WebShop server: %d products, %d goals, loaded in %.1fs", len(self.catalog.products),
                 len(self.catalog.goals), self.load_seconds)

    # ------------------------------------------------------------------ catalog facts
    def num_goals(self) -> int:
        """Number of goals (task ids are ``0 .. num_goals()-1``)."""
        return len(self.catalog.goals)

    def goal(self, idx: int) -> dict[str, Any]:
        """A copy of goal ``idx`` (asin, instruction_text, attributes, goal_options, price_upper, ...).

        Raises:
            ConfigError: ``idx`` out of range.
        """
        return dict(self._goal(idx))

    def goal_index(self, instruction: str) -> int:
        """The index of the first goal whose ``instruction_text`` is ``instruction``.

        Exact text first; else the first goal whose text equals it up to case and runs of
        whitespace.  (Synthetic goals of one product can share a text; the first one is taken.)

        Raises:
            ConfigError: ``instruction`` is not a string, or no goal has that text (the message
                quotes the closest goal texts).
        """
        if not isinstance(instruction, str):
            raise ConfigError(f"instruction={instruction!r} must be a goal's instruction text (a str)")
        with self._lock:
            if self._instruction_index is None:
                exact: dict[str, int] = {}
                loose: dict[str, int] = {}
                for i, g in enumerate(self.catalog.goals):
                    exact.setdefault(g["instruction_text"], i)
                    loose.setdefault(" ".join(g["instruction_text"].lower().split()), i)
                self._instruction_index = (exact, loose)
        exact, loose = self._instruction_index
        idx = exact.get(instruction)
        if idx is None:
            idx = loose.get(" ".join(instruction.lower().split()))
        if idx is None:
            close = difflib.get_close_matches(instruction, list(exact), n=2, cutoff=0.6)
            hint = f"; closest: {close}" if close else ""
            raise ConfigError(f"no goal has the instruction {instruction!r} ({len(self.catalog.goals)} goals){hint}")
        return idx

    def split_indices(self, split: str) -> list[int]:
        """Goal indices of ``split``: ``"all"``, or upstream's ``"test"`` (0-499), ``"eval"`` (500-1499; also
        named ``"validation"``), ``"train"`` (1500-end), clipped to the goals that exist.

        Raises:
            ConfigError: unknown split.
        """
        n = len(self.catalog.goals)
        if split == "all":
            return list(range(n))
        if split not in SPLITS:
            raise ConfigError(f"split={split!r} is not one of 'all', 'train', 'eval' (or 'validation'), 'test'")
        lo, hi = SPLITS[split]
        return list(range(min(lo, n), n if hi is None else min(hi, n)))

    def goal_weights(self) -> list[float]:
        """Per-goal sampling weights (upstream's ``goal["weight"]``)."""
        return self.catalog.goals.weights()

    def stats(self) -> dict[str, Any]:
        """Products, goals, live sessions, load time in seconds."""
        return {"products": len(self.catalog.products), "goals": len(self.catalog.goals),
                "sessions": len(self._sessions), "load_seconds": self.load_seconds, "pid": os.getpid()}

    def healthy(self) -> bool:
        return True

    # No close(): an in-process server holds no process or file; it is freed with the object.

    # ------------------------------------------------------------------ sessions
    def _goal(self, idx: int) -> dict[str, Any]:
        if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < len(self.catalog.goals):
            raise ConfigError(f"goal index {idx!r} is out of range: this catalog has {len(self.catalog.goals)} goals "
                              f"(0..{len(self.catalog.goals) - 1})")
        return self.catalog.goals[idx]

    def _session(self, session_id: str) -> _Session:
        s = self._sessions.get(session_id)
        if s is None:
            raise EnvError(f"no WebShop session {session_id!r}; start one with new_session()")
        return s

    def new_session(self, session_id: str, goal_idx: int, mode: str = "text", seed: int | None = None) -> dict[str, Any]:
        """Open session ``session_id`` on goal ``goal_idx`` at the search page; returns :meth:`observe`.

        An existing session of that id is replaced.

        Raises:
            ConfigError: bad goal index or observation mode.
        """
        if mode not in OBSERVATION_MODES:
            raise ConfigError(f"observation_mode={mode!r} is not one of {OBSERVATION_MODES}")
        goal = self._goal(goal_idx)
        s = _Session(goal=goal, mode=mode, rng=random.Random(seed))
        self._to_index(s)
        with self._lock:
            self._sessions[session_id] = s
        return self.observe(session_id)

    def end_session(self, session_id: str) -> None:
        """Drop the session (no error if it does not exist)."""
        with self._lock:
            self._sessions.pop(session_id, None)

    def observe(self, session_id: str) -> dict[str, Any]:
        """The session's current view.

        Returns:
            dict with ``observation`` (str), ``page`` (page kind), ``has_search_bar`` (bool),
            ``clickables`` (list[str], upstream's order), ``admissible_actions`` (list[str]),
            ``instruction`` (str), ``done`` (bool), ``reward`` (float), ``reward_info`` (dict or None),
            ``asin`` (str or None, the product being viewed), ``options`` (dict, chosen options).
        """
        s = self._session(session_id)
        page = s.page
        assert page is not None
        clickables = list(page.clickables)
        admissible = ([SEARCH_BAR_ACTION] if page.has_search_bar else []) + [f"click[{c}]" for c in clickables if c != "search"]
        return {"observation": to_text(page, s.mode, chosen_options=s.options, visited_asins=s.asins),
                "page": page.kind, "has_search_bar": page.has_search_bar, "clickables": clickables,
                "admissible_actions": admissible, "instruction": s.goal["instruction_text"], "done": s.done,
                "reward": s.reward, "reward_info": s.reward_info, "asin": s.asin, "options": dict(s.options)}

    # ------------------------------------------------------------------ actions
    def step(self, session_id: str, action: str) -> dict[str, Any]:
        """Apply ``action`` (``search[keywords]`` or ``click[clickable]``, case-insensitive argument).

        An invalid action (unknown form, empty query, a clickable not on the page, ``click[search]``,
        anything after the purchase) leaves the page unchanged, as upstream.

        Returns:
            :meth:`observe`'s dict plus ``valid`` (bool, whether the action did something) and
            ``step_reward`` (float, the purchase reward on Buy Now else 0).
        """
        s = self._session(session_id)
        name, arg = parse_action(action) if isinstance(action, str) else ("", None)
        if arg is not None:
            arg = arg.lower()
        page = s.page
        assert page is not None
        valid, step_reward = False, 0.0
        if s.done:
            pass
        elif name == "search" and arg and (page.has_search_bar or not self.search_requires_search_bar):
            self._search(s, arg.split(" "), 1)
            valid = True
        elif name == "click" and arg is not None and arg in page.clickables and arg != "search":
            step_reward = self._click(s, arg)
            valid = True
        out = self.observe(session_id)
        out["valid"] = valid
        out["step_reward"] = step_reward
        return out

    def _to_index(self, s: _Session) -> None:
        s.kind, s.keywords, s.page_num, s.asin = "index", None, None, None
        s.asins, s.options, s.actions, s.results = set(), {}, defaultdict(int), []
        s.page = render_index(s.goal["instruction_text"])

    def _top_n(self, keywords: list[str], rng: random.Random) -> list[str]:
        """ASINs of upstream's ``get_top_n_product_from_keywords``, with its special first keywords
        ``<r>`` (random products), ``<a> attribute``, ``<c> category``, ``<q> query``.

        ASINs, not product dicts: a ``<c>`` search can match a large share of the catalog, and a
        results page decodes only the products it shows."""
        cat = self.catalog
        asins = cat.products.asins
        head = keywords[0] if keywords else ""
        if head == "<r>":  # the same draws as sampling the product list itself
            return [asins[i] for i in rng.sample(range(len(asins)), k=min(SEARCH_RETURN_N, len(asins)))]
        if head == "<a>":
            rows = cat.attribute_index.get(" ".join(keywords[1:]).strip(), ())
            return [asins[i] for i in rows]
        if head == "<c>":
            category = keywords[1].strip() if len(keywords) > 1 else ""
            return [asins[i] for i in cat.category_index.get(category, ())]
        if head == "<q>":
            query = " ".join(keywords[1:]).strip()
            return [asins[i] for i in cat.query_index.get(query, ())]
        return [a for a in self.search_engine.search(" ".join(keywords), SEARCH_RETURN_N) if a in cat.by_asin]

    def _search(self, s: _Session, keywords: list[str], page_num: int) -> None:
        if keywords != s.keywords or not s.results:
            s.results = self._top_n(keywords, s.rng)
        s.kind, s.keywords, s.page_num, s.asin, s.options = "search_results", keywords, page_num, None, {}
        s.actions["search"] += 1
        shown = [self.catalog.by_asin[a]
                 for a in s.results[(page_num - 1) * PRODUCT_WINDOW: page_num * PRODUCT_WINDOW]]
        s.page = render_results(s.goal["instruction_text"], shown, page_num, len(s.results))

    def _item(self, s: _Session) -> None:
        s.kind = "item_page"
        s.page = render_item(s.goal["instruction_text"], self.catalog.by_asin[s.asin], self.show_attrs)

    def _click(self, s: _Session, name: str) -> float:
        assert s.page is not None
        role, option_name = s.page.clickables[name]
        if name == END_BUTTON.lower():
            product = self.catalog.by_asin[s.asin]
            reward, info = get_reward(product, s.goal, self.catalog.prices[s.asin], s.options, self.nouns)
            s.actions["purchase"] += 1
            s.done, s.reward, s.reward_info, s.kind = True, reward, info, "done"
            s.page = render_done(s.asin, s.options, reward)
            return reward
        if name == BACK_TO_SEARCH.lower():
            self._to_index(s)
        elif name == NEXT_PAGE.lower() and s.kind == "search_results":
            self._search(s, s.keywords or [], (s.page_num or 1) + 1)
        elif name == PREV_PAGE.lower() and s.kind == "search_results":
            self._search(s, s.keywords or [], (s.page_num or 1) - 1)
        elif name == PREV_PAGE.lower() and s.kind == "item_sub_page":
            self._item(s)
        elif name == PREV_PAGE.lower() and s.kind == "item_page":
            self._search(s, s.keywords or [], s.page_num or 1)
        elif name in [p.lower() for p in SUB_PAGES]:
            sub = next(p for p in SUB_PAGES if p.lower() == name)
            s.actions[sub] += 1
            s.kind = "item_sub_page"
            s.page = render_sub_page(s.goal["instruction_text"], self.catalog.by_asin[s.asin], sub)
        else:
            if role == "product":
                s.asin = name.upper()
                s.actions["asin"] += 1
                s.asins.add(s.asin)
            elif role == "option" and option_name is not None:
                s.options[option_name.lower()] = name
                s.actions["options"] += 1
            self._item(s)
        return 0.0

    # ------------------------------------------------------------------ expert
    @staticmethod
    def _clean_query(text: str) -> str:
        return " ".join(re.sub(r"[\[\]]", " ", text.lower()).split())

    def _plan(self, s: _Session) -> tuple[str, int | None]:
        """(query, results page of the target) for the goal, computed once per session."""
        if s.plan is None:
            goal = s.goal
            candidates = [self._clean_query(goal["instruction_text"]), self._clean_query(goal["name"]),
                          "<q> " + self._clean_query(goal["query"])]
            s.plan = (candidates[0], None)
            for q in candidates:
                asins = self._top_n(q.split(" "), s.rng)
                if goal["asin"] in asins:
                    s.plan = (q, asins.index(goal["asin"]) // PRODUCT_WINDOW + 1)
                    break
        return s.plan

    def _wanted_options(self, s: _Session) -> list[tuple[str, str]]:
        goal, product = s.goal, self.catalog.by_asin.get(s.goal["asin"], {})
        if isinstance(goal["goal_options"], dict):
            return list(goal["goal_options"].items())
        out = []
        for value in goal["goal_options"]:
            for name, values in product.get("options", {}).items():
                if value in values:
                    out.append((name, value))
                    break
        return out

    def expert_action(self, session_id: str) -> str | None:
        """The scripted expert's next action for the session's current page, or None after the purchase.

        The expert searches the goal's instruction (falling back to the product title, then to
        upstream's ``<q> query`` search when the target is not in the top 50), pages to the target,
        opens it, picks the goal's options and buys: reward 1.0 wherever upstream's reward of the
        target product with the goal's options is 1.0.
        """
        s = self._session(session_id)
        if s.done:
            return None
        page = s.page
        assert page is not None
        target = s.goal["asin"]
        query, target_page = self._plan(s)
        if s.kind == "index":
            return f"search[{query}]"
        if s.kind == "search_results":
            if target.lower() in page.clickables:
                return f"click[{target.lower()}]"
            if s.keywords is not None and " ".join(s.keywords) == query and target_page is not None:
                if (s.page_num or 1) < target_page:
                    return f"click[{NEXT_PAGE.lower()}]"
                if (s.page_num or 1) > target_page:
                    return f"click[{PREV_PAGE.lower()}]"
            return f"click[{BACK_TO_SEARCH.lower()}]"
        if s.kind == "item_page":
            if s.asin != target:
                return f"click[{PREV_PAGE.lower()}]"
            for name, value in self._wanted_options(s):
                if s.options.get(name) != value and page.clickables.get(value) == ("option", name):
                    return f"click[{value}]"
            return f"click[{END_BUTTON.lower()}]"
        return f"click[{PREV_PAGE.lower()}]"


# ---------------------------------------------------------------------- the environments' face
class WebShopServerProxy(ObjectProxy):
    """The async, typed face of the shared :class:`WebShopServer` resource, in this process or, with
    ``InProcessSpec(isolation="process")``, in a child process (arguments and results pickled)."""

    num_goals = forward(WebShopServer.num_goals)
    goal = forward(WebShopServer.goal)
    goal_index = forward(WebShopServer.goal_index)
    split_indices = forward(WebShopServer.split_indices)
    goal_weights = forward(WebShopServer.goal_weights)
    stats = forward(WebShopServer.stats)
    new_session = forward(WebShopServer.new_session)
    end_session = forward(WebShopServer.end_session)
    observe = forward(WebShopServer.observe)
    step = forward(WebShopServer.step)
    expert_action = forward(WebShopServer.expert_action)


def measure_load(**kwargs: Any) -> dict[str, Any]:
    """Load a server in this process and report ``load_seconds`` and ``rss_delta_bytes`` (Linux /proc).

    Meant for a fresh interpreter (``python -m agentfly_gym.cli.webshop_measure``).
    """
    def rss() -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    before = rss()
    t0 = time.perf_counter()
    server = WebShopServer(**kwargs)
    elapsed = time.perf_counter() - t0
    out = server.stats()
    out.update({"load_seconds": elapsed, "rss_before_bytes": before, "rss_delta_bytes": rss() - before,
                "products_file": Path(kwargs["products_path"]).name})
    return out
