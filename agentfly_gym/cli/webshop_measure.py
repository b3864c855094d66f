"""Measure a WebShop server's load time and memory: ``python -m agentfly_gym.cli.webshop_measure [DATA_DIR]``.

Prints one JSON object (``load_seconds``, ``rss_delta_bytes``, ``products``, ``goals``, ...) for the
data folder's catalog, loaded in this fresh interpreter (so the RSS delta is the server's own:
catalog, BM25 index, spaCy model, goals, and the imports they need).
"""

from __future__ import annotations

import argparse
import json

from ..data.paths import resolve_data_dir
from ..envs.webshop.catalog import DATA_MARKER, HOW_TO_GET, find_data_files
from ..envs.webshop.server import measure_load


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data_dir", nargs="?", default=None)
    ap.add_argument("--products-file", default=None)
    ap.add_argument("--attributes-file", default=None)
    ap.add_argument("--num-products", type=int, default=None)
    args = ap.parse_args(argv)
    folder = resolve_data_dir("webshop", args.data_dir, how_to_get=HOW_TO_GET, must_contain=DATA_MARKER)
    products, attributes, _ = find_data_files(folder, products_file=args.products_file,
                                              attributes_file=args.attributes_file, human_goals=False)
    out = measure_load(products_path=str(products), attributes_path=str(attributes), human_goals=False,
                       num_products=args.num_products)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
