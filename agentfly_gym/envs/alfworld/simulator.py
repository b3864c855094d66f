"""The ALFWorld text simulator: TextWorld's PDDL engine with ALFWorld's demangler, as an in-process resource.

This is the light path of ALFWorld's ``AlfredTWEnv`` (``alfworld/agents/environment/alfred_tw_env.py``):
``textworld.envs.pddl.PddlEnv`` wrapped in ALFWorld's ``AlfredDemangler`` (object ids such as
``Apple_bar__plus_00_dot_12...`` become ``apple 1``; ``shuffle=False`` as upstream uses for
evaluation) and ``AlfredInfos``.  Observations are the engine's own text: the first one is
``"-= Welcome to TextWorld, ALFRED! =-\\n\\n<room>\\n\\nYour task is to: <goal>."`` and a command
that is not admissible gives ``"Nothing happens."``.  By default a game file of the older release
(json 2.1.1) is played as alfworld 0.4 has it (json 2.1.2, see :mod:`.logic`): ``"You arrive at
drawer 1."``, ``move <o> to <r>``, ``help``.

One :class:`ALFWorldSimulator` holds one ``PddlEnv`` (and so one private copy of Fast Downward's
shared library, which is never unloaded) for its whole life and loads one game per episode.
Loading a game's rules costs 1-2 s (TextWorld parses the grammar, Fast Downward translates the
PDDL problem, four times per load and reset); what that computes is cached per game file, in
memory and on disk (:mod:`.engine_cache`), so a game played again, by this simulator or any other,
skips it.  The cache only ever returns what the engine computes for the same input text.  A game
never seen before reuses the grammar snippets other games parsed and has its second translation made
in a child process meanwhile (~0.4-0.7 s instead of 1.3-2.6 s); ``agentfly-gym data precompute
alfworld`` fills the disk cache for whole splits ahead of a run.

TextWorld interns every logic fact it builds in a process-wide dict that is never emptied
(``mementos``' cache, ~1.1 MB per game never seen before; see :mod:`._compat`), which no simulator
owns and so no recycling frees.  A load that leaves more than ``max_intern_entries`` entries there
empties it (safe: the entries are immutable values compared by value; games give the same text
after a clear), so a process that plays thousands of different games stays flat.

Made by the resource manager from
``InProcessSpec(factory="agentfly_gym.envs.alfworld.simulator:ALFWorldSimulator")``; all calls
run on the instance's own worker thread.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...errors import ConfigError, EnvError
from ...limits import check_int
from ...resources.spec import parse_bytes
from . import _compat
from .engine_cache import EngineCache, EngineEntry, entry_key, prefetch, serving, start_translation_worker
from .logic import upgrade_game

__all__ = ["INTERN_ENTRIES", "NOTHING_HAPPENS", "ALFWorldSimulator", "current_rss"]

log = logging.getLogger(__name__)

#: TextWorld's PddlEnv feedback for a command that is not admissible.
NOTHING_HAPPENS = "Nothing happens."

#: Default ``max_intern_entries``: TextWorld's intern cache is emptied once a load leaves more
#: entries than this in it (~600-1,100 per ALFWorld game never seen before, the more of it is
#: played the more; ~1 KB each: ~50-60 MB).
INTERN_ENTRIES = 50_000

#: Serialises engine calls of all simulators in this process.  TextWorld's PDDL/grammar parsers
#: and Fast Downward's Python translator keep module-level state: two simulators loading games
#: on two threads at once fail with parser errors (measured here).  Upstream avoids this by
#: running each env in its own process; the engine is pure Python under the GIL, so the lock
#: costs little throughput.
_ENGINE_LOCK = threading.RLock()


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block (restored after it, also on error).

    A game's load allocates millions of short-lived objects (TatSu parse trees, Fast Downward's
    grounding), which trigger full collections that walk every live object of the process: in a
    process that already holds other games and envs that cost 25-40% of a cold load (measured here:
    0.82-1.78 s against 0.58-1.15 s).  Nothing is leaked: cycles made meanwhile are collected by the
    next collection after the block.  The pause is process-wide, so other threads do not collect for
    that ~1 s either.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _file_stamp(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_mtime_ns, st.st_size


def current_rss() -> int | None:
    """Anonymous resident memory of this process in bytes (Linux ``RssAnon`` of ``/proc/self/status``, else the
    whole resident set of ``/proc/self/statm``); ``None`` where unknown.  Anonymous memory is what a simulator's
    growth adds; the file-backed part (the mapped libraries, over a GB with torch loaded) shrinks and grows as the
    kernel reclaims page cache under memory pressure, and once hid a 256 MiB growth from the watch."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class ALFWorldSimulator:
    """One ALFWorld game engine, reused across episodes (one game loaded at a time).

    Args:
        max_rss_growth: memory watch.  :meth:`healthy` turns ``False`` once this process's
            resident memory has grown by more than this many bytes (an int or ``"1g"`` style
            string) since the simulator was built, so the pool replaces it.  The measure is
            process-wide (simulators share the process), so it is a safety valve against slow
            growth over many games, not a per-simulator account.  ``None`` disables it.
        upgrade_games: play game files of the json 2.1.1 release as alfworld 0.4.2 plays its own
            (2.1.2) download (:func:`~agentfly_gym.envs.alfworld.logic.upgrade_game`); ``False``
            plays every game file exactly as stored.
        engine_cache: cache what loading a game computes (:mod:`.engine_cache`): ``True`` in
            memory and in ``$AGENTFLY_GYM_CACHE/alfworld/engine``, a folder path for another
            folder, ``"memory"`` for memory only, ``False`` to recompute on every load.
        translation_worker: with the cache, make a game's second Fast Downward translation (the
            optimised one) in a child process shared by the process's simulators while this one parses
            the grammar and makes the first, so a game never seen before loads in about half the time
            on a machine with a free core (:func:`~.engine_cache.prefetch`); ``False`` keeps all work
            in this process.  Results are the same either way.
        max_intern_entries: bound on TextWorld's process-wide intern cache (entries, shared by all
            simulators of the process): after a load leaves more than this many there, it is
            emptied (:func:`~._compat.clear_intern_cache`; counted in ``intern_clears``).
            ``None`` never empties it (as TextWorld: it grows ~1.1 MB per game never seen before).

    Raises:
        ImportError: ``alfworld``/``textworld`` (with ``fast-downward-textworld``) are not installed.
    """

    def __init__(self, max_rss_growth: int | str | None = None, upgrade_games: bool = True,
                 engine_cache: bool | str | os.PathLike = True, translation_worker: bool = True,
                 max_intern_entries: int | None = INTERN_ENTRIES) -> None:
        try:
            import textworld
            from alfworld.agents.environment.alfred_tw_env import (
                AlfredDemangler,
                AlfredInfos,
            )
            from textworld.envs.pddl import PddlEnv
        except ImportError as e:  # pragma: no cover - depends on the installation
            raise ImportError(f"ALFWorld needs `pip install agentfly-gym[alfworld]` (alfworld 0.4.2, textworld 1.7.0 "
                              f"with fast-downward-textworld): {e}") from e
        self.max_rss_growth = parse_bytes(max_rss_growth, field="max_rss_growth")
        self.upgrade_games = bool(upgrade_games)
        check_int("max_intern_entries", max_intern_entries, minimum=0, optional=True)
        self.max_intern_entries = max_intern_entries
        #: times a load of this simulator emptied TextWorld's intern cache (see ``max_intern_entries``)
        self.intern_clears = 0
        if engine_cache is True:
            self._cache: EngineCache | None = EngineCache(EngineCache.default_directory())
        elif engine_cache == "memory":
            self._cache = EngineCache(None)
        elif engine_cache is False or engine_cache is None:
            self._cache = None
        elif isinstance(engine_cache, (str, os.PathLike)):
            self._cache = EngineCache(engine_cache)
        else:
            raise ConfigError(f"engine_cache={engine_cache!r} must be True, False, 'memory' or a folder path")
        self.translation_worker = bool(translation_worker) and self._cache is not None
        if self.translation_worker:
            start_translation_worker()  # started (and Fast Downward imported there) before the first game
        infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
        self._env = AlfredInfos(AlfredDemangler(PddlEnv(infos), shuffle=False))
        self._baseline_rss = current_rss()
        self._game_file: str | None = None
        self._parsed: tuple[str, Any] | None = None  # (game file, its cache key or file stamp)
        self._entry: EngineEntry | None = None
        self._admissible: list[str] = []
        self._won = False
        self._history: list[str] = []
        self.games_loaded = 0
        self.steps = 0

    # ------------------------------------------------------------------ episode
    def load(self, game_file: str | os.PathLike) -> tuple[str, dict[str, Any]]:
        """Load ``game_file`` (a ``game.tw-pddl``) and start it.

        Returns:
            ``(observation, info)``: the intro text ending with ``"Your task is to: ..."``, and
            ``info`` with ``admissible_actions`` (sorted list[str]), ``won`` (bool), ``goal`` (str,
            the task sentence) and ``game_file`` (str).

        Raises:
            EnvError: the game cannot be loaded (e.g. an unsolvable or corrupt game file).
        """
        game_file = str(Path(game_file))
        self._clear()
        try:
            if self._cache is None:
                state = self._load_uncached(game_file)
            else:
                state = self._load_cached(game_file)
        except Exception as e:
            self._parsed = self._entry = None
            self._clear()
            raise EnvError(f"ALFWorld cannot load {game_file}: {type(e).__name__}: {e}") from e
        finally:
            self._bound_interns()
        self._game_file = game_file
        self.games_loaded += 1
        self._admissible = list(state["admissible_commands"])
        self._won = bool(state["won"])
        obs = str(state.feedback)
        goal = ""
        marker = "Your task is to: "
        if marker in obs:
            goal = obs.rsplit(marker, 1)[1].strip()
        return obs, {"admissible_actions": list(self._admissible), "won": self._won, "goal": goal,
                     "game_file": game_file}

    def _bound_interns(self) -> None:
        """Empty TextWorld's intern cache when it holds more than ``max_intern_entries`` entries."""
        if self.max_intern_entries is None:
            return
        with _ENGINE_LOCK:  # no other simulator of the process is inside the engine meanwhile
            size = _compat.intern_cache_size()
            if size is not None and size > self.max_intern_entries:
                _compat.clear_intern_cache()
                self.intern_clears += 1
                log.debug("ALFWorld: emptied TextWorld's intern cache (%d entries)", size)

    def _load_uncached(self, game_file: str) -> Any:
        stamp = _file_stamp(game_file)
        with _ENGINE_LOCK:
            if self._parsed != (game_file, stamp):
                # Parsing the game's grammar and PDDL costs ~1-3 s; a game that is played again
                # (e.g. a group of rollouts of one task) skips it and only restarts the game.
                self._parsed = None
                self._env.load(self.game_data(game_file))
                self._parsed = (game_file, stamp)
            return self._env.reset()  # a fresh PddlState: nothing of an earlier episode survives

    def _load_cached(self, game_file: str) -> Any:
        assert self._cache is not None
        with open(game_file, "rb") as f:
            raw = f.read()
        key = entry_key(raw, upgrade_games=self.upgrade_games)
        try:
            return self._load_with_entry(game_file, raw, key)
        except Exception as e:
            # An entry that reads back but does not load (e.g. a damaged result inside a well-formed
            # file) is dropped and the game loaded without it, once; a game that fails with a fresh
            # entry too is the game's own error.
            self._parsed = self._entry = None
            if not self._cache.discard(key):
                raise
            log.warning("ALFWorld: the engine cache entry of %s did not load (%s: %s); discarded, computing it again",
                        game_file, type(e).__name__, e)
            return self._load_with_entry(game_file, raw, key)

    def _load_with_entry(self, game_file: str, raw: bytes, key: str) -> Any:
        assert self._cache is not None
        with _ENGINE_LOCK, _no_cyclic_gc():
            if self._parsed != (game_file, key) or self._entry is None:
                # the same file with the same content loaded last: only the reset below is needed
                self._parsed = None
                entry = self._cache.get(key)
                data = self._game_data_of(raw)
                domain, problem = data.get("pddl_domain"), data.get("pddl_problem")
                if self.translation_worker and isinstance(domain, str) and isinstance(problem, str):
                    prefetch(entry, domain, problem)
                with serving(entry):
                    self._env.load(data)
                self._parsed, self._entry = (game_file, key), entry
            entry = self._entry
            with serving(entry):
                state = self._env.reset()  # a fresh PddlState: nothing of an earlier episode survives
            self._cache.put(key, entry)
        return state

    @property
    def cache_stats(self) -> dict[str, int]:
        """Engine cache lookups of this simulator: ``memory_hits``, ``disk_hits``, ``misses`` (all 0 without a cache)."""
        c = self._cache
        return {"memory_hits": c.memory_hits if c else 0, "disk_hits": c.disk_hits if c else 0,
                "misses": c.misses if c else 0}

    def _game_data_of(self, raw: bytes) -> dict[str, Any]:
        data = json.loads(raw.decode("utf-8"))
        return upgrade_game(data) if self.upgrade_games else data

    def game_data(self, game_file: str | os.PathLike) -> dict[str, Any]:
        """The JSON of ``game_file`` as this simulator plays it (upgraded to 2.1.2 if ``upgrade_games``).

        Raises:
            OSError, ValueError: the file cannot be read or is not JSON.
            EnvError: it is not a game file.
        """
        with open(game_file, encoding="utf-8") as f:
            data = json.load(f)
        return upgrade_game(data) if self.upgrade_games else data

    def step(self, command: str) -> tuple[str, bool, list[str], bool]:
        """Apply one text command.

        The command is matched exactly against the admissible commands after stripping
        surrounding whitespace (as ``PddlEnv.step``); anything else leaves the game unchanged and
        gives ``"Nothing happens."``.

        Returns:
            ``(observation, won, admissible_commands, applied)``; ``applied`` says whether the
            command changed the game (it was admissible).

        Raises:
            EnvError: no game is loaded.
        """
        if self._game_file is None:
            raise EnvError("ALFWorld simulator: no game is loaded; call load() first")
        command = command.strip()
        applied = command in self._admissible
        with _ENGINE_LOCK:
            state, _score, _done = self._env.step(command)
        self.steps += 1
        if applied:
            self._history.append(command)
        self._admissible = list(state["admissible_commands"])
        self._won = bool(state["won"])
        return str(state.feedback), self._won, list(self._admissible), applied

    @property
    def game_file(self) -> str | None:
        """The loaded game file, or ``None``."""
        return self._game_file

    @property
    def history(self) -> list[str]:
        """The commands applied to the loaded game so far (inadmissible ones excluded)."""
        return list(self._history)

    @property
    def admissible_commands(self) -> list[str]:
        return list(self._admissible)

    # ------------------------------------------------------------------ resource hooks
    def reset(self) -> None:
        """Forget the episode (called by the pool before the simulator serves another rollout).

        The game state, history and admissible commands are dropped; :meth:`step` then raises
        until the next :meth:`load`, which always starts the game from a fresh engine state.
        """
        self._clear()

    def healthy(self) -> bool:
        """``False`` once process memory grew past ``max_rss_growth`` since this simulator was built."""
        if self.max_rss_growth is None or self._baseline_rss is None:
            return True
        rss = current_rss()
        if rss is None:
            return True
        grown = rss - self._baseline_rss
        if grown > self.max_rss_growth:
            log.info("ALFWorld simulator: process RSS grew by %d MiB (> %d MiB) after %d games; recycling it",
                     grown >> 20, self.max_rss_growth >> 20, self.games_loaded)
            return False
        return True

    def close(self) -> None:
        """Drop the engine (its Fast Downward library copy stays mapped until the process exits)."""
        self._clear()
        self._parsed = self._entry = None
        self._env = None

    def _clear(self) -> None:
        """Forget the episode: the current game state, admissible commands and history."""
        self._game_file = None
        self._admissible = []
        self._won = False
        self._history = []
        env = self._env
        if env is None:
            return
        # Drop the engine's game state; the parsed rules of the last game file (read-only data,
        # rebuilt into a fresh state by the next load) are kept only while _parsed names them.
        _compat.drop_game_state(env)
