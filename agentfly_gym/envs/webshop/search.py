"""BM25 product search, standing in for upstream's Lucene index (pyserini ``LuceneSearcher``).

Upstream (princeton-nlp/WebShop, ``search_engine/convert_product_file_format.py`` and
``run_indexing.sh``) indexes one document per product with pyserini's defaults: BM25 with
k1=0.9, b=0.4 and Lucene's English analyzer.  The document text is::

    lower(" ".join([Title, Description, BulletPoints[0], option_text]))
    option_text = ", and ".join(f"{name}: {', '.join(values)}" for name, values in options.items())

A query returns at most 50 hits (``engine.SEARCH_RETURN_N``) that share at least one term
with it, best first.

Here: ``bm25s`` with ``method="lucene"`` (Lucene's BM25 idf and saturation), k1=0.9, b=0.4, and an
analyzer close to Lucene's ``EnglishAnalyzer``: word tokens (keeping ``6.76`` and ``l'eau`` whole),
possessive ``'s`` removed, lower case, Lucene's 33 English stop words, Porter stemming (PyStemmer's
``porter``).  Repeated query terms count repeatedly (as pyserini's bag-of-words query boosts a
term by its count).  Ties are broken by catalog order (as Lucene breaks them by document id).
Known differences from Lucene: Unicode word segmentation is a regular expression, not UAX#29, and
document lengths are exact (Lucene stores them lossily), so scores of near-ties can order
differently.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["LUCENE_STOPWORDS", "SEARCH_RETURN_N", "ProductSearch", "analyze", "document_text"]

SEARCH_RETURN_N = 50
LUCENE_STOPWORDS = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it", "no", "not",
    "of", "on", "or", "such", "that", "the", "their", "then", "there", "these", "they", "this", "to", "was",
    "will", "with"))

_TOKEN = re.compile(r"\w+(?:(?:[.'’]|(?<=\d),(?=\d))\w+)*", re.UNICODE)
_stemmer: Any = None


def _stem(words: list[str]) -> list[str]:
    global _stemmer
    if _stemmer is None:
        import Stemmer  # PyStemmer

        _stemmer = Stemmer.Stemmer("porter")
    return _stemmer.stemWords(words)


def analyze(text: str) -> list[str]:
    """Lucene-like English analysis: ``"The Runner's shoes"`` -> ``["runner", "shoe"]``."""
    tokens = []
    for tok in _TOKEN.findall(text.lower()):
        if tok.endswith(("'s", "’s")):
            tok = tok[:-2]
        if tok and tok not in LUCENE_STOPWORDS:
            tokens.append(tok)
    return _stem(tokens)


def document_text(product: dict[str, Any]) -> str:
    """The indexed text of a product, as upstream's ``convert_product_file_format.py``."""
    option_text = ", and ".join(f"{name}: {', '.join(values)}" for name, values in product.get("options", {}).items())
    bullets = product.get("BulletPoints") or [""]
    return " ".join([str(product.get("Title", "")), str(product.get("Description", "")), str(bullets[0]),
                     option_text]).lower()


class ProductSearch:
    """A BM25 index over ``products`` (k1=0.9, b=0.4, Lucene's formula).

    Read-only after construction; :meth:`search` may be called from several threads.
    """

    def __init__(self, products: Sequence[dict[str, Any]], *, k1: float = 0.9, b: float = 0.4) -> None:
        import bm25s

        self.asins = [p["asin"] for p in products]
        corpus = [analyze(document_text(p)) or ["\x00empty"] for p in products]
        self._bm25 = bm25s.BM25(method="lucene", k1=k1, b=b)
        self._bm25.index(corpus, show_progress=False)
        self._vocab = self._bm25.vocab_dict

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[str]:
        """ASINs of the at most ``k`` best products sharing a term with ``query``, best first."""
        terms = [t for t in analyze(query) if t in self._vocab]
        if not terms or not self.asins:
            return []
        scores = np.asarray(self._bm25.get_scores(terms), dtype=np.float64)
        hits = np.flatnonzero(scores > 0)
        order = hits[np.lexsort((hits, -scores[hits]))][:k]
        return [self.asins[i] for i in order]
