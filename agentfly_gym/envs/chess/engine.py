"""Stockfish as an in-process resource: one UCI process per instance, driven by python-chess's async
``UciProtocol`` (started with ``chess.engine.popen_uci``) on the instance's own event loop.

The resource manager builds instances from an :class:`~agentfly_gym.resources.InProcessSpec`
whose factory is ``"agentfly_gym.envs.chess.engine:StockfishEngine"`` (see :func:`engine_spec`);
every call runs on the instance's own worker thread, and the pool uses :meth:`StockfishEngine.reset`
(between episodes), :meth:`StockfishEngine.healthy` (health check) and
:meth:`StockfishEngine.close` (release).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import shutil
import signal
import threading
from pathlib import Path
from typing import Any

import chess
import chess.engine

from ...errors import ResourceDied, ResourceUnavailable
from ...limits import check_int
from ...resources.inprocess import ObjectProxy, forward
from ...resources.spec import InProcessSpec

__all__ = ["StockfishEngine", "find_stockfish", "engine_spec", "ENGINE_FACTORY"]

log = logging.getLogger(__name__)

#: The factory path of :class:`StockfishEngine` for an :class:`InProcessSpec`.
ENGINE_FACTORY = "agentfly_gym.envs.chess.engine:StockfishEngine"

_FALLBACK_DIRS = ("/usr/games", "/usr/local/games", "/usr/local/bin", "/opt/homebrew/bin")


def find_stockfish(path: str | os.PathLike | None = None) -> str:
    """The Stockfish executable: ``path`` if given, else ``stockfish`` on ``PATH``, else ``/usr/games/stockfish``
    (where Debian's ``stockfish`` package puts it) and a few other usual folders.

    Returns:
        an absolute path to an executable file.

    Raises:
        ResourceUnavailable: ``path`` is not an executable file, or no Stockfish was found; the
            message says how to install it.
    """
    if path is not None:
        p = Path(path).expanduser()
        if not p.is_file() and os.sep not in str(path):
            found = shutil.which(str(path))
            if found:
                return str(Path(found).resolve())
        if not p.is_file() or not os.access(p, os.X_OK):
            raise ResourceUnavailable(f"stockfish_path={str(path)!r} is not an executable file")
        return str(p.resolve())
    found = shutil.which("stockfish")
    if found:
        return str(Path(found).resolve())
    for d in _FALLBACK_DIRS:
        p = Path(d) / "stockfish"
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    raise ResourceUnavailable(
        "Stockfish was not found on PATH or in " + ", ".join(_FALLBACK_DIRS) + ". Install it (Debian/Ubuntu: "
        "`apt-get install stockfish`, macOS: `brew install stockfish`) or pass stockfish_path=<executable>.")


def engine_spec(path: str, *, max_instances: int = 4, threads: int = 1, hash_mb: int = 16,
                max_idle_time: float | None = 300.0) -> InProcessSpec:
    """The resource spec of a pool of Stockfish engines.

    Args:
        path: the Stockfish executable (see :func:`find_stockfish`).
        max_instances: pool capacity: the most Stockfish processes alive at once for this spec.
        threads: the UCI ``Threads`` option per engine.
        hash_mb: the UCI ``Hash`` option per engine, in MiB.
        max_idle_time: seconds an idle engine waits for the next episode before it is stopped (as
            containers and ScienceWorld's JVMs); ``None`` keeps idle engines until the manager closes.

    Raises:
        ConfigError: a value is out of range.
    """
    check_int("max_instances", max_instances)
    check_int("engine_threads", threads)
    check_int("engine_hash_mb", hash_mb, unit="MiB")
    return InProcessSpec(factory=ENGINE_FACTORY, kwargs={"path": path, "threads": threads, "hash_mb": hash_mb},
                         max_instances=max_instances, max_idle_time=max_idle_time, start_timeout=60.0,
                         close_timeout=15.0, name="stockfish")


class _EngineLoop:
    """A private event loop on a daemon thread, where one engine's python-chess protocol lives.

    The engine is started with python-chess's public async API (``chess.engine.popen_uci``) on this
    loop, and every call is a coroutine of its ``UciProtocol`` run here with
    ``asyncio.run_coroutine_threadsafe``; the calling thread (the resource's worker) waits on the
    returned future, which another thread may cancel (:meth:`StockfishEngine.stop_search`).

    The thread is a daemon: the interpreter joins non-daemon threads before it runs ``atexit`` hooks, so
    an engine loop on a non-daemon thread (as python-chess's ``SimpleEngine`` has) would keep a script
    that never closed its environment from exiting.  If even the hook that closes the engine is skipped,
    Stockfish exits on its own when its stdin closes with this process.
    """

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Any) -> concurrent.futures.Future:
        """Schedule ``coro`` on the loop; its concurrent future.

        Raises:
            RuntimeError: the loop is closed (the engine was closed).
        """
        try:
            return asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError:
            coro.close()  # never awaited: no "coroutine was never awaited" warning
            raise

    def close(self) -> None:
        """Stop the loop, wait for its thread and close it (idempotent)."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


class StockfishEngine:
    """One Stockfish process driven through python-chess's public async API on a private event loop.

    Not thread-safe by itself: the resource's worker thread is its only caller.

    Args:
        path: the executable; ``None`` searches as :func:`find_stockfish`.
        threads: UCI ``Threads``.
        hash_mb: UCI ``Hash`` in MiB.
        timeout: seconds python-chess waits for the engine beyond a search's own limit.

    Attributes:
        pid: the Stockfish process id.
        searches: searches run since the last :meth:`reset` (or since start).
        resets: how many times :meth:`reset` ran.

    Raises:
        ResourceUnavailable: no Stockfish executable.
        chess.engine.EngineError, OSError: the process failed to start or to speak UCI.
    """

    def __init__(self, path: str | None = None, *, threads: int = 1, hash_mb: int = 16, timeout: float = 10.0) -> None:
        self.path = find_stockfish(path)
        self._timeout = timeout
        self._search: concurrent.futures.Future | None = None  # the running search, for stop_search()
        self._stop = threading.Event()  # a stop asked for while no search was running yet
        self._loop = _EngineLoop(f"stockfish-loop ({self.path})")
        self._transport: asyncio.SubprocessTransport | None = None
        try:
            self._transport, self._protocol = self._call(chess.engine.popen_uci([self.path]))
            self.pid: int = self._transport.get_pid()
            self._call(self._protocol.configure({"Threads": threads, "Hash": hash_mb}))
        except BaseException:
            self.close()
            raise
        self._game = object()
        self.searches = 0
        self.resets = 0

    def _call(self, coro: Any, timeout: float | None = -1.0) -> Any:
        """Run ``coro`` on the engine's loop within ``timeout`` seconds (default: the engine's ``timeout``;
        None: no limit) and return its result.

        Raises:
            ResourceDied: the engine's loop is closed.
            TimeoutError, chess.engine.EngineError: as the coroutine.
        """
        if timeout is not None and timeout < 0:
            timeout = self._timeout
        try:
            future = self._loop.submit(asyncio.wait_for(coro, timeout))
        except RuntimeError as e:  # the engine's event loop is closed
            coro.close()
            raise ResourceDied(f"stockfish (pid {getattr(self, 'pid', None)}) is gone: {e}") from e
        return future.result()

    # -- searches
    def play(self, board: chess.Board, *, depth: int | None = None, movetime: float | None = None,
             skill_level: int | None = None) -> chess.Move:
        """The engine's move in ``board`` (its whole move stack is sent, so repetitions are known).

        Args:
            board: the position; not modified.
            depth: search depth in plies, or ``None``.
            movetime: search time in seconds, or ``None``.  Without depth and movetime, depth 10.
            skill_level: Stockfish's ``Skill Level`` (0-20, 20 is full strength) for this search only.
                Below 20 Stockfish picks among weaker moves with a clock-seeded random generator,
                so such games are not reproducible.

        Raises:
            ResourceDied: the Stockfish process is gone.
            chess.engine.EngineError: the engine returned no move (the game is over).
        """
        limit = chess.engine.Limit(depth=depth, time=movetime) if (depth or movetime) else chess.engine.Limit(depth=10)
        options = {} if skill_level is None else {"Skill Level": int(skill_level)}
        # the search's future is kept so that stop_search() (another thread) can cancel it: python-chess then
        # sends the engine UCI "stop" and the engine answers at once
        protocol = self._protocol
        timeout = None if limit.time is None else self._timeout + limit.time
        self._stop.clear()
        coro = protocol.play(board, limit, game=self._game, options=options)
        try:
            search = self._loop.submit(asyncio.wait_for(coro, timeout))
        except RuntimeError as e:  # the engine's event loop is closed
            coro.close()
            raise ResourceDied(f"stockfish (pid {self.pid}) is gone: {e}") from e
        self._search = search
        if self._stop.is_set():
            search.cancel()
        try:
            result = search.result()
        except concurrent.futures.CancelledError:
            raise ResourceDied(f"stockfish (pid {self.pid}): the search was stopped") from None
        except chess.engine.EngineTerminatedError as e:
            raise ResourceDied(f"stockfish (pid {self.pid}) died: {e}") from e
        finally:
            self._search = None
        self.searches += 1
        if result.move is None:
            raise chess.engine.EngineError(f"stockfish returned no move in {board.fen()}")
        return result.move

    def best_move(self, board: chess.Board, *, depth: int = 12) -> chess.Move:
        """Stockfish's best move at full strength, searched to ``depth`` plies."""
        return self.play(board, depth=depth)

    def stop_search(self) -> None:
        """Stop the running search (UCI ``stop``); its :meth:`play` raises ResourceDied.  Thread-safe: called
        from the event loop when the step that waits for the search is cancelled, while the resource's own
        thread is blocked in :meth:`play`.  A search about to start is stopped as soon as it starts."""
        self._stop.set()
        search = self._search
        if search is not None:
            search.cancel()

    # -- lifecycle hooks used by the pool
    def reset(self) -> None:
        """Forget the previous game: clear the hash (Stockfish's ``Clear Hash`` runs the same
        ``Search::clear()`` as ``ucinewgame``), send ``ucinewgame`` before the next search, and wait
        for ``readyok``."""
        self._call(self._protocol.configure({"Clear Hash": None}))
        self._game = object()  # python-chess sends ucinewgame when the game token changes
        self._call(self._protocol.ping())
        self.searches = 0
        self.resets += 1

    def healthy(self) -> bool:
        """True when the process answers ``isready`` with ``readyok``."""
        try:
            self._call(self._protocol.ping())
            return True
        except Exception:  # noqa: BLE001 - any failure to answer a ping is 'not healthy'
            return False

    def close(self) -> None:
        """Quit the engine and make sure its process is gone (killed if it does not quit in time); then stop
        the engine's loop.  Idempotent."""
        transport = self._transport
        if transport is not None and not self._loop.loop.is_closed():
            try:
                self._call(self._protocol.quit())
            except Exception:
                log.debug("stockfish quit failed; closing the transport", exc_info=True)
            try:
                # closing the transport kills a process that is still running
                self._loop.loop.call_soon_threadsafe(transport.close)
                self._call(self._exit_code(), timeout=5)
            except Exception:  # noqa: BLE001 - a process that will not exit is killed below
                pid = getattr(self, "pid", None)
                if pid:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
        self._loop.close()

    async def _exit_code(self) -> int:
        return await self._protocol.returncode

    def __repr__(self) -> str:
        return f"<StockfishEngine pid={getattr(self, 'pid', None)} {self.path}>"


class EngineProxy(ObjectProxy):
    """The async, typed face of a pooled :class:`StockfishEngine` (``EngineProxy(await scope.acquire(spec))``)."""

    _play = forward(StockfishEngine.play)
    _best_move = forward(StockfishEngine.best_move)

    async def play(self, board: chess.Board, *, depth: int | None = None, movetime: float | None = None,
                   skill_level: int | None = None) -> chess.Move:
        """:meth:`StockfishEngine.play` on the engine's thread; cancelling the call stops the search (without
        it a cancelled deep search would go on, and the engine's next user would wait for it)."""
        return await self._stoppable(self._play(board, depth=depth, movetime=movetime, skill_level=skill_level))

    async def best_move(self, board: chess.Board, *, depth: int = 12) -> chess.Move:
        """:meth:`StockfishEngine.best_move` on the engine's thread; cancelling it stops the search."""
        return await self._stoppable(self._best_move(board, depth=depth))

    async def _stoppable(self, call: Any) -> chess.Move:
        try:
            return await call
        except asyncio.CancelledError:
            stop = getattr(self.resource.obj, "stop_search", None)  # absent with isolation="process"
            if callable(stop):
                stop()
            raise
