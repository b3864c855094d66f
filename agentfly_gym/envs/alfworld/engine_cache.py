"""A content-keyed cache of what loading an ALFWorld game computes, in memory and on disk.

Loading a game in TextWorld's ``PddlEnv`` (the engine behind ALFWorld's ``AlfredTWEnv``) spends
its time in two pure functions of the game file's text:

- ``textworld.envs.pddl.logic.GameLogic(domain, grammar)``: the game's grammar parsed (~0.2 s);
- ``fast_downward.pddl2sas(domain, problem, optimize=...)``: Fast Downward's translation of the
  PDDL problem, once plain and once optimised for replanning (~0.2-0.4 s each).  ``PddlEnv.load``
  builds a ``PddlState`` (both translations) and ``PddlEnv.reset`` builds another one from the same
  text, so a load and reset translate four times.

:func:`serving` answers these calls from an :class:`EngineEntry` while the engine loads or resets
a game: a result computed before is handed out as a fresh copy (unpickled, so the engine may mutate
it as it does its own: ``PddlState`` adds types to the ``GameLogic``), and a result not computed
before is computed by the real function and recorded.  An entry only answers a call whose inputs
are byte-for-byte those it recorded (each result is filed under the SHA-256 of the function name
and its inputs), so it cannot change what the engine computes, only skip recomputing it.

What is not per game is shared by all games of the process, keyed by content: the grammar snippets
(production rules and command templates) that ``textgen._parse_and_convert`` parses with TatSu, ~85%
the same text in every game, and the rule conditions its derivations query (``textworld.logic``), are
parsed once per process (:data:`SYMBOL_ENTRIES`, LRU, fresh copies
handed out).  The PDDL domain is the same text in all games, but Fast Downward parses it in
milliseconds; its costly work, the grounding of the game's problem, is per game.  So a game never
seen before still pays both translations; :func:`prefetch` makes the optimised one in a child
process (``_translate_worker.py``, one per process, started with the first simulator) while this
process parses the grammar and makes the plain one.  Fast Downward's output does not depend on the
process (the same SAS text under any ``PYTHONHASHSEED``), which is also what lets a disk entry
written by one process serve another.  A worker that dies or fails is replaced, and the translation
is then made in-process, which raises the real error if there is one.

Entries are keyed per game file by :func:`entry_key`: SHA-256 of the file's bytes, the options
that change what is played (``upgrade_games``), the versions of the packages that compute and
unpickle the results and this module's format number.  A changed game file has another key.  On
disk an entry is one zlib-compressed pickle under ``$AGENTFLY_GYM_CACHE/alfworld/engine/``
(default ``~/.cache/agentfly-gym/alfworld/engine``; ~0.2-0.3 MB per game), written to a temporary
file and renamed into place, so concurrent writers never leave a torn file; an unreadable file
counts as a miss and is rewritten.  Pickles are only read from that folder, which belongs to the
user: do not point ``AGENTFLY_GYM_CACHE`` at a folder others can write.  In memory the last
:data:`MEMORY_ENTRIES` entries are kept per process, shared by its simulators.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import logging
import os
import pickle
import subprocess
import sys
import threading
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...data.paths import cache_dir
from ...utils.forks import forget_in_child
from . import _compat

__all__ = ["FORMAT", "MEMORY_ENTRIES", "SYMBOL_ENTRIES", "WORKER_REQUESTS", "EngineCache", "EngineEntry", "entry_key",
           "prefetch", "serving", "start_translation_worker", "stop_translation_worker"]

log = logging.getLogger(__name__)

#: Version of the entry format; part of every key.
FORMAT = 1
#: Entries kept in memory per process (~0.9 MB each, uncompressed pickles).
MEMORY_ENTRIES = 32
#: Parsed grammar snippets kept in memory per process, shared by all games (~2-4 KB each).
SYMBOL_ENTRIES = 8192
#: Translations one worker process makes before it is replaced (bounds what its heap can grow to).
WORKER_REQUESTS = 500
#: The packages whose versions are part of the key: they compute the results or define the pickled classes.
_KEY_PACKAGES = ("textworld", "fast-downward-textworld", "alfworld", "tatsu")


@functools.lru_cache(maxsize=1)
def _package_versions() -> str:
    out = []
    for name in _KEY_PACKAGES:
        try:
            out.append(f"{name}={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{name}=none")
    out.append("python={}.{}".format(*sys.version_info[:2]))
    return ";".join(out)


def entry_key(game_bytes: bytes, *, upgrade_games: bool) -> str:
    """The cache key of a game file: SHA-256 (hex, 64 characters) of the format, package versions,
    ``upgrade_games`` and the SHA-256 of the file's bytes ``game_bytes``."""
    h = hashlib.sha256(f"alfworld-engine/{FORMAT};{_package_versions()};upgrade_games={bool(upgrade_games)}\n".encode())
    h.update(hashlib.sha256(game_bytes).digest())
    return h.hexdigest()


