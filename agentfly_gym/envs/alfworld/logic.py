"""Versions of ALFWorld's game files (``game.tw-pddl``) and the upgrade of old ones to what alfworld 0.4 plays.

Each ``game.tw-pddl`` is JSON holding its own PDDL domain (``pddl_domain``), problem
(``pddl_problem``) and text grammar (``grammar``, with the task sentence); ALFWorld's
``AlfredTWEnv`` plays a game with exactly these, not with the ``logic/`` folder of the data root.
Two releases of the game files exist:

- ``2.1.1`` (alfworld <= 0.3, ``json_2.1.1_tw-pddl.zip`` of release 0.2.2): walking somewhere
  answers ``"You arrive at loc 6. ..."`` (the location's number, ``{lend.name}``), an object is
  put down with ``put <o> in/on <r>`` (``"You put the <o> in/on the <r>."``), there is no ``help``.
- ``2.1.2`` (alfworld 0.4, ``json_2.1.2_tw-pddl.zip`` of release 0.4.0, which ``alfworld-download``
  0.4.2 fetches): the 2.1.1 files with three grammar rules changed and a ``help`` action added, as
  alfworld's ``scripts/patch_tw-pddl.py`` makes them: ``"You arrive at drawer 1. ..."``
  (``{r.name}``), ``move <o> to <r>`` (``"You move the <o> to the <r>."``), and ``help``.  The
  package's own ``alfworld/data/alfred.twl2`` and ``alfred.pddl`` (``alfworld.info.ALFRED_TWL2_PATH``,
  ``ALFRED_PDDL_PATH``) carry the same changes.

:func:`upgrade_game` turns the data of a 2.1.1 file into its 2.1.2 form in memory (the files on disk
are never changed), so that the json_2.1.1 data many copies of ALFWorld hold plays as alfworld 0.4.2
plays its own download.  Everything else in the file stays as it is: per-game grammar quirks (some
games' ``open`` does not describe the contents) and the game's own PDDL domain (the game files
accept ``SinkType`` receptacles for ``clean``, which the package's ``alfred.pddl`` comments out) are
kept, because ``AlfredTWEnv`` plays them so.  The ``help`` rule and action are read from the
installed alfworld package, not copied into this project.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import EnvError

__all__ = ["GAME_VERSIONS", "game_version", "upgrade_game"]

#: The game-file releases told apart by :func:`game_version`.
GAME_VERSIONS = ("2.1.1", "2.1.2")

# The three grammar rules that differ between 2.1.1 and 2.1.2: (2.1.1 text, 2.1.2 text).
_GRAMMAR_CHANGES = (
    ("You arrive at {lend.name}.", "You arrive at {r.name}."),
    ("put {o} in/on {r}", "move {o} to {r}"),
    ("You put the {o.name} in/on the {r.name}.", "You move the {o.name} to the {r.name}."),
)
_HELP_TEMPLATE = re.compile(r'template\s*::\s*"help"\s*;')
_HELP_PDDL = re.compile(r"\(:action\s+help\b")


def game_version(data: Mapping[str, Any]) -> str:
    """``"2.1.2"`` if the game's grammar already has ALFWorld 0.4's ``help`` action, else ``"2.1.1"``.

    Args:
        data: a ``game.tw-pddl`` file's JSON (keys ``pddl_domain``, ``grammar``, ``pddl_problem``).

    Raises:
        EnvError: ``data`` has no ``grammar`` string.
    """
    grammar = data.get("grammar") if isinstance(data, Mapping) else None
    if not isinstance(grammar, str):
        raise EnvError("ALFWorld: the game file has no 'grammar' string; is it a game.tw-pddl file?")
    return "2.1.2" if _HELP_TEMPLATE.search(grammar) else "2.1.1"


def _package_data_dir() -> Path:
    """alfworld's bundled ``data/`` folder, found without importing alfworld (its import creates folders)."""
    spec = importlib.util.find_spec("alfworld")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("ALFWorld needs `pip install agentfly-gym[alfworld]` (alfworld 0.4.2)")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def _balanced_block(text: str, start: int, open_ch: str, close_ch: str) -> str:
    """``text[start:end]`` where ``end`` closes the bracket opened at or after ``start``.

    Strings in double quotes (TWL2's ``"..."`` and ``\"\"\"...\"\"\"``) are skipped, so brackets in
    feedback text do not count.
    """
    depth, i, n = 0, text.index(open_ch, start), len(text)
    while i < n:
        if text.startswith('"""', i):
            i = text.index('"""', i + 3) + 3
            continue
        c = text[i]
        if c == '"':
            i += 1
            while text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c == open_ch:
            depth += 1
        elif c == close_ch:
            depth -= 1
            if depth == 0:
                return text[start:i + 1]
        i += 1
    raise ValueError("unbalanced block")


@functools.lru_cache(maxsize=1)
def _help_blocks() -> tuple[str, str]:
    """(the ``help`` action of the package's ``alfred.twl2``, the ``help`` action of its ``alfred.pddl``)."""
    data = _package_data_dir()
    try:
        twl2 = (data / "alfred.twl2").read_text(encoding="utf-8")
        pddl = (data / "alfred.pddl").read_text(encoding="utf-8")
        grammar_at = twl2.index("action help")
        grammar_block = _balanced_block(twl2, grammar_at, "{", "}")
        domain_at = _HELP_PDDL.search(pddl)
        if domain_at is None:
            raise ValueError("no (:action help ...) in alfred.pddl")
        domain_block = _balanced_block(pddl, domain_at.start(), "(", ")")
    except (OSError, ValueError) as e:
        raise EnvError(f"ALFWorld: cannot read the 'help' action from the installed alfworld package ({data}): {e}; "
                       "alfworld 0.4.2 is needed to upgrade json_2.1.1 game files") from e
    return grammar_block, domain_block


def upgrade_game(data: Mapping[str, Any]) -> dict[str, Any]:
    """The game's data as ALFWorld 0.4 (game files 2.1.2) has it.

    A 2.1.1 game gets the three grammar changes listed in the module docstring, the grammar's
    ``help`` action appended and the domain's ``help`` action added before the domain's closing
    parenthesis (the package's ``alfred.twl2`` / ``alfred.pddl`` blocks).  A 2.1.2 game is returned
    unchanged (as a new dict).

    Args:
        data: a ``game.tw-pddl`` file's JSON.

    Returns:
        A new dict with the same keys.

    Raises:
        EnvError: ``data`` is not a game file, or the installed alfworld has no ``help`` action.
    """
    out = dict(data)
    if game_version(data) == "2.1.2":
        return out
    domain = out.get("pddl_domain")
    if not isinstance(domain, str) or ")" not in domain:
        raise EnvError("ALFWorld: the game file has no 'pddl_domain' string; is it a game.tw-pddl file?")
    grammar_help, domain_help = _help_blocks()
    grammar = out["grammar"]
    for old, new in _GRAMMAR_CHANGES:
        grammar = grammar.replace(old, new)
    out["grammar"] = grammar + "\n" + grammar_help + "\n"
    head, tail = domain.rsplit(")", 1)
    out["pddl_domain"] = head + domain_help + "\n)" + tail
    return out
