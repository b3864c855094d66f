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

The index is built once per catalog and cached on disk (``bm25s``' own ``save`` / ``load``) under
``<cache>/<key>/``, where the key hashes the catalog's content hash (:func:`.catalog.catalog_hash`),
k1, b, :data:`ANALYZER_VERSION` and bm25s' version; a later start loads it memory-mapped instead
of analysing every document again.  Loading changes nothing: the saved arrays are the built ones.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...utils.files import staged_dir

__all__ = ["ANALYZER_VERSION", "LUCENE_STOPWORDS", "SEARCH_RETURN_N", "ProductSearch", "analyze", "document_text"]

log = logging.getLogger(__name__)

#: Bump when :func:`analyze` or :func:`document_text` changes what is indexed: it is part of the
#: cache key, so an index built by older code is never loaded.
ANALYZER_VERSION = 1

SEARCH_RETURN_N = 50
LUCENE_STOPWORDS = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it", "no", "not",
    "of", "on", "or", "such", "that", "the", "their", "then", "there", "these", "they", "this", "to", "was",
    "will", "with"))

_TOKEN = re.compile(r"\w+(?:(?:[.'’]|(?<=\d),(?=\d))\w+)*", re.UNICODE)


@functools.cache
def _stemmer() -> Any:
    """PyStemmer's Porter stemmer, made on first use."""
    import Stemmer  # PyStemmer

    return Stemmer.Stemmer("porter")


def _stem(words: list[str]) -> list[str]:
    return _stemmer().stemWords(words)


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

    Args:
        products: the catalog's products in order (dicts with ``asin`` and the fields of
            :func:`document_text`).
        k1, b: BM25 parameters (upstream's pyserini defaults).
        cache: a folder holding built indexes, or None (build in memory, nothing written).
        key: the catalog's content hash; the index is cached only when both ``cache`` and ``key``
            are given.

    Attributes:
        cache_path: the index folder it was loaded from or saved to, else None.
        loaded_from_cache: whether the index was loaded (True) or built (False).

    Read-only after construction; :meth:`search` may be called from several threads.  An
    unreadable cached index is rebuilt; an unwritable cache only logs a warning.
    """

    def __init__(self, products: Sequence[dict[str, Any]], *, k1: float = 0.9, b: float = 0.4,
                 cache: str | os.PathLike | None = None, key: str | None = None) -> None:
        self.asins = [p["asin"] for p in products] if not hasattr(products, "asins") else list(products.asins)
        self.k1, self.b = k1, b
        self.cache_path: Path | None = None
        self.loaded_from_cache = False
        folder = Path(cache) / self.index_key(key, k1, b) if cache is not None and key else None
        bm25 = self._load(folder, len(self.asins)) if folder is not None else None
        if bm25 is None:
            bm25 = self._build(products, k1, b)
            if folder is not None:
                self._save(bm25, folder)
        else:
            self.cache_path, self.loaded_from_cache = folder, True
        self._bm25 = bm25
        self._vocab = bm25.vocab_dict

    @staticmethod
    def index_key(key: str, k1: float = 0.9, b: float = 0.4) -> str:
        """Folder name of the cached index of the catalog with content hash ``key``."""
        import bm25s

        text = f"{key}\0k1={k1!r}\0b={b!r}\0analyzer={ANALYZER_VERSION}\0bm25s={bm25s.__version__}"
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    @staticmethod
    def _build(products: Sequence[dict[str, Any]], k1: float, b: float) -> Any:
        import bm25s

        vocab: dict[str, int] = {}
        corpus_ids: list[list[int]] = []
        for p in products:
            tokens = analyze(document_text(p)) or ["\x00empty"]
            corpus_ids.append([vocab.setdefault(t, len(vocab)) for t in tokens])
        bm25 = bm25s.BM25(method="lucene", k1=k1, b=b)
        bm25.index((corpus_ids, vocab), show_progress=False)
        return bm25

    def _load(self, folder: Path, num_docs: int) -> Any:
        import bm25s

        if not (folder / "params.index.json").is_file():
            return None
        try:
            bm25 = bm25s.BM25.load(folder, mmap=True, show_progress=False)
            if bm25.scores["num_docs"] != num_docs or (bm25.method, bm25.k1, bm25.b) != ("lucene", self.k1, self.b):
                raise ValueError(f"holds {bm25.scores['num_docs']} documents with method={bm25.method!r}, "
                                 f"k1={bm25.k1}, b={bm25.b}; want {num_docs}, 'lucene', {self.k1}, {self.b}")
            return bm25
        except (OSError, ValueError, KeyError) as e:
            log.warning("cached WebShop search index %s is unusable (%s); rebuilding it", folder, e)
            shutil.rmtree(folder, ignore_errors=True)
            return None

    def _save(self, bm25: Any, folder: Path) -> None:
        try:
            with staged_dir(folder, complete="params.index.json") as tmp:
                bm25.save(tmp, show_progress=False)
            self.cache_path = folder
        except OSError as e:
            log.warning("WebShop search index cannot be cached in %s (%s); it stays in memory", folder.parent, e)

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[str]:
        """ASINs of the at most ``k`` best products sharing a term with ``query``, best first."""
        terms = [t for t in analyze(query) if t in self._vocab]
        if not terms or not self.asins:
            return []
        scores = np.asarray(self._bm25.get_scores(terms), dtype=np.float64)
        hits = np.flatnonzero(scores > 0)
        if 0 < k < len(hits):  # keep the k best and every tie of the k-th: the sort below is then exact
            hit_scores = scores[hits]
            kth = np.partition(hit_scores, len(hits) - k)[len(hits) - k]
            hits = hits[hit_scores >= kth]
        order = hits[np.lexsort((hits, -scores[hits]))][:k]
        return [self.asins[i] for i in order]