def _call_digest(function: str, *texts: str, **flags: Any) -> str:
    h = hashlib.sha256(function.encode())
    for t in texts:
        b = t.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    h.update(repr(sorted(flags.items())).encode())
    return h.hexdigest()


@dataclasses.dataclass
class EngineEntry:
    """The results recorded for one game file: call digest -> pickled result.

    Attributes:
        results: ``{digest: pickle bytes}`` (see :func:`serving`).
        dirty: a result was added since the entry was read or written.
        pending: translations started by :func:`prefetch` and not yet collected (never written to disk).
    """

    results: dict[str, bytes] = dataclasses.field(default_factory=dict)
    dirty: bool = False
    #: translations under way in the translation worker (:func:`prefetch`): digest -> future of pickle bytes
    pending: dict[str, concurrent.futures.Future] = dataclasses.field(default_factory=dict, repr=False)


@contextlib.contextmanager
def serving(entry: EngineEntry) -> Iterator[EngineEntry]:
    """While the block runs, ``GameLogic(...)`` and ``fast_downward.pddl2sas(...)`` as TextWorld's PDDL
    engine calls them are answered from ``entry`` when it holds their inputs' results (or the worker
    started by :func:`prefetch` delivers them), and computed and recorded into ``entry`` when not;
    ``textworld.envs.pddl.textgen._parse_and_convert`` and ``textworld.logic._parse_and_convert``
    (TatSu's parses of a grammar snippet and of a rule condition, pure functions of their text) are
    answered from the process-wide snippet memo.

    How the engine's calls reach these answers (four module attributes rebound for the block's time, with
    the versions of TextWorld and Fast Downward it was verified for) is :func:`._compat.answering_engine_calls`;
    with other versions the engine computes everything itself and ``entry`` stays as it was.  Hold the
    engine lock of :mod:`.simulator` around it: that lock already serialises all engine work of this
    process.  A call from elsewhere in the block's time is still answered correctly: the answers are what
    the real functions return for the same inputs.
    """

    def answer(digest: str, compute: Any) -> Any:
        blob = entry.results.get(digest)
        if blob is None:
            blob = _collect(entry, digest)
            if blob is not None:
                entry.results[digest] = blob
                entry.dirty = True
        if blob is not None:
            return pickle.loads(blob)  # noqa: S301 - our own cache, see the module docstring
        value = compute()
        entry.results[digest] = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        entry.dirty = True
        return value

    def game_logic(domain: str, grammar: str, compute: Any) -> Any:
        return answer(_call_digest("GameLogic", domain, grammar), compute)

    def pddl2sas(domain: str, problem: str, optimize: bool, compute: Any) -> Any:
        return answer(_call_digest("pddl2sas", domain, problem, optimize=optimize), compute)

    def parse(tag: str, text: str, rule_name: Any, compute: Any) -> Any:
        return _SYMBOLS.get((tag, text, rule_name), compute)

    with _compat.answering_engine_calls(game_logic, pddl2sas, parse):
        yield entry


