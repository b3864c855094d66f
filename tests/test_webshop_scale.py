"""WebShop at scale: the catalog and search-index caches, the streamed loader, the synthetic catalog.

Real components throughout: the sample catalog (the test data's ``webshop/``), a small synthetic catalog
grown from it, the real bm25s index.  The scale figures themselves are measured by
``benchmarks/bench_webshop_scale.py`` (too slow for a test; ``tests/test_benchmarks_smoke.py`` runs
it at its smallest size); here a small slice checks that the caches change nothing and are used.
"""

from __future__ import annotations

import json
import math
import random

import pytest

from agentfly_gym.envs.webshop.store import ProductStore, catalog_hash, iter_records
from agentfly_gym.envs.webshop.catalog import load_catalog
from agentfly_gym.envs.webshop.search import ProductSearch, analyze, document_text
from agentfly_gym.envs.webshop.synthetic import iter_synthetic_products, write_synthetic_catalog
from agentfly_gym.errors import ConfigError

pytestmark = pytest.mark.timeout(300)

PRODUCTS = "items_shuffle_sample.json"
ATTRS = "items_ins_v2_1000.json"


@pytest.fixture(scope="module")
def sample(test_data):
    return test_data / "webshop"


@pytest.fixture(scope="module")
def synth(sample, tmp_path_factory):
    """A 600-product synthetic catalog grown from the sample (seed 3)."""
    return write_synthetic_catalog(sample, tmp_path_factory.mktemp("synth"), 600, seed=3)


