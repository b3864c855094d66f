"""WebShop's pages as text, with their clickables: upstream's HTML templates rendered without HTML.

Upstream (princeton-nlp/WebShop, ``web_agent_site/templates/*.html`` and
``envs/web_agent_text_env.py``) renders each page to HTML with Jinja, parses it with BeautifulSoup
and turns the visible text nodes into an observation:

- ``"text"`` (simple) mode: the stripped text nodes joined with ``" [SEP] "``;
- ``"text_rich"`` mode: one node per line, buttons as ``[button] X [button_]``, options as
  ``  [button] X [button_]`` (``[clicked button]`` when chosen, with ``You have clicked X.`` put first),
  product links as ``\\n[button] ASIN [button_]`` (``[clicked button]`` when visited).

This module produces the same sequence of text nodes directly from the templates' structure
(current upstream templates), so no HTML engine is needed.  Clickables are upstream's
``get_available_actions``: the lower-cased text of every ``.btn`` button and ``.product-link``, then
the value of every option radio button; ``has_search_bar`` only on the search page.

A text node is emitted as BeautifulSoup's ``html.parser`` would: an empty value makes no node, a
whitespace-only value becomes ``"\\n"`` (dropped) when it holds a newline, else ``" "``; Jinja
renders ``None`` as ``"None"``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

__all__ = [
    "BACK_TO_SEARCH",
    "END_BUTTON",
    "NEXT_PAGE",
    "PREV_PAGE",
    "PRODUCT_WINDOW",
    "SUB_PAGES",
    "NodeRole",
    "Page",
    "render_done",
    "render_index",
    "render_item",
    "render_results",
    "render_sub_page",
    "to_text",
]

END_BUTTON = "Buy Now"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
BACK_TO_SEARCH = "Back to Search"
SUB_PAGES = ("Description", "Features", "Reviews", "Attributes")
PRODUCT_WINDOW = 10

NodeRole = str  # "text" | "button" | "label" | "product"


@dataclasses.dataclass
class Page:
    """One rendered page.

    Attributes:
        kind: ``"index"`` (search page), ``"search_results"``, ``"item_page"``, ``"item_sub_page"``, ``"done"``.
        nodes: ``(raw text, role)`` visible text nodes in document order.
        clickables: lower-cased clickable text -> ``(role, option name or None)``, in upstream's order.
        has_search_bar: the page has the search input.
    """

    kind: str
    nodes: list[tuple[str, NodeRole]]
    clickables: dict[str, tuple[str, str | None]]
    has_search_bar: bool = False


def _s(value: Any) -> str:
    return "None" if value is None else str(value)


class _Builder:
    def __init__(self) -> None:
        self.nodes: list[tuple[str, NodeRole]] = []
        self.buttons: list[str] = []
        self.products: list[str] = []
        self.options: list[tuple[str, str]] = []

    def text(self, value: Any, role: NodeRole = "text") -> None:
        raw = _s(value)
        if raw == "":
            return
        if raw.strip() == "":
            raw = "\n" if "\n" in raw else " "
        if raw != "\n":
            self.nodes.append((raw, role))

    def button(self, label: str) -> None:
        self.text(label, "button")
        self.buttons.append(label)

    def product(self, asin: str) -> None:
        self.text(asin, "product")
        self.products.append(asin)

    def option(self, name: str, value: str) -> None:
        self.text(value, "label")
        self.options.append((name, value))

    def instruction(self, text: str, sep: str = "") -> None:
        self.text("Instruction:" + sep)
        self.text(text)

    def page(self, kind: str, has_search_bar: bool = False) -> Page:
        clickables: dict[str, tuple[str, str | None]] = {}
        for b in self.buttons:
            clickables[b.lower()] = ("button", None)
        for a in self.products:
            clickables[a.lower()] = ("product", None)
        for name, v in self.options:
            clickables[v] = ("option", name)
        return Page(kind, self.nodes, clickables, has_search_bar)


def render_index(instruction: str) -> Page:
    """The search page (``search_page.html``)."""
    b = _Builder()
    b.text("WebShop")
    b.instruction(instruction, " ")
    b.button("Search")
    return b.page("index", has_search_bar=True)


def render_results(instruction: str, products: list[dict[str, Any]], page: int, total: int) -> Page:
    """A results page (``results_page.html``): up to 10 products; "< Prev" only after page 1, "Next >" always."""
    b = _Builder()
    b.instruction(instruction)
    b.button(BACK_TO_SEARCH)
    b.text(f"Page {page} (Total results: {total})")
    if page > 1:
        b.button(PREV_PAGE)
    b.button(NEXT_PAGE)
    for item in products:
        b.product(item["asin"])
        b.text(item.get("Title"))
        b.text(item.get("Price"))
    return b.page("search_results")


def render_item(instruction: str, product: dict[str, Any], show_attrs: bool = False) -> Page:
    """A product page (``item_page.html``): options, title, price, rating, sub-page buttons, Buy Now."""
    b = _Builder()
    b.instruction(instruction)
    b.button(BACK_TO_SEARCH)
    b.button(PREV_PAGE)
    for name, values in product.get("options", {}).items():
        b.text(name)
        for v in values:
            b.option(name, v)
    b.text(product.get("Title"))
    b.text(f"Price: {_s(product.get('Price'))}")
    b.text(f"Rating: {_s(product.get('Rating'))}")
    for sub in SUB_PAGES[:3]:
        b.button(sub)
    if show_attrs:
        b.button("Attributes")
    b.button(END_BUTTON)
    return b.page("item_page")


def render_sub_page(instruction: str, product: dict[str, Any], sub_page: str) -> Page:
    """A product's Description / Features / Reviews / Attributes page."""
    b = _Builder()
    b.instruction(instruction)
    b.button(BACK_TO_SEARCH)
    b.button(PREV_PAGE)
    if sub_page == "Description":
        b.text(product.get("Description"))
    elif sub_page == "Features":
        for bullet in product.get("BulletPoints") or []:
            b.text(" " + _s(bullet))
    elif sub_page == "Reviews":
        for review in product.get("Reviews") or []:
            b.text(f'"{_s(review.get("title"))}"')
            b.text(review.get("score"))
            b.text(review.get("body"))
    elif sub_page == "Attributes":
        for attribute in product.get("Attributes") or []:
            b.text(" " + _s(attribute))
        b.text(product.get("category"))
        b.text(product.get("query"))
        b.text(product.get("product_category"))
    else:
        raise ValueError(f"unknown sub page {sub_page!r}")
    return b.page("item_sub_page")