class _SymbolMemo:
    """Process-wide LRU of TextWorld's parsed grammar snippets and rule conditions (``textgen`` and
    ``textworld.logic``'s ``_parse_and_convert``), keyed by the parser, the text and the rule name: the same rule texts recur in every game's grammar and command templates, so
    they are parsed once per process.  Each call gets a fresh copy (unpickled): the engine sets the
    symbols' contexts in place."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: collections.OrderedDict[tuple[str, str, Any], bytes] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[str, str, Any], compute: Any) -> Any:
        with self._lock:
            blob = self._items.get(key)
            if blob is not None:
                self._items.move_to_end(key)
                self.hits += 1
        if blob is not None:
            return pickle.loads(blob)  # noqa: S301 - pickled by this process
        value = compute()
        blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self.misses += 1
            self._items[key] = blob
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


_SYMBOLS = _SymbolMemo(SYMBOL_ENTRIES)

# ------------------------------------------------------------------------------- translation worker
_WORKER_SCRIPT = Path(__file__).with_name("_translate_worker.py")


class _TranslationWorker:
    """One child process (``_translate_worker.py``) running ``fast_downward.pddl2sas``, fed by one thread.

    Requests are answered in order; a request's future raises where the child failed or died (the
    caller then translates in-process).  The child exits when its stdin closes (this process exited or
    :meth:`close`).

    Not :class:`~agentfly_gym.resources.isolated.ChildProcessObject`: its child imports the package
    (gymnasium, the env registry: ~0.35 s), while this script imports only Fast Downward (~0.1 s).
    With the shared child a fresh process's first cold reset took 1.05 s median (max 1.86 s) against
    0.72 s (max 0.96 s) with this script, same 6 games in one session (``bench_sim_costs --parts
    resets``)."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen([sys.executable, "-P", str(_WORKER_SCRIPT)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self._thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="alfworld-translate")
        self.broken = False
        self.requests = 0

    def submit(self, domain: str, problem: str, optimize: bool) -> concurrent.futures.Future:
        self.requests += 1
        return self._thread.submit(self._call, domain, problem, optimize)

    def _call(self, domain: str, problem: str, optimize: bool) -> bytes:
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            body = pickle.dumps((domain, problem, bool(optimize)), protocol=pickle.HIGHEST_PROTOCOL)
            proc.stdin.write(len(body).to_bytes(8, "little") + body)
            proc.stdin.flush()
            head = proc.stdout.read(9)
            if len(head) < 9:
                raise EOFError("the translation worker exited")
            n = int.from_bytes(head[1:], "little")
            out = proc.stdout.read(n)
            if len(out) < n:
                raise EOFError("the translation worker exited mid-answer")
        except (OSError, EOFError):
            self.broken = True
            raise
        if head[0] != 0:
            raise RuntimeError(f"translation failed in the worker: {pickle.loads(out)}")  # noqa: S301 - our child
        return out

    def close(self) -> None:
        self.broken = True
        with contextlib.suppress(OSError):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        self._thread.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


class _WorkerSlot:
    """The process's one translation worker, behind a lock (the slot is forgotten in a forked child)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.worker: _TranslationWorker | None = None


_slot = _WorkerSlot()


@forget_in_child
def _forget_parent_worker() -> None:
    """In a forked child: the parent's worker thread does not exist here and its pipes are the parent's;
    start a worker of this process's own on first use."""
    _slot.__init__()


def start_translation_worker() -> _TranslationWorker | None:
    """The process's one translation worker, started on the first call (a child process that imports
    Fast Downward in the background) and replaced when it broke or made :data:`WORKER_REQUESTS`
    translations; ``None`` where it cannot be started (logged)."""
    with _slot.lock:
        worker = _slot.worker
        if worker is not None and (worker.broken or worker.requests >= WORKER_REQUESTS):
            worker.close()
            _slot.worker = None
        if _slot.worker is None:
            try:
                _slot.worker = _TranslationWorker()
            except (OSError, RuntimeError) as e:
                log.warning("ALFWorld: cannot start the translation worker (translations stay in-process): %s", e)
                return None
        return _slot.worker


def stop_translation_worker() -> None:
    """Stop the translation worker if one runs (a later :func:`prefetch` starts a new one)."""
    with _slot.lock:
        worker, _slot.worker = _slot.worker, None
    if worker is not None:
        worker.close()


def _translation_digest(domain: str, problem: str, optimize: bool) -> str:
    return _call_digest("pddl2sas", domain, problem, optimize=bool(optimize))


def prefetch(entry: EngineEntry, domain: str, problem: str) -> bool:
    """Start Fast Downward's optimised translation of ``problem`` (the one ``PddlState`` asks for second)
    in the translation worker when ``entry`` does not hold it yet, so that it runs while this process
    parses the grammar and makes the plain translation.  :func:`serving` collects it.

    The worker runs the real ``fast_downward.pddl2sas`` on the same texts, whose output does not depend
    on the process (same SAS text under different ``PYTHONHASHSEED``, checked when this was written).

    Returns:
        whether a translation was started.
    """
    digest = _translation_digest(domain, problem, True)
    if digest in entry.results or digest in entry.pending:
        return False
    worker = start_translation_worker()
    if worker is None:
        return False
    try:
        entry.pending[digest] = worker.submit(domain, problem, True)
    except RuntimeError as e:  # shut down (interpreter exit)
        log.warning("ALFWorld: translation worker unavailable (translating in-process): %s", e)
        return False
    return True


