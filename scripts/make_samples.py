#!/usr/bin/env python3
"""Rebuild the small public samples shipped in ``agentfly_gym/samples/`` from a data root.

Usage: ``python3 scripts/make_samples.py SRC_ROOT [OUT]`` (OUT defaults to the package's samples folder), where
SRC_ROOT holds ``chess/``, ``alfworld/`` and ``webshop/`` in the layout of the project's shared data folder
(see ``agentfly_gym/samples/README.md``).
The choice is deterministic (no randomness), so rerunning on the same source gives the same files.

- chess: ``PUZZLES`` rows of ``lichess_puzzles_sample.csv``: first every theme's lowest-numbered row not yet
  covered (so every theme of the source appears), then rows spread evenly over the rating order; written in
  the source's order, values unchanged.
- alfworld: per split folder, ``GAMES_PER_TYPE`` solvable games of each of the six task types (the first ones
  in sorted folder order), both files of each trial copied byte for byte, plus ``logic/``.
- webshop: the two files of the source, byte for byte.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import sys
from pathlib import Path

PUZZLES = 300
GAMES_PER_TYPE = 4
OUT = Path(__file__).resolve().parents[1] / "agentfly_gym" / "samples"


def chess(src: Path, out: Path) -> None:
    text = (src / "lichess_puzzles_sample.csv").read_text(encoding="utf-8")
    rows = list(csv.DictReader(io.StringIO(text)))
    header = text.splitlines()[0].split(",")
    chosen: set[int] = set()
    for i, r in enumerate(rows):  # every theme at least once
        if set(r["Themes"].split()) - {t for j in chosen for t in rows[j]["Themes"].split()}:
            chosen.add(i)
    by_rating = sorted(range(len(rows)), key=lambda i: (int(rows[i]["Rating"]), rows[i]["PuzzleId"]))
    remaining = [i for i in by_rating if i not in chosen]  # then evenly over the rating order
    need = PUZZLES - len(chosen)
    chosen.update(remaining[m * len(remaining) // need] for m in range(need))
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "lichess_puzzles_sample.csv", "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header, lineterminator="\n")
        w.writeheader()
        for i in sorted(chosen):
            w.writerow(rows[i])


def alfworld(src: Path, out: Path) -> None:
    base = src / "json_2.1.1"
    for split in sorted(p.name for p in base.iterdir() if p.is_dir()):
        taken: dict[str, int] = {}
        for trial_json in sorted((base / split).glob("*/*/traj_data.json")):
            trial = trial_json.parent
            rel = trial.relative_to(base / split).as_posix()
            if "movable" in rel or "Sliced" in rel or not (trial / "game.tw-pddl").is_file():
                continue
            if not json.loads((trial / "game.tw-pddl").read_text(encoding="utf-8")).get("solvable"):
                continue
            tt = json.loads(trial_json.read_text(encoding="utf-8"))["task_type"]
            if taken.get(tt, 0) >= GAMES_PER_TYPE:
                continue
            taken[tt] = taken.get(tt, 0) + 1
            dst = out / "json_2.1.1" / split / rel
            dst.mkdir(parents=True, exist_ok=True)
            for name in ("traj_data.json", "game.tw-pddl"):
                shutil.copyfile(trial / name, dst / name)
        print(f"alfworld {split}: {dict(sorted(taken.items()))}")
    (out / "logic").mkdir(parents=True, exist_ok=True)
    for name in ("alfred.pddl", "alfred.twl2"):
        shutil.copyfile(src / "logic" / name, out / "logic" / name)


def webshop(src: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in ("items_shuffle_sample.json", "items_ins_v2_1000.json"):
        shutil.copyfile(src / name, out / name)


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2) or not Path(argv[0]).is_dir():
        print(__doc__, file=sys.stderr)
        return 2
    src = Path(argv[0])
    out = Path(argv[1]) if len(argv) == 2 else OUT
    for name, fn in (("chess", chess), ("alfworld", alfworld), ("webshop", webshop)):
        for p in (out / name).glob("*"):  # keep README/LICENSE files, replace the data
            if p.is_dir():
                shutil.rmtree(p)
            elif p.name not in ("README.md", "LICENSE"):
                p.unlink()
        fn(src / name, out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
