"""Write the retrieval task's corpus and questions (agentfly_gym/samples/retrieval/), byte for byte the same each run.

The corpus describes fictional towns (names, founders, exports and numbers drawn with ``random.Random(26)`` from
word lists written for this project), so that a model cannot answer from memory and must search.  Usage::

    python scripts/make_retrieval_corpus.py            # rewrites corpus.jsonl and questions.jsonl
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "agentfly_gym" / "samples" / "retrieval"

SYLLABLES = ["vel", "mor", "ar", "len", "dun", "bri", "cas", "tor", "ish", "wen", "ka", "lo", "rin", "sel", "tha",
             "mir", "oda", "pel", "quo", "ser", "ul", "yen", "zor", "fen", "gal", "hob", "nev", "ost"]
FIRST = ["Idris", "Mara", "Tobin", "Elsa", "Corin", "Yusra", "Pavel", "Lian", "Orla", "Bram", "Nika", "Soren", "Ada",
         "Felix", "Imke", "Ravi", "Thea", "Jonas", "Wren", "Dario"]
LAST = ["Kaul", "Verhoeven", "Lund", "Okafor", "Brandt", "Sato", "Moreau", "Kowal", "Hale", "Duarte", "Falk", "Ibarra",
        "Nyberg", "Quist", "Rahman", "Stroud", "Tamm", "Ueda", "Voss", "Whitlow"]
EXPORTS = ["saffron", "copper wire", "glass beads", "salted cod", "wool blankets", "cedar planks", "honey", "clay pipes",
           "linen", "paper", "violins", "barley", "slate", "dyes", "rope", "cheese", "lanterns", "soap", "wine", "tin"]
REGIONS = ["Arlen", "the Northern Marches", "Castavel", "the Ombre Coast", "Dunmere", "the High Fells", "Selwick"]
LANDSCAPE = ["a coastal town", "a river town", "a mountain village", "a market town", "a lake town", "a harbour town"]


def _name(rng: random.Random, used: set[str]) -> str:
    while True:
        name = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()
        if name not in used:
            used.add(name)
            return name


def build(n: int = 80, seed: int = 26) -> tuple[list[dict], list[dict]]:
    rng = random.Random(seed)
    used: set[str] = set()
    docs, questions = [], []
    for i in range(n):
        town = _name(rng, used)
        founder = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
        year = rng.randint(1200, 1899)
        export = rng.choice(EXPORTS)
        region = rng.choice(REGIONS)
        pop = rng.randint(8, 950) * 100
        bridges = rng.randint(1, 14)
        kind = rng.choice(LANDSCAPE)
        text = (f"{town} is {kind} in {region}. It was founded in {year} by {founder}. Its main export is {export}. "
                f"The town has a population of {pop:,} and {bridges} bridges.")
        doc_id = f"town-{i:03d}"
        docs.append({"id": doc_id, "title": town, "text": text})
        ask = [("In which year was {t} founded?", str(year)), ("Who founded {t}?", founder),
               ("What is the main export of {t}?", export), ("How many bridges does {t} have?", str(bridges)),
               ("In which region is {t}?", region)]
        q, a = ask[i % len(ask)]
        questions.append({"id": f"q-{i:03d}", "prompt": q.format(t=town), "answer": a, "doc_id": doc_id,
                          "query": town})
    return docs, questions


def main() -> None:
    docs, questions = build()
    OUT.mkdir(parents=True, exist_ok=True)
    for name, rows in (("corpus.jsonl", docs), ("questions.jsonl", questions)):
        (OUT / name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"wrote {len(docs)} documents and {len(questions)} questions to {OUT}")


if __name__ == "__main__":
    main()
