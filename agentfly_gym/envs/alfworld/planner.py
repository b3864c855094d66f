"""The ALFWorld expert: the game's own PDDL plan, computed once in a child process and cached on disk.

ALFWorld's planner expert (``AlfredExpertType.PLANNER`` in ``alfred_tw_env.py``) reads
TextWorld's ``policy_commands``, i.e. Fast Downward's plan for the game's PDDL problem from
the current state.  Asking for it every step costs 0.4-1.4 s, and a few ``pick_two_obj`` games
need 150-215 s and 500+ MB for one plan, so here a plan is

* computed in a separate Python process (``_plan_worker.py``) that is killed on timeout or
  cancellation, so neither the event loop nor a simulator thread is ever stuck in the planner
  and its memory is returned when it exits;
* cached on disk under ``$AGENTFLY_GYM_CACHE/alfworld/plans/``, keyed by the SHA-256 of the game
  file's bytes, of the game-file version played (see :mod:`.logic`: an upgraded 2.1.1 game names
  its commands as 2.1.2 does, ``move <o> to <r>``) and of the commands applied so far, so each
  game's plan is computed once per machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ...data.paths import cache_dir
from ...errors import EnvError
from .logic import upgrade_game

__all__ = ["ExpertPlanError", "ExpertPlanTimeout", "compute_plan", "plan_cache_path"]

log = logging.getLogger(__name__)

_WORKER = Path(__file__).with_name("_plan_worker.py")


class ExpertPlanError(EnvError):
    """The ALFWorld expert has no plan: the planner failed, found none, or its child process crashed."""


class ExpertPlanTimeout(ExpertPlanError, TimeoutError):
    """The planner did not finish within its timeout (some ALFWorld games need minutes)."""


def plan_cache_path(game_file: str | os.PathLike, history: Sequence[str], upgrade: bool = True) -> Path:
    """Cache file of the plan for ``game_file`` after ``history`` (blocking: hashes the game file).

    ``upgrade``: whether the game is played upgraded to 2.1.2 (see :func:`compute_plan`).
    """
    h = hashlib.sha256()
    h.update(Path(game_file).read_bytes())
    h.update(b"\0")
    h.update(json.dumps(list(history)).encode())
    if upgrade:
        h.update(b"\0game-2.1.2")
    digest = h.hexdigest()
    return cache_dir("alfworld", "plans", digest[:2], digest + ".json")


def _read_cache(path: Path) -> list[str] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        plan = data["plan"]
        if isinstance(plan, list) and all(isinstance(c, str) for c in plan):
            return plan
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _write_cache(path: Path, game_file: str, history: Sequence[str], plan: list[str], seconds: float) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"game_file": game_file, "history": list(history), "plan": plan,
                                   "planning_seconds": round(seconds, 3)}), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        log.warning("ALFWorld: cannot write plan cache %s: %s", path, e)


def _request(game_file: str, history: list[str], upgrade: bool) -> bytes:
    """The worker's stdin: the game's data as played (upgraded or as stored) and the history."""
    with open(game_file, encoding="utf-8") as f:
        game = json.load(f)
    if upgrade:
        game = upgrade_game(game)
    return json.dumps({"game": game, "game_file": game_file, "history": history}).encode()


async def compute_plan(game_file: str | os.PathLike, history: Sequence[str] = (), *, timeout: float | None = 300.0,
                       use_cache: bool = True, upgrade: bool = True) -> list[str]:
    """The expert's command sequence that wins ``game_file`` from the state after ``history``.

    Args:
        game_file: a ``game.tw-pddl`` file.
        history: admissible commands already applied, in order.
        timeout: seconds the planner may run (``None``: no limit); the child process is killed after it.
        use_cache: read and write the on-disk plan cache.
        upgrade: plan the game as the simulator plays it with ``upgrade_games=True`` (a json 2.1.1
            file upgraded to 2.1.2, :func:`~agentfly_gym.envs.alfworld.logic.upgrade_game`);
            ``False``: as stored.  The commands differ (``move`` vs ``put ... in/on``).

    Returns:
        The plan as a list of admissible commands (empty if ``history`` already wins).

    Raises:
        ExpertPlanTimeout: the planner ran longer than ``timeout`` seconds.
        ExpertPlanError: the planner found no plan, a history command was not admissible, the
            game file cannot be read, or the child process failed.
    """
    game_file = str(game_file)
    history = [str(c) for c in history]
    path = await asyncio.to_thread(plan_cache_path, game_file, history, upgrade) if use_cache else None
    if path is not None:
        cached = await asyncio.to_thread(_read_cache, path)
        if cached is not None:
            return cached
    try:
        request = await asyncio.to_thread(_request, game_file, history, bool(upgrade))
    except (OSError, ValueError, EnvError) as e:
        raise ExpertPlanError(f"ALFWorld expert: cannot read the game file {game_file}: {e}") from e
    t0 = time.monotonic()
    # -P: the worker's own folder (which holds env.py, games.py, ...) must not shadow top-level modules.
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-P", str(_WORKER), str(os.getpid()), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate(request)
    except TimeoutError:
        raise ExpertPlanTimeout(f"ALFWorld expert: the planner did not finish within {timeout}s for {game_file} "
                                f"(some games need minutes; raise planner_timeout)") from None
    finally:
        if proc.returncode is None:  # timed out or cancelled: never leave the child behind
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(Exception):
                await asyncio.shield(proc.wait())
    seconds = time.monotonic() - t0
    lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.strip()]
    result = None
    if lines:
        with contextlib.suppress(ValueError):
            result = json.loads(lines[-1])
    if not isinstance(result, dict):
        tail = err.decode(errors="replace").strip()[-500:]
        raise ExpertPlanError(f"ALFWorld expert: the planner process failed (exit code {proc.returncode}) for "
                              f"{game_file}: {tail or 'no output'}")
    if "error" in result:
        raise ExpertPlanError(f"ALFWorld expert: no plan for {game_file} after {len(history)} commands: {result['error']}")
    plan = [str(c) for c in result.get("plan", [])]
    log.debug("ALFWorld expert: planned %d commands in %.1fs for %s", len(plan), seconds, game_file)
    if path is not None:
        await asyncio.to_thread(_write_cache, path, game_file, history, plan, seconds)
    return plan
