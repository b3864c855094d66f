#!/usr/bin/env python3
"""Rebuild the test suite's data (``tests/data/``) from a full data root.

Usage: ``python3 scripts/make_test_data.py SRC_ROOT [CASES_DIR]``, where SRC_ROOT holds ``alfworld/``,
``chess/`` and ``tokenizers/qwen3/`` in the layout of the project's shared data folder, and CASES_DIR (default
``SRC_ROOT/../cases``) holds ``webshop_reward_cases.json``.  Files are copied byte for byte; README and
LICENSE files in ``tests/data`` are kept.  ``tests/data/webshop`` is a link to the package's WebShop sample,
which holds the same two files (see ``tests/data/README.md``), so nothing is copied for it.

The ALFWorld subset is the fixed list ``ALFWORLD_TRIALS`` below: the games the tests play by name, the first
solvable game of every task type in each split, and a few trials the loader must skip (unsolvable, ``movable``
and ``Sliced`` ones, one of them without a ``solvable`` key).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "data"

ALFWORLD_TRIALS = (
    # valid_seen: seven solvable (every task type; LOOK_BOWL, PLACE_BOOK, COOL_EGG of the tests), one
    # unsolvable, two unsupported (a movable trial, a Sliced one; neither has a game file)
    "valid_seen/look_at_obj_in_light-AlarmClock-None-DeskLamp-323/trial_T20190909_044715_250790",
    "valid_seen/look_at_obj_in_light-BaseballBat-None-DeskLamp-303/trial_T20190907_060414_846460",
    "valid_seen/look_at_obj_in_light-Bowl-None-DeskLamp-316/trial_T20190908_230702_962704",
    "valid_seen/pick_and_place_simple-Book-None-SideTable-329/trial_T20190908_050633_745514",
    "valid_seen/pick_and_place_with_movable_recep-AppleSliced-Pan-CounterTop-8/trial_T20190909_002950_338362",
    "valid_seen/pick_clean_then_place_in_recep-ButterKnife-None-CounterTop-8/trial_T20190909_105559_983897",
    "valid_seen/pick_cool_then_place_in_recep-Egg-None-Microwave-24/trial_T20190908_234112_645480",
    "valid_seen/pick_heat_then_place_in_recep-Apple-None-DiningTable-26/trial_T20190907_060234_011675",
    "valid_seen/pick_heat_then_place_in_recep-AppleSliced-None-CounterTop-14/trial_T20190907_232225_725376",
    "valid_seen/pick_two_obj_and_place-AlarmClock-None-Dresser-305/trial_T20190907_165826_194855",
    # valid_unseen: seven solvable (every task type; the fidelity tests' EXAMPLE, Bowl-308), one unsolvable,
    # one unsupported (a movable trial whose game file has no "solvable" key)
    "valid_unseen/look_at_obj_in_light-AlarmClock-None-DeskLamp-308/trial_T20190908_222917_366542",
    "valid_unseen/look_at_obj_in_light-BaseballBat-None-DeskLamp-308/trial_T20190906_214631_761426",
    "valid_unseen/look_at_obj_in_light-Bowl-None-DeskLamp-308/trial_T20190907_133919_856963",
    "valid_unseen/pick_and_place_simple-Mug-None-Desk-308/trial_T20190908_125200_737896",
    "valid_unseen/pick_and_place_with_movable_recep-ButterKnife-Cup-CounterTop-10/trial_T20190908_235919_129519",
    "valid_unseen/pick_clean_then_place_in_recep-Bowl-None-Cabinet-10/trial_T20190909_061130_844814",
    "valid_unseen/pick_cool_then_place_in_recep-Bread-None-CounterTop-10/trial_T20190908_091747_866951",
    "valid_unseen/pick_heat_then_place_in_recep-Apple-None-Fridge-10/trial_T20190906_182259_116320",
    "valid_unseen/pick_two_obj_and_place-CD-None-Safe-308/trial_T20190907_050942_897916",
    # valid_train (what split="train" reads): the first solvable game of every task type
    "valid_train/look_at_obj_in_light-Book-None-DeskLamp-302/trial_T20190909_085137_911990",
    "valid_train/pick_and_place_simple-AlarmClock-None-Desk-307/trial_T20190907_072317_014092",
    "valid_train/pick_clean_then_place_in_recep-Bowl-None-Shelf-7/trial_T20190908_152949_169018",
    "valid_train/pick_cool_then_place_in_recep-Bowl-None-Cabinet-18/trial_T20190908_144624_086654",
    "valid_train/pick_heat_then_place_in_recep-Apple-None-Fridge-6/trial_T20190908_153841_522662",
    "valid_train/pick_two_obj_and_place-Book-None-Desk-302/trial_T20190906_181314_259738",
)


def _replace_data(folder: Path) -> None:
    """Empty ``folder`` except its README/LICENSE files (created if missing)."""
    folder.mkdir(parents=True, exist_ok=True)
    for p in folder.iterdir():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.name not in ("README.md", "LICENSE"):
            p.unlink()


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2) or not Path(argv[0]).is_dir():
        print(__doc__, file=sys.stderr)
        return 2
    src = Path(argv[0])
    cases = Path(argv[1]) if len(argv) == 2 else src.parent / "cases"

    _replace_data(OUT / "alfworld")
    for rel in ALFWORLD_TRIALS:
        trial = src / "alfworld" / "json_2.1.1" / rel
        dst = OUT / "alfworld" / "json_2.1.1" / rel
        dst.mkdir(parents=True)
        for f in sorted(trial.iterdir()):  # traj_data.json, and game.tw-pddl where the trial has one
            shutil.copyfile(f, dst / f.name)
    (OUT / "alfworld" / "logic").mkdir()
    for name in ("alfred.pddl", "alfred.twl2"):
        shutil.copyfile(src / "alfworld" / "logic" / name, OUT / "alfworld" / "logic" / name)

    _replace_data(OUT / "chess")
    shutil.copyfile(src / "chess" / "lichess_puzzles_sample.csv", OUT / "chess" / "lichess_puzzles_sample.csv")

    _replace_data(OUT / "tokenizers" / "qwen3")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(src / "tokenizers" / "qwen3" / name, OUT / "tokenizers" / "qwen3" / name)

    _replace_data(OUT / "cases")
    shutil.copyfile(cases / "webshop_reward_cases.json", OUT / "cases" / "webshop_reward_cases.json")
    print(f"wrote {len(ALFWORLD_TRIALS)} ALFWorld trials, chess, tokenizers/qwen3 and cases under {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
