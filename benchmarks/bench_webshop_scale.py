"""WebShop at scale: load time, memory and search latency against catalog size.

Catalogs of 1k, 10k and 100k products are generated from the real sample
(``agentfly_gym.envs.webshop.synthetic``; upstream trains on ~1.18 M products).  For each size,
in fresh interpreters (so RSS deltas are the load's own):

- cold start: parse the products file as a stream, write the catalog cache, analyse and index
  every document, write the search index cache (an empty cache folder);
- second start: the same files again: hash them, map the catalog cache, load the index (median
  of ``--repeats`` starts), and the full ``WebShopServer`` start (catalog + index + spaCy model);
- memory: RSS after the imports -> after catalog + index + goals, per product; the products'
  text lives in the memory-mapped cache and is not resident until read, so the whole RSS delta
  is counted as "beyond the raw text" (raw text: UTF-8 bytes of every string value a product
  keeps, reported next to it); as a reference, the RSS growth of decoding every product into
  plain dicts (the former layout) minus the raw text;
- search latency: ``ProductSearch.search`` (top 50) + decoding the 10 products of the first
  results page (what the server's search action does) for goal instructions (long queries, what the expert and most agents type) and 3-word title
  prefixes (short queries), after a warm-up; p50 / p95.

Goals: second start at 100k < 10 s; memory per product < 2 KB beyond the raw text; search p50
< 20 ms.  Disk: the 100k products file is about 420 MB (``--work`` chooses the folder; deleted
at the end unless ``--keep``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common as C

GOALS = {"second_start_s": 10.0, "bytes_per_product_beyond_text": 2048, "search_p50_s": 0.020}


# ---------------------------------------------------------------------- child (a fresh interpreter)
def _rss(field: str = "VmRSS") -> int:
    """Resident bytes: ``VmRSS`` (all), ``RssAnon`` (private heap) or ``RssFile`` (mapped files)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _text_bytes(obj: Any) -> int:
    if isinstance(obj, str):
        return len(obj.encode("utf-8"))
    if isinstance(obj, dict):
        return sum(_text_bytes(k) + _text_bytes(v) for k, v in obj.items())
    if isinstance(obj, list):
        return sum(_text_bytes(v) for v in obj)
    return 0


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One measured start; prints its JSON.  ``spec``: mode ("load" or "server"), files, cache, queries."""
    from agentfly_gym.envs.webshop.catalog import load_catalog
    from agentfly_gym.envs.webshop.search import ProductSearch

    import bm25s  # noqa: F401  (imports are not part of the load)
    import ijson  # noqa: F401

    out: dict[str, Any] = {}
    cache = Path(spec["cache"])
    if spec["mode"] == "server":
        from agentfly_gym.envs.webshop.server import WebShopServer

        import spacy  # noqa: F401

        t0 = time.perf_counter()
        server = WebShopServer(spec["products"], spec["attributes"], human_goals=False, cache=str(cache))
        out["server_start_s"] = time.perf_counter() - t0
        out["index_loaded_from_cache"] = server.search_engine.loaded_from_cache
        return out
    rss0, file0, anon0 = _rss(), _rss("RssFile"), _rss("RssAnon")
    t0 = time.perf_counter()
    catalog = load_catalog(spec["products"], spec["attributes"], human_goals=False, cache=cache / "catalog")
    t1 = time.perf_counter()
    rss1 = _rss()
    search = ProductSearch(catalog.products, cache=cache / "bm25", key=catalog.content_hash)
    t2 = time.perf_counter()
    rss2 = _rss()
    n = len(catalog.products)
    out.update({"products": n, "goals": len(catalog.goals), "catalog_s": t1 - t0, "index_s": t2 - t1,
                "start_s": t2 - t0, "rss_after_imports": rss0, "rss_delta_catalog": rss1 - rss0,
                "rss_delta_total": rss2 - rss0, "index_loaded_from_cache": search.loaded_from_cache})
    # search latency: search (top 50) + decode the first results page, as the server's search action
    rng = random.Random(spec["seed"])
    goals = rng.sample(catalog.goals, min(spec["queries"], len(catalog.goals)))
    rows = rng.sample(range(n), min(spec["queries"], n))
    queries = {"instruction": [g["instruction_text"] for g in goals],
               "short": [" ".join(catalog.products[i]["Title"].split()[1:4]) for i in rows]}
    for kind, qs in queries.items():
        for q in qs[:5]:  # warm-up
            search.search(q)
        lat = []
        for q in qs:
            t = time.perf_counter()
            hits = [catalog.by_asin[a] for a in search.search(q)[:10]]
            lat.append(time.perf_counter() - t)
            assert all(h["asin"] for h in hits)
        out[f"search_{kind}_s"] = lat
    out["rss_after_searches_delta"] = _rss() - rss0
    out["rss_file_after_searches_delta"] = _rss("RssFile") - file0  # mapped cache pages read by the searches
    out["rss_anon_after_searches_delta"] = _rss("RssAnon") - anon0
    out["store_bytes"] = catalog.products.text_bytes()
    if not spec.get("reference"):
        return out
    # raw text, then the former layout: every product decoded into a plain dict
    rss3 = _rss()
    decoded = [json.loads(json.dumps(p)) for p in catalog.products]
    out["rss_growth_plain_dicts"] = _rss() - rss3
    out["raw_text_bytes"] = sum(_text_bytes(p) for p in decoded)
    del decoded
    return out


# ---------------------------------------------------------------------- parent
def run_child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
                       timeout=timeout, env=env, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"child {spec['mode']} failed ({p.returncode}): {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def summarize(cold: dict[str, Any], warm: list[dict[str, Any]], server: list[dict[str, Any]]) -> dict[str, Any]:
    n = cold["products"]
    w = warm[0]
    beyond = C.median([x["rss_delta_total"] for x in warm]) / n
    s = {"products": n, "goals": cold["goals"],
         "cold_start_s": cold["start_s"], "cold_catalog_s": cold["catalog_s"], "cold_index_s": cold["index_s"],
         "second_start_s": C.median([x["start_s"] for x in warm]),
         "second_start_catalog_s": C.median([x["catalog_s"] for x in warm]),
         "second_start_index_s": C.median([x["index_s"] for x in warm]),
         "server_second_start_s": C.median([x["server_start_s"] for x in server]) if server else None,
         "rss_delta_cold_bytes": cold["rss_delta_total"],
         "rss_delta_second_bytes": C.median([x["rss_delta_total"] for x in warm]),
         "raw_text_bytes_per_product": w["raw_text_bytes"] / n,
         "store_bytes_per_product": w["store_bytes"] / n,
         "bytes_per_product_beyond_text": beyond,
         "rss_after_searches_per_product": w["rss_after_searches_delta"] / n,
         "rss_file_after_searches_per_product": w["rss_file_after_searches_delta"] / n,
         "rss_anon_after_searches_per_product": w["rss_anon_after_searches_delta"] / n,
         "plain_dicts_bytes_per_product": w["rss_growth_plain_dicts"] / n,
         "plain_dicts_beyond_text_per_product": (w["rss_growth_plain_dicts"] - w["raw_text_bytes"]) / n}
    for kind in ("instruction", "short"):
        lat = [x for r in warm for x in r[f"search_{kind}_s"]]
        s[f"search_{kind}_p50_s"] = C.pct(lat, 0.5)
        s[f"search_{kind}_p95_s"] = C.pct(lat, 0.95)
    s["goals_met"] = {
        "second_start_under_10s": s["second_start_s"] < GOALS["second_start_s"],
        "server_second_start_under_10s": (s["server_second_start_s"] or 0) < GOALS["second_start_s"],
        "memory_under_2kb_per_product": beyond < GOALS["bytes_per_product_beyond_text"],
        "search_p50_under_20ms": max(s["search_instruction_p50_s"], s["search_short_p50_s"]) < GOALS["search_p50_s"]}
    return s


def main() -> int:
    p = C.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1000,10000,100000", help="catalog sizes (products), comma-separated")
    p.add_argument("--queries", type=int, default=200, help="queries of each kind per start")
    p.add_argument("--work", default=None, help="folder for the generated catalogs and caches (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the generated catalogs and caches")
    p.add_argument("--child", default=None, help=argparse_hidden())
    args = p.parse_args()
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    C.setup_env_vars()
    from agentfly_gym.data.paths import resolve_data_dir
    from agentfly_gym.envs.webshop.catalog import HOW_TO_GET
    from agentfly_gym.envs.webshop.synthetic import write_synthetic_catalog

    tiny = args.scale == 0
    sizes = [200] if tiny else [C.scaled(int(x), args.scale) for x in args.sizes.split(",") if x.strip()]
    repeats = args.repeats or (1 if tiny else 3)
    queries = 20 if tiny else args.queries
    res = C.Result("bench_webshop_scale", args)
    res.data["config"] = {"sizes": sizes, "repeats": repeats, "queries": queries, "goals": GOALS}
    res.data["results"] = {}
    sample = resolve_data_dir("webshop", how_to_get=HOW_TO_GET)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench_webshop_scale."))
    try:
        for n in sizes:
            t = time.perf_counter()
            products, attributes = write_synthetic_catalog(sample, work / f"catalog_{n}", n, seed=args.seed)
            gen_s = time.perf_counter() - t
            cache = work / f"cache_{n}"
            shutil.rmtree(cache, ignore_errors=True)
            spec = {"products": str(products), "attributes": str(attributes), "cache": str(cache),
                    "queries": queries, "seed": args.seed}
            timeout = 3600
            cold = run_child({**spec, "mode": "load"}, timeout)
            warm = [run_child({**spec, "mode": "load", "reference": i == 0}, timeout) for i in range(repeats)]
            try:
                server = [run_child({**spec, "mode": "server"}, timeout) for _ in range(repeats)]
            except RuntimeError as e:
                res.skip(f"server start {n}", str(e))
                server = []
            s = summarize(cold, warm, server)
            s.update({"generate_s": gen_s, "products_file_bytes": products.stat().st_size,
                      "attributes_file_bytes": attributes.stat().st_size,
                      "cache_bytes": sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())})
            res.data["results"][str(n)] = {"summary": s, "cold": _drop_lat(cold), "warm": [_drop_lat(w) for w in warm],
                                           "server": server,
                                           "latencies_s": {k: [x for w in warm for x in w[f"search_{k}_s"]]
                                                           for k in ("instruction", "short")}}
            print(f"  {n} products: cold {s['cold_start_s']:.2f} s, second {s['second_start_s']:.2f} s "
                  f"(server {s['server_second_start_s'] or float('nan'):.2f} s), "
                  f"{s['bytes_per_product_beyond_text']:.0f} B/product beyond text "
                  f"(raw text {s['raw_text_bytes_per_product']:.0f} B), search p50 "
                  f"{1e3 * s['search_instruction_p50_s']:.2f} / {1e3 * s['search_short_p50_s']:.2f} ms "
                  f"(long / short), goals {s['goals_met']}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return C.finish(res, plot)


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


def _drop_lat(r: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in r.items() if not k.startswith("search_")}


def plot(res: C.Result) -> None:
    data = res.data["results"]
    if not data:
        return
    ns = sorted(int(k) for k in data)
    s = [data[str(n)]["summary"] for n in ns]
    fig, axes = C.subplots(1, 3, figsize=(13, 4))
    ax = axes[0]
    ax.plot(ns, [x["cold_start_s"] for x in s], "o-", label="cold start (parse + index + cache)")
    ax.plot(ns, [x["second_start_s"] for x in s], "o-", label="second start (catalog + index)")
    ax.plot(ns, [x["server_second_start_s"] or float("nan") for x in s], "o-", label="second start, server (+ spaCy)")
    ax.axhline(GOALS["second_start_s"], color="grey", ls="--", lw=1, label="goal: second start < 10 s")
    ax.set_ylabel("seconds (log)")
    ax.set_yscale("log")
    ax.set_title("Load time", fontsize=10)
    ax = axes[1]
    ax.plot(ns, [x["bytes_per_product_beyond_text"] for x in s], "o-", label="ours: RSS delta per product")
    ax.plot(ns, [x["plain_dicts_beyond_text_per_product"] for x in s], "o-", label="plain dicts, beyond raw text")
    ax.plot(ns, [x["raw_text_bytes_per_product"] for x in s], "o:", label="raw text per product")
    ax.axhline(GOALS["bytes_per_product_beyond_text"], color="grey", ls="--", lw=1, label="goal < 2 KB")
    ax.set_ylabel("bytes per product")
    ax.set_title("Memory (second start)", fontsize=10)
    ax = axes[2]
    for kind, label in (("instruction", "goal instructions"), ("short", "3-word queries")):
        ax.plot(ns, [1e3 * x[f"search_{kind}_p50_s"] for x in s], "o-", label=f"p50, {label}")
        ax.plot(ns, [1e3 * x[f"search_{kind}_p95_s"] for x in s], "o:", label=f"p95, {label}")
    ax.axhline(1e3 * GOALS["search_p50_s"], color="grey", ls="--", lw=1, label="goal: p50 < 20 ms")
    ax.set_ylabel("ms per search (+ decoding the first page)")
    ax.set_title("Search latency", fontsize=10)
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("products in the catalog")
        ax.legend(fontsize=7)
    fig.suptitle("WebShop at scale (synthetic catalogs grown from the real sample)", fontsize=11)
    C.save_figure(res, fig)


if __name__ == "__main__":
    sys.exit(main())
