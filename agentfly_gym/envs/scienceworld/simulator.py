"""One ScienceWorld simulator: a JVM driven through py4j, with a fast step path.

:class:`ScienceWorldSimulator` is the object an :class:`~agentfly_gym.resources.InProcessSpec`
builds (factory ``"agentfly_gym.envs.scienceworld.simulator:ScienceWorldSimulator"``); the
resource pool then owns its lifecycle: ``reset()`` before reuse, ``healthy()`` as the health
check and ``close()`` on release.  All methods are blocking and not thread-safe; the
in-process resource runs them on the instance's own thread.

Speed: ``scienceworld.ScienceWorldEnv.step`` also fetches the look, the inventory, the task
description and the full valid-action list on every step (340-430 ms measured); this class
calls the server's ``step``, ``getScore``, ``getCompleted`` and ``getNumMoves`` only
(16-100 ms) and lists valid actions only when asked (``admissible=True``).

Those four calls are also folded into one py4j call: the package's Java side has no method that
returns several of them (``PythonInterface.getScore``/``getCompleted`` return the fields that
``step`` sets, ``getNumMoves`` reads ``AgentInterface.curIter``), so a small Java class of ours
(:mod:`.java_fold`, loaded into the JVM at start) makes the four calls in the package's order and
returns their answers as one string.  Where it cannot be loaded (logged once), and for the calls
of a load or of a step with ``admissible=True``, the calls are pipelined: all commands are written
to one gateway connection at once and the answers read back in order (py4j has no public batch
call: :func:`._compat.pipelined_call`, version-guarded, like every use of py4j's or the package's
private names, which all live in :mod:`._compat`).  Counting moves in
Python is not an option: ``curIter`` grows once per world tick, which depends on the action
(``wait`` ticks many times, actions that take no time and unparsed input do not tick, and
``help``/``objects``/``task`` never reach the agent interface).
"""

from __future__ import annotations

import collections
import logging
import os
import re
import subprocess
import threading
from typing import Any

from ...errors import (
    ConfigError,
    EnvError,
    ResourceDied,
    ResourceStartError,
    ResourceUnavailable,
)
from . import _compat
from .tasks import check_simplification, resolve_task_name

__all__ = ["FACTORY", "ScienceWorldSimulator"]

log = logging.getLogger(__name__)

#: The factory path for :class:`~agentfly_gym.resources.InProcessSpec`.
FACTORY = "agentfly_gym.envs.scienceworld.simulator:ScienceWorldSimulator"

_HEAP_RE = re.compile(r"\d+[kKmMgG]?")
# JAVA_TOOL_OPTIONS is process-wide: set it only while one JVM is being launched, then restore it.
_LAUNCH_LOCK = threading.Lock()
# Per task: max variations and the (train, dev, test) variation lists.  They depend only on the jar.
_CATALOGUE_LOCK = threading.Lock()
_MAX_VARIATIONS: dict[str, int] = {}
_SPLIT_VARIATIONS: dict[str, dict[str, tuple[int, ...]]] = {}
# The fallback from the Java fold to pipelined calls is logged once per process at WARNING.
_FOLD_FALLBACK_LOGGED = False