def _collect(entry: EngineEntry, digest: str) -> bytes | None:
    """The pickled result of the worker's translation ``digest``, or ``None`` (none started, or it failed:
    the caller then computes it in-process, so an error is raised as the real function raises it)."""
    future = entry.pending.pop(digest, None)
    if future is None:
        return None
    try:
        return future.result()
    except Exception as e:  # noqa: BLE001 - the in-process retry raises the real error, if any
        log.warning("ALFWorld: the translation worker gave no result (translating in-process): %s", e)
        return None


class EngineCache:
    """Entries by key: a per-process memory (LRU, :data:`MEMORY_ENTRIES`) over an optional folder.

    Args:
        directory: the folder of the on-disk entries; ``None``: memory only.  Created on the first write.

    All methods are thread-safe; disk errors are logged and treated as misses.
    """

    _memory: collections.OrderedDict[str, EngineEntry] = collections.OrderedDict()
    _lock = threading.Lock()

    def __init__(self, directory: str | os.PathLike | None) -> None:
        self.directory = Path(directory) if directory is not None else None
        self.memory_hits = 0
        self.disk_hits = 0
        self.misses = 0

    @classmethod
    def default_directory(cls) -> Path:
        """``$AGENTFLY_GYM_CACHE/alfworld/engine`` (see :func:`agentfly_gym.data.paths.cache_dir`)."""
        return cache_dir("alfworld", "engine")

    @classmethod
    def clear_memory(cls) -> None:
        """Forget the entries held in this process's memory (the disk is left as it is)."""
        with cls._lock:
            cls._memory.clear()

    def path(self, key: str) -> Path | None:
        """The file of entry ``key`` (whether or not it exists), or ``None`` without a folder."""
        return None if self.directory is None else self.directory / f"{key}.pickle.zlib"

    def get(self, key: str) -> EngineEntry:
        """The entry of ``key``: from memory, else from disk, else a new empty one (to be filled by
        :func:`serving` and stored with :meth:`put`)."""
        with self._lock:
            entry = self._memory.get(key)
            if entry is not None:
                self._memory.move_to_end(key)
                self.memory_hits += 1
                return entry
        entry = self._read(key)
        if entry is None:
            self.misses += 1
            return EngineEntry()
        self.disk_hits += 1
        self._remember(key, entry)
        return entry

    def put(self, key: str, entry: EngineEntry) -> None:
        """Keep ``entry`` in memory and, when it gained results or this cache's folder lacks it (an entry
        another cache of this process computed, held in the shared memory), write it to disk (atomic rename)."""
        self._remember(key, entry)
        path = self.path(key)
        if not entry.dirty and (path is None or not entry.results or path.exists()):
            return
        entry.dirty = False
        if path is None:
            return
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(zlib.compress(pickle.dumps(dict(entry.results), protocol=pickle.HIGHEST_PROTOCOL), 1))
            os.replace(tmp, path)
        except OSError as e:
            log.warning("ALFWorld: cannot write the engine cache file %s: %s", path, e)
            with contextlib.suppress(OSError):
                tmp.unlink()

    def discard(self, key: str) -> bool:
        """Forget entry ``key`` in memory and on disk.

        Returns:
            whether an entry holding results was there (in memory or on disk).
        """
        with self._lock:
            entry = self._memory.pop(key, None)
        had = entry is not None and bool(entry.results)
        path = self.path(key)
        if path is not None:
            try:
                path.unlink()
                had = True
            except FileNotFoundError:
                pass
            except OSError as e:
                log.warning("ALFWorld: cannot remove the engine cache file %s: %s", path, e)
        return had

    def _remember(self, key: str, entry: EngineEntry) -> None:
        with self._lock:
            self._memory[key] = entry
            self._memory.move_to_end(key)
            while len(self._memory) > MEMORY_ENTRIES:
                self._memory.popitem(last=False)

    def _read(self, key: str) -> EngineEntry | None:
        path = self.path(key)
        if path is None:
            return None
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            log.warning("ALFWorld: cannot read the engine cache file %s: %s", path, e)
            return None
        try:
            results = pickle.loads(zlib.decompress(blob))  # noqa: S301 - our own cache, see the module docstring
            if not isinstance(results, dict) or not all(isinstance(k, str) and isinstance(v, bytes)
                                                        for k, v in results.items()):
                raise ValueError("not a mapping of digests to pickles")
        except Exception as e:  # noqa: BLE001 - a torn or foreign file is a miss, rewritten later
            log.warning("ALFWorld: ignoring the unreadable engine cache file %s: %s", path, e)
            return None
        return EngineEntry(results=results)