def _queries(catalog, n=60):
    goals = [catalog.goals[i]["instruction_text"] for i in range(0, len(catalog.goals), max(1, len(catalog.goals) // n))]
    titles = [p["Title"] for p in list(catalog.products)[:n]]
    return goals + titles + [" ".join(t.split()[:2]) for t in titles] + ["zzzqqq", "the a of"]


def _reference_ranker(products, k=50):
    """An independent BM25 reference: bm25s indexed from token strings (the former build path),
    every positive score sorted (score descending, catalog order on ties), the first ``k`` kept."""
    import bm25s
    import numpy as np

    bm = bm25s.BM25(method="lucene", k1=0.9, b=0.4)
    bm.index([analyze(document_text(p)) or ["\x00empty"] for p in products], show_progress=False)

    def rank(query):
        terms = [t for t in analyze(query) if t in bm.vocab_dict]
        if not terms:
            return []
        scores = np.asarray(bm.get_scores(terms), dtype=np.float64)
        hits = np.flatnonzero(scores > 0)
        return [products[i]["asin"] for i in hits[np.lexsort((hits, -scores[hits]))][:k]]

    return rank


# ---------------------------------------------------------------------- search index cache
@pytest.mark.parametrize("which", ["sample", "synthetic"])
def test_cached_index_ranks_as_a_fresh_one(which, sample, synth, tmp_path):
    if which == "sample":
        files = (sample / PRODUCTS, sample / ATTRS)
    else:
        files = synth
    catalog = load_catalog(*files, human_goals=False, cache=tmp_path / "catalog")
    fresh = ProductSearch(catalog.products)  # nothing cached
    built = ProductSearch(catalog.products, cache=tmp_path / "bm25", key=catalog.content_hash)
    loaded = ProductSearch(catalog.products, cache=tmp_path / "bm25", key=catalog.content_hash)
    assert not fresh.loaded_from_cache
    assert fresh.cache_path is None
    assert not built.loaded_from_cache
    assert built.cache_path is not None
    assert built.cache_path.is_dir()
    assert loaded.loaded_from_cache
    assert loaded.cache_path == built.cache_path
    products = list(catalog.products)
    some_hits = 0
    for q in _queries(catalog):
        ranking = fresh.search(q)
        assert loaded.search(q) == ranking == built.search(q), q
        some_hits += bool(ranking)
    assert some_hits > 50
    reference = _reference_ranker(products)  # and the same as an index built the former way, from token strings
    for q in _queries(catalog):
        assert fresh.search(q) == reference(q), q


def test_sample_ranking_is_unchanged(sample, tmp_path):
    """Known rankings on the real sample (the existing WebShop test's target, and a full top list)."""
    catalog = load_catalog(sample / PRODUCTS, sample / ATTRS, human_goals=False, cache=tmp_path)
    search = ProductSearch(catalog.products, cache=tmp_path / "bm25", key=catalog.content_hash)
    again = ProductSearch(catalog.products, cache=tmp_path / "bm25", key=catalog.content_hash)
    assert again.loaded_from_cache
    for s in (search, again):
        assert s.search("hdmi cable ethernet high speed")[0] == "B01MQH5VGR"
        assert s.search("zzzqqq") == []
    q = "console table solid wood"
    assert again.search(q) == _reference_ranker(list(catalog.products))(q)


def test_index_cache_key_changes_with_parameters_and_catalog(sample, synth):
    key = catalog_hash(sample / PRODUCTS, sample / ATTRS, None, None)
    assert key == catalog_hash(sample / PRODUCTS, sample / ATTRS, None, None)
    assert key != catalog_hash(sample / PRODUCTS, sample / ATTRS, None, 10)
    assert key != catalog_hash(synth[0], synth[1], None, None)
    assert ProductSearch.index_key(key) != ProductSearch.index_key(key, k1=1.2)
    assert ProductSearch.index_key(key) != ProductSearch.index_key(key, b=0.75)


def test_corrupt_index_cache_is_rebuilt(sample, tmp_path):
    catalog = load_catalog(sample / PRODUCTS, sample / ATTRS, human_goals=False, cache=tmp_path)
    built = ProductSearch(catalog.products, cache=tmp_path / "bm25", key=catalog.content_hash)
    (built.cache_path / "indptr.csc.index.npy").write_bytes(b"not numpy")
    again = ProductSearch(catalog.products, cache=tmp_path / "bm25", key=catalog.content_hash)
    assert not again.loaded_from_cache
    assert again.search("hdmi cable ethernet high speed")[0] == "B01MQH5VGR"
    assert ProductSearch(catalog.products, cache=tmp_path / "bm25", key=catalog.content_hash).loaded_from_cache


# ---------------------------------------------------------------------- catalog cache
def test_catalog_cache_round_trip(synth, tmp_path):
    """In memory, first cached load and second cached load: the same products, prices and goals."""
    plain = load_catalog(*synth, human_goals=False, cache=False)
    first = load_catalog(*synth, human_goals=False, cache=tmp_path)
    second = load_catalog(*synth, human_goals=False, cache=tmp_path)
    assert plain.cache_path is None
    assert first.cache_path == second.cache_path == tmp_path / first.content_hash
    assert sorted(p.name for p in first.cache_path.iterdir()) == ["goals-synthetic-seed42.npz", "meta.json",
                                                                   "offsets.npy", "products.jsonl"]
    assert sorted(x.name for x in tmp_path.iterdir()) == [first.content_hash, "file-hashes"]  # no temporary folder
    assert len(plain.products) == len(second.products) == 600
    assert list(plain.products) == list(second.products)
    assert dict(plain.prices) == dict(second.prices)
    assert len(plain.goals) == len(second.goals) > 600
    assert list(plain.goals) == list(second.goals)
    assert plain.goals.weights() == [g["weight"] for g in second.goals]
    assert plain.attribute_to_asins == second.attribute_to_asins
    # goals: one per option combination of each product with an instruction, as upstream
    expected = sum(math.prod(len(v) for v in p["options"].values())
                   for p in plain.products if p.get("instruction_text") and p.get("instruction_attributes"))
    assert len(plain.goals) == expected
    assert [g["goal_idx"] for g in plain.goals] == list(range(len(plain.goals)))
    for g in list(plain.goals)[:50]:
        p = plain.by_asin[g["asin"]]
        assert g["instruction_text"].startswith(p["instruction_text"])
        assert all(p["options"][k] and v in p["options"][k] for k, v in g["goal_options"].items())


def test_changed_file_gets_a_new_cache_entry(sample, tmp_path):
    """The remembered file hashes follow the file: rewriting it (same name) gives the new content."""
    products = tmp_path / "items_shuffle.json"
    records = json.loads((sample / PRODUCTS).read_text(encoding="utf-8"))
    products.write_text(json.dumps(records), encoding="utf-8")
    first = load_catalog(products, sample / ATTRS, human_goals=False, cache=tmp_path / "cache")
    assert load_catalog(products, sample / ATTRS, human_goals=False, cache=tmp_path / "cache").content_hash == \
        first.content_hash
    records[0]["name"] = "Renamed Console Table"
    products.write_text(json.dumps(records), encoding="utf-8")
    second = load_catalog(products, sample / ATTRS, human_goals=False, cache=tmp_path / "cache")
    assert second.content_hash != first.content_hash
    assert second.products[0]["Title"] == "Renamed Console Table" != first.products[0]["Title"]


def test_cached_goals_follow_the_price_seed(synth, tmp_path):
    """Goals and prices are cached per price seed; another seed draws (and caches) its own."""
    for seed in (42, 7):
        plain = load_catalog(*synth, human_goals=False, price_seed=seed, cache=False)
        for _ in range(2):  # the first call draws and saves, the second reads the saved draws
            cached = load_catalog(*synth, human_goals=False, price_seed=seed, cache=tmp_path)
            assert dict(cached.prices) == dict(plain.prices)
            assert [g["instruction_text"] for g in cached.goals] == [g["instruction_text"] for g in plain.goals]
    assert (cached.cache_path / "goals-synthetic-seed7.npz").is_file()
    assert dict(cached.prices) != dict(load_catalog(*synth, human_goals=False, cache=tmp_path).prices)


def test_corrupt_catalog_cache_is_rebuilt(synth, tmp_path):
    first = load_catalog(*synth, human_goals=False, cache=tmp_path)
    with open(first.cache_path / "products.jsonl", "ab") as f:
        f.write(b"{}\n")  # size no longer matches the offsets
    again = load_catalog(*synth, human_goals=False, cache=tmp_path)
    assert list(again.products) == list(load_catalog(*synth, human_goals=False, cache=False).products)


def test_unwritable_cache_falls_back_to_memory(sample, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    c = load_catalog(sample / PRODUCTS, sample / ATTRS, human_goals=False, cache=blocker / "sub")
    assert c.cache_path is None
    assert len(c.products) == 29
    assert len(c.goals) == 149


def test_num_products_and_bad_input(sample, tmp_path):
    c = load_catalog(sample / PRODUCTS, sample / ATTRS, human_goals=False, num_products=5, cache=tmp_path)
    assert len(c.products) == 5
    bad = tmp_path / "object.json"
    bad.write_text('{"asin": "B0"}')
    with pytest.raises(ConfigError, match="JSON list .* a JSON object"):
        load_catalog(bad, sample / ATTRS, human_goals=False, cache=False)
    with pytest.raises(ConfigError, match="num_products=0"):
        load_catalog(sample / PRODUCTS, sample / ATTRS, human_goals=False, num_products=0)
    with pytest.raises(ConfigError, match="JSON object keyed by ASIN"):
        load_catalog(sample / PRODUCTS, sample / PRODUCTS, human_goals=False, cache=False)


def test_streamed_records_equal_json_load(sample):
    with open(sample / PRODUCTS, encoding="utf-8") as f:
        assert list(iter_records(sample / PRODUCTS)) == json.load(f)


def test_product_store_sequence():
    lines = [json.dumps({"asin": a, "x": i}).encode() + b"\n" for i, a in enumerate(["A1", "B2", "C3"])]
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    import numpy as np

    store = ProductStore(b"".join(lines), np.asarray(offsets), ["A1", "B2", "C3"], decoded_cache=1)
    assert len(store) == 3
    assert store[-1]["x"] == 2
    assert [p["asin"] for p in store[:2]] == ["A1", "B2"]
    assert store[0] is store[0]  # the last read product is kept
    with pytest.raises(IndexError, match="index 3 out of range"):
        store[3]
    with pytest.raises(ConfigError, match="3 offsets for 3 products"):
        ProductStore(b"", np.asarray(offsets[:3]), ["A1", "B2", "C3"])


# ---------------------------------------------------------------------- synthetic catalog
def test_synthetic_catalog_is_deterministic_and_plausible(sample, tmp_path):
    with open(sample / PRODUCTS, encoding="utf-8") as f:
        base = json.load(f)
    with open(sample / ATTRS, encoding="utf-8") as f:
        attrs = json.load(f)
    a = list(iter_synthetic_products(base, attrs, 300, seed=1))
    assert a == list(iter_synthetic_products(base, attrs, 300, seed=1))
    assert a != list(iter_synthetic_products(base, attrs, 300, seed=2))
    asins = [p["asin"] for p, _ in a]
    assert len(set(asins)) == 300
    assert all(len(x) == 10 and x == x.upper() for x in asins)
    assert len({p["name"] for p, _ in a}) > 290  # titles vary
    sample_titles = {p["name"] for p in base}
    assert not sample_titles & {p["name"] for p, _ in a}
    for p, entry in a:
        assert set(entry.get("instruction_attributes") or []) <= set(entry["attributes"])
    p1, a1 = write_synthetic_catalog(sample, tmp_path / "one", 300, seed=1)
    p2, _ = write_synthetic_catalog(sample, tmp_path / "two", 300, seed=1)
    assert p1.read_bytes() == p2.read_bytes()
    c = load_catalog(p1, a1, human_goals=False, cache=False)
    assert len(c.products) == 300
    assert len(c.goals) > 0
    prices = [c.prices[x] for x in asins]
    assert min(prices) > 0
    assert len(set(prices)) > 250
    with pytest.raises(ConfigError) as info:
        next(iter_synthetic_products(base, attrs, 0))
    assert info.value.field == "n"


# ---------------------------------------------------------------------- server and benchmark slice
@pytest.mark.slow
def test_server_second_start_uses_both_caches(synth, tmp_path):
    from agentfly_gym.envs.webshop import WebShopServer

    first = WebShopServer(str(synth[0]), str(synth[1]), human_goals=False, cache=str(tmp_path))
    second = WebShopServer(str(synth[0]), str(synth[1]), human_goals=False, cache=str(tmp_path))
    assert not first.search_engine.loaded_from_cache
    assert second.search_engine.loaded_from_cache
    assert second.catalog.cache_path == first.catalog.cache_path
    assert second.catalog.cache_path.parent == tmp_path / "catalog"
    assert second.search_engine.cache_path.parent == tmp_path / "bm25"
    assert first.goal_weights() == second.goal_weights()
    for goal_idx in (0, 7, len(second.catalog.goals) - 1):  # the expert buys the target in both
        rewards = []
        for server in (first, second):
            sid = f"s{goal_idx}"
            server.new_session(sid, goal_idx)
            for _ in range(20):
                action = server.expert_action(sid)
                if action is None:
                    break
                out = server.step(sid, action)
            rewards.append((out["reward"], out["asin"], out["observation"]))
            server.end_session(sid)
        assert rewards[0] == rewards[1]
    # the <c>, <q> and <a> searches read the catalog's indexes; <r> draws as sampling the product list
    products = list(second.catalog.products)
    p = next(q for q in products[3:] if q["Attributes"])
    assert second._top_n(["<q>", *p["query"].split(" ")], None) == [q["asin"] for q in products if q["query"] == p["query"]]
    assert second._top_n(["<c>", p["category"]], None) == [q["asin"] for q in products if q["category"] == p["category"]]
    attr = p["Attributes"][0]
    assert second._top_n(["<a>", *attr.split(" ")], None) == [q["asin"] for q in products if attr in q["Attributes"]]
    assert second._top_n(["<r>"], random.Random(5)) == [q["asin"] for q in random.Random(5).sample(products, k=50)]