class ScienceWorldSimulator:
    """A ScienceWorld JVM that plays one episode at a time; tasks are loaded on the same JVM.

    Args:
        java_heap: the JVM's maximum heap (``-Xmx``), e.g. ``"400m"`` (185-510 MB RSS measured
            over a run, mean ~330 MB, against ~1.2 GB with the JVM default); ``None`` leaves the
            JVM default.
        env_step_limit: the package's ``envStepLimit`` (default 100, but gold paths reach 770
            steps); only the package's own ``step`` reads it, episode limits are the env's
            ``max_episode_steps``.
        fold_calls: send the py4j calls of one step (and of a load) in one round trip (see the
            module docstring); ``False`` makes one round trip per call.  The results are the same.
        java_fold: make a step's four calls inside the JVM with the bundled Java class
            (:mod:`.java_fold`; one py4j call); ``False``, or a class that does not load (logged
            once), uses ``fold_calls``' path.  The results are the same.

    Raises:
        ConfigError: bad ``java_heap``.
        ResourceUnavailable: no ``scienceworld`` package or no ``java`` on PATH.
        ResourceStartError: the JVM did not start.

    Episode API: :meth:`load` -> ``(observation, info)``, :meth:`step` -> ``(observation,
    reward, terminated, truncated, info)``, :meth:`gold_actions`, :meth:`valid_actions`,
    :meth:`inventory`.  Pool API: :meth:`reset`, :meth:`healthy`, :meth:`close`.
    """

    def __init__(self, *, java_heap: str | None = "400m", env_step_limit: int = 100_000,
                 fold_calls: bool = True, java_fold: bool = True) -> None:
        if java_heap is not None and (not isinstance(java_heap, str) or not _HEAP_RE.fullmatch(java_heap)):
            raise ConfigError(f"java_heap={java_heap!r} must be None or a JVM size such as '400m' or '1g'")
        try:
            import scienceworld
        except ImportError as e:
            raise ResourceUnavailable(f"ScienceWorld needs the 'scienceworld' package (pip install scienceworld==1.2.3): {e}") from e
        self._closed = False
        self._env: Any = None
        self._launch(scienceworld.ScienceWorldEnv, java_heap, env_step_limit)
        self.fold_calls = bool(fold_calls) and _compat.can_pipeline(self._gateway)
        self._fold_step: Any = self._load_java_fold() if java_fold else None
        #: True while steps go through the Java fold (may be switched off; not on without the class).
        self.java_fold = self._fold_step is not None
        self._forget_episode()

    # ------------------------------------------------------------------ lifecycle
    def _launch(self, env_cls: Any, java_heap: str | None, env_step_limit: int) -> None:
        with _LAUNCH_LOCK:
            old = os.environ.get("JAVA_TOOL_OPTIONS")
            if java_heap is not None:
                os.environ["JAVA_TOOL_OPTIONS"] = f"{old} -Xmx{java_heap}" if old else f"-Xmx{java_heap}"
            env = env_cls.__new__(env_cls)
            try:
                try:
                    with _compat.jvm_in_own_process_group():  # a terminal's Ctrl-C reaches this process, not the JVM
                        env.__init__(envStepLimit=env_step_limit)
                except BaseException:
                    # the package's __del__ would call close() on the half-made instance and raise
                    # AttributeError ('_gateway') from inside a later garbage collection
                    _compat.disarm_package_env(env)
                    raise
                self._env = env
            except FileNotFoundError as e:
                raise ResourceUnavailable(f"ScienceWorld needs Java 11+ ('java' on PATH): {e}") from e
            except Exception as e:
                raise ResourceStartError(f"the ScienceWorld JVM did not start: {type(e).__name__}: {e}") from e
            finally:
                if old is None:
                    os.environ.pop("JAVA_TOOL_OPTIONS", None)
                else:
                    os.environ["JAVA_TOOL_OPTIONS"] = old
        self._server = self._env.server
        self._gateway = _compat.package_gateway(self._env)
        self._process: subprocess.Popen = self._gateway.java_process
        # the garbage collector's frees of Java object proxies are queued, and _call sends the queue from
        # this simulator's own thread (a stopped JVM would otherwise freeze whichever thread collected)
        self._freed_ids: collections.deque[str] = collections.deque()
        _compat.defer_object_frees(self._gateway, self._freed_ids)

    def _load_java_fold(self) -> Any:
        """The loaded ``FoldedStep.step`` (a py4j member), or None (logged) where it cannot be loaded."""
        global _FOLD_FALLBACK_LOGGED
        from py4j.protocol import Py4JNetworkError

        from . import java_fold  # (not at import: ``python -m`` runs that module to rebuild the class)

        self._decode_fold = java_fold.decode
        try:
            return java_fold.load(self._gateway, self._server).step
        except (java_fold.FoldUnavailable, Py4JNetworkError, OSError) as e:
            level = logging.DEBUG if _FOLD_FALLBACK_LOGGED else logging.WARNING
            _FOLD_FALLBACK_LOGGED = True
            log.log(level, "ScienceWorld: the Java step fold is unavailable (%s); steps use %s py4j calls instead",
                    e, "pipelined" if self.fold_calls else "separate")
            return None

    @property
    def pid(self) -> int:
        """The JVM's process id."""
        return self._process.pid

    def _forget_episode(self) -> None:
        self.task_name: str | None = None
        self.variation: int | None = None
        self.simplification: str = ""
        self._history: list[str] = []
        self._gold: list[str] | None = None
        self._last_score = 0

    def reset(self) -> None:
        """Forget the episode (pool reuse).  The next :meth:`load` builds a fresh world on this JVM.

        Raises:
            ResourceDied: the JVM is gone (the pool then starts a fresh simulator).
        """
        self._forget_episode()
        if not self.healthy():
            raise ResourceDied(f"ScienceWorld JVM (pid {self.pid}) is not answering")

    def healthy(self) -> bool:
        """True while the JVM process runs and answers a trivial call."""
        if self._closed or self._process.poll() is not None:
            return False
        try:
            self._call("getNumMoves")
        except Exception:  # noqa: BLE001 - any failure means unhealthy
            return False
        return True

    def close(self) -> None:
        """Shut the JVM down, for sure: gateway shutdown (bounded), then stdin EOF, then kill."""
        if self._closed or self._env is None:
            return
        self._closed = True
        env, proc = self._env, self._process
        closer = threading.Thread(target=self._shutdown_gateway, args=(self._gateway,), daemon=True,
                                  name="sw-gateway-close")
        closer.start()
        closer.join(5.0)
        _compat.mark_disconnected(self._gateway)
        if proc.poll() is None:
            try:  # py4j's --die-on-broken-pipe: the JVM exits when its stdin closes
                proc.stdin.close()
            except Exception:  # noqa: BLE001, S110 - best effort on a closing/dead JVM
                pass
            try:
                proc.wait(timeout=3.0)
            except subprocess.TimeoutExpired:
                log.warning("ScienceWorld JVM pid %s did not exit; killing it", proc.pid)
                proc.kill()
                proc.wait(timeout=10.0)
        _compat.forget_package_env(env)  # its temporary folder removed, its own close() (run by __del__) a no-op
        self._env = self._server = None

    @staticmethod
    def _shutdown_gateway(gateway: Any) -> None:
        try:
            gateway.shutdown()
        except Exception:
            log.debug("py4j gateway shutdown failed", exc_info=True)

    # ------------------------------------------------------------------ catalogue (needs the JVM)
    def max_variations(self, task_name: str) -> int:
        """Number of variations of ``task_name`` (cached per process)."""
        name = resolve_task_name(task_name)
        with _CATALOGUE_LOCK:
            n = _MAX_VARIATIONS.get(name)
        if n is None:
            n = int(self._call("getTaskMaxVariations", name))
            with _CATALOGUE_LOCK:
                _MAX_VARIATIONS[name] = n
        return n

    def split_variations(self, task_name: str) -> dict[str, tuple[int, ...]]:
        """``{"train": (...), "dev": (...), "test": (...)}``: the simulator's own variation splits.

        Cached per process; the first call for a task loads its variation 0 (0.3-1 s), so it
        must not be called in the middle of an episode.
        """
        name = resolve_task_name(task_name)
        with _CATALOGUE_LOCK:
            splits = _SPLIT_VARIATIONS.get(name)
        if splits is None:
            self._call("load", name, 0, "", False)
            self._forget_episode()
            splits = {"train": tuple(int(v) for v in self._call("getVariationsTrain")),
                      "dev": tuple(int(v) for v in self._call("getVariationsDev")),
                      "test": tuple(int(v) for v in self._call("getVariationsTest"))}
            with _CATALOGUE_LOCK:
                _SPLIT_VARIATIONS[name] = splits
        return dict(splits)

    # ------------------------------------------------------------------ episode
    def load(self, task_name: str, variation: int, simplification: str = "easy", *,
             gold: bool = False, admissible: bool = False) -> tuple[str, dict[str, Any]]:
        """Start an episode of ``task_name`` variation ``variation``; returns ``(observation, info)``.

        The observation is the task description, a blank line, then the result of ``look
        around`` (as the package's ``reset``).  ``gold=True`` also has the simulator plan the
        gold path (slower; see :meth:`gold_actions`).

        Raises:
            ConfigError: unknown task, variation outside ``0..max-1`` or bad simplification.
            ResourceDied: the JVM is gone.
        """
        name = resolve_task_name(task_name)
        simplification = check_simplification(simplification, name)
        n = self.max_variations(name)
        if isinstance(variation, bool) or not isinstance(variation, int) or not 0 <= variation < n:
            splits = self.split_variations(name)
            ranges = ", ".join(f"{s} {min(v)}-{max(v)}" for s, v in splits.items() if v)
            raise ConfigError(f"variation={variation!r} is not valid for task {name!r}: use an int in 0..{n - 1} ({ranges})")
        self._forget_episode()
        err = self._call("load", name, variation, simplification, gold)
        if err:
            raise ConfigError(f"ScienceWorld could not load {name}:{variation} ({simplification!r}): {err}")
        self.task_name, self.variation, self.simplification = name, variation, simplification
        if gold:
            self._gold = [str(a) for a in self._call("getGoldActionSequence")]
        look, desc, *flags = self._call_many(("step", "look around"), ("freeActionTaskDesc",),
                                             *self._flag_calls(admissible))
        obs = f"{desc.strip()}\n\n{look.strip()}"
        # the reward baseline is 0, not the starting score, so the return is final score / 100
        self._last_score = 0
        return obs, self._info(*flags)

    def step(self, action: str, *, admissible: bool = False) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply one command.  Returns ``(observation, reward, terminated, truncated, info)``.

        ``reward = (score_t - score_{t-1}) / 100`` where score is the simulator's 0-100 task
        score (``round(100 * getScore())``, as the package's ``step``) and ``score_0 = 0``, so
        an episode's return is exactly its final score / 100, in [-1, 1].  Some tasks start
        with points (e.g. 8 for an already open door under ``"easy"``): the first step's
        reward carries them.  ``terminated`` when the task is completed
        (``getCompleted``) or failed (score < 0: the simulator sets -100 on a failure such as
        focusing on the wrong object).  ``truncated`` is always False (step limits belong to
        the env).  ``info``: ``score`` (int, -100..100), ``won`` (completed with score 100),
        ``moves`` (int, the simulator's move counter), ``admissible_actions`` (list[str]) when
        ``admissible``.  An unknown command yields the simulator's "No known action matches
        that input." with reward 0.

        Raises:
            EnvError: no task is loaded.
            ResourceDied: the JVM is gone.
        """
        if self.task_name is None:
            raise EnvError("no ScienceWorld task is loaded; call load() first")
        action = " ".join(action.split())  # newlines and runs of spaces -> one space
        if self.java_fold:  # step, getScore, getCompleted, getNumMoves in the JVM, one call
            valid = (("getValidActionObjectCombinations",),) if admissible else ()
            folded, *rest = self._call_many((self._fold_step, action), *valid)
            try:
                obs, *flags = self._decode_fold(folded)
            except (TypeError, ValueError) as e:
                raise EnvError(f"ScienceWorld's folded step answered {str(folded)[:200]!r}: {e}") from e
            flags += rest
        else:
            obs, *flags = self._call_many(("step", action), *self._flag_calls(admissible))
        self._history.append(action)
        info = self._info(*flags)
        score = info["score"]
        reward = (score - self._last_score) / 100.0
        self._last_score = score
        terminated = bool(info["completed"] or score < 0)
        return obs, reward, terminated, False, info

    def gold_actions(self) -> list[str]:
        """The gold action sequence of the current episode (computed once per episode).

        If the episode was loaded without the gold path, the task is reloaded with it and the
        actions taken so far are replayed (the world of a variation is deterministic), so the
        simulator ends in the same state.  Index ``t`` is the gold action for step ``t``.

        Raises:
            EnvError: no task is loaded, or the replay did not reproduce the episode's score.
            ResourceDied: the JVM is gone.
        """
        if self.task_name is None:
            raise EnvError("no ScienceWorld task is loaded; call load() first")
        if self._gold is None:
            history, score = list(self._history), self._score()
            self._call("load", self.task_name, self.variation, self.simplification, True)
            gold = [str(a) for a in self._call("getGoldActionSequence")]
            self._call("step", "look around")
            for a in history:
                self._call("step", a)
            self._history = history
            if self._score() != score:
                raise EnvError(f"replaying {len(history)} actions of {self.task_name}:{self.variation} after "
                               f"loading the gold path gave score {self._score()}, not {score}")
            self._gold = gold
        return list(self._gold)

    def valid_actions(self) -> list[str]:
        """The simulator's valid action-object combinations now (slow on big rooms: 5-300 ms)."""
        return [str(a) for a in self._call("getValidActionObjectCombinations")]

    def inventory(self) -> str:
        """The inventory text (a free action: no time passes)."""
        return str(self._call("freeActionInventory"))

    def look(self) -> str:
        """The current room's description (a free action: no time passes)."""
        return str(self._call("freeActionLook"))

    # ------------------------------------------------------------------ internals
    def _score(self) -> int:
        return _score_of(self._call("getScore"))

    @staticmethod
    def _flag_calls(admissible: bool) -> tuple[tuple[str], ...]:
        """The calls whose answers :meth:`_info` turns into ``info`` (in this order)."""
        calls: tuple[tuple[str], ...] = (("getScore",), ("getCompleted",), ("getNumMoves",))
        return calls + (("getValidActionObjectCombinations",),) if admissible else calls

    @staticmethod
    def _info(raw_score: Any, completed: Any, moves: Any, valid: Any = None) -> dict[str, Any]:
        """``info`` from the answers to :meth:`_flag_calls`."""
        score = _score_of(raw_score)
        done = bool(completed)
        info: dict[str, Any] = {"score": score, "won": done and score >= 100, "completed": done, "moves": int(moves)}
        if valid is not None:
            info["admissible_actions"] = [str(a) for a in valid]
        return info

    def _call_many(self, *calls: tuple[Any, ...]) -> list[Any]:
        """``[server.<name>(*args) for name, *args in calls]``, in one round trip when ``fold_calls``.

        ``name`` is a method name of the package's ``PythonInterface`` or a py4j member of another
        Java object.  The calls run in order on the JVM whatever happens; an exception of one call
        is raised after all answers are read (so the connection stays in step), as :meth:`_call`
        raises it.
        """
        if not self.fold_calls or len(calls) == 1:
            return [self._call(name, *args) for name, *args in calls]
        if self._closed:
            raise ResourceDied("the ScienceWorld simulator was closed")
        from py4j.protocol import Py4JError, Py4JJavaError

        try:
            self._send_freed_ids()
            return _compat.pipelined_call(self._server, calls)
        except Py4JJavaError as e:
            raise EnvError(f"ScienceWorld raised: {str(e)[:500]}") from e
        except (Py4JError, OSError) as e:
            state = "died" if self._process.poll() is not None else "is not answering"
            if self._process.poll() is not None:
                _compat.mark_disconnected(self._gateway)
            raise ResourceDied(f"ScienceWorld JVM (pid {self.pid}) {state}: {type(e).__name__}: {str(e)[:200]}") from e

    def _call(self, method: Any, *args: Any) -> Any:
        """Call ``server.<method>(*args)`` (or ``method(*args)`` for a py4j member); a dead JVM
        becomes :class:`ResourceDied`."""
        if self._closed:
            raise ResourceDied("the ScienceWorld simulator was closed")
        from py4j.protocol import Py4JError, Py4JJavaError

        try:
            self._send_freed_ids()
            return (getattr(self._server, method) if isinstance(method, str) else method)(*args)
        except Py4JJavaError as e:  # an exception inside a live JVM
            raise EnvError(f"ScienceWorld raised: {str(e)[:500]}") from e
        except (Py4JError, OSError) as e:  # connection lost: the JVM died or hangs
            state = "died" if self._process.poll() is not None else "is not answering"
            if self._process.poll() is not None:
                _compat.mark_disconnected(self._gateway)
            raise ResourceDied(f"ScienceWorld JVM (pid {self.pid}) {state}: {type(e).__name__}: {str(e)[:200]}") from e

    def _send_freed_ids(self) -> None:
        """Tell the JVM which Java objects Python no longer references (py4j's memory management)."""
        _compat.send_freed_objects(self._gateway, self._freed_ids)


def _score_of(raw: Any) -> int:
    """The 0-100 score from ``getScore``'s 0-1 value, as the package's ``step``: ``round(100 * x)``."""
    return int(round(100 * float(raw)))