def _tojson(value: Any) -> str:
    """Flask's ``tojson`` filter: sorted keys, HTML-safe escapes."""
    s = json.dumps(value, sort_keys=True)
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace("'", "\\u0027")


def render_done(asin: str, options: dict[str, str], reward: float) -> Page:
    """The page after Buy Now (``done_page.html`` as the text env fills it: no goal details)."""
    b = _Builder()
    b.text("Thank you for shopping with us!")
    b.text("Your code: ")
    b.text(None)  # mturk_code
    b.text(" (Paste it in your MTurk interface.)")
    b.text("Purchased")
    for label, value in (("asin", asin), ("options", _tojson(options)), ("attrs", None), ("category", None),
                         ("query", None), ("product category", None)):
        b.text(label)
        b.text(value)
    b.text("Target")
    for label in ("asin", "options", "attrs", "price upper", "instuction text", "category", "product category", "query"):
        b.text(label)
    b.text("Goal ")
    b.text(None)  # goal | pprint
    b.text("Reward")
    b.text("Your score (min 0.0, max 1.0)")
    b.text(reward)
    b.text("Reward Details ")
    b.text(None)  # reward_info | pprint
    return b.page("done")


def to_text(page: Page, mode: str = "text", *, chosen_options: dict[str, str] | None = None,
            visited_asins: set[str] | frozenset[str] = frozenset()) -> str:
    """The observation of ``page`` in upstream's ``"text"`` or ``"text_rich"`` mode.

    Args:
        chosen_options: option name -> chosen value on an item page (marked as clicked in rich mode).
        visited_asins: upper-case ASINs visited since the last "Back to Search" (rich mode).

    Raises:
        ValueError: unknown mode.
    """
    if mode == "text":
        return " [SEP] ".join(raw.strip() for raw, _ in page.nodes)
    if mode != "text_rich":
        raise ValueError(f"observation mode {mode!r} is not 'text' or 'text_rich'")
    chosen = set()
    if page.kind == "item_page" and chosen_options:
        chosen = set(chosen_options.values()) | set(chosen_options)
    obs = ""
    for raw, role in page.nodes:
        if role == "button":
            piece = f"[button] {raw} [button_]"
        elif role == "label":
            if raw in chosen:
                piece = f"  [clicked button] {raw} [clicked button_]"
                obs = f"You have clicked {raw}.\n" + obs
            else:
                piece = f"  [button] {raw} [button_]"
        elif role == "product":
            tag = "clicked button" if raw in visited_asins else "button"
            piece = f"\n[{tag}] {raw} [{tag}_]"
        else:
            piece = raw
        obs += piece + "\n"
    return obs
