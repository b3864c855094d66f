"""Self-play in verl 0.9.1: both players of a multi-agent game (``agentfly/ChessSelfPlay-v0``) are the
policy being trained, and each player's trajectory becomes rows of the batch with the reward that side
earned.

Why two sessions per game: verl's V1 trainer copies the reward of the LAST row of a ``run()`` to every
row of it and computes GRPO on each session's final row (``agent_loop_tq._agent_loop_postprocess``,
``trainer/ppo/v1/utils.compute_advantage_for_multi_trajectories``), so two players returned by one
``run()`` would share one reward.  Instead the ``rollout.n`` sessions of one data row are paired:
sessions ``2k`` and ``2k+1`` play game ``k`` (White and Black).  Whichever session of a pair arrives
first starts the game, which generates for BOTH sides through verl's server manager (one
``request_id`` per player); each session then returns only its own player's rows, with that side's
reward (+1 win, -1 loss, 0 draw / no result).  The sessions of a data row form the GRPO group (verl's
``uid``), so the group's advantages set winners against losers; ``group_id`` in ``extra_fields`` is
the game id, tying the two players of one game together.

No session ever waits for its partner: if the partner never comes (an odd ``rollout.n``, or the pair
split across workers), the game is still played to the end by the session that started it and the
partner's rows are dropped after ``claim_timeout`` seconds.  The legacy trainer (one output per
``run()``) gets the same pairing by arrival order, in chain mode.

Outputs have exactly the rows, fields and checks of :class:`~agentfly_gym_verl.agent_loop.AgentFlyAgentLoop`
(chain: one row per player; step: one row per player turn); a game whose policy or env fails leaves no row
under the V1 trainer (counted in ``failure_metrics``) and an error row (reward 0, ``extra_fields["error"]``)
under the legacy one, as AgentFlyAgentLoop does; never a failed batch.

Data rows: ``extra_info = {"env_id": "agentfly/ChessSelfPlay-v0", "seed": ..., "reset_options": {"fen":
...}, "env_kwargs": {...}, "mode": ..., "max_turns": ...}`` (:func:`selfplay_rows` writes them).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any

from agentfly_gym.errors import ConfigError, EnvError
from agentfly_gym.limits import check_int
from agentfly_gym.registration import MULTIAGENT_ENVS, make_multiagent, normalize_multiagent_id
from agentfly_gym.rollout.multiagent import PlayerTrajectory, run_multiagent_game
from agentfly_gym.rollout.policies.base import SamplingParams
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

from .agent_loop import MODES, AgentFlyAgentLoop, _as_dict, _RunStart, _scalar
from .policy import VerlServerPolicy
from .runtime import chat_tokenizer, current_runtime, get_manager, get_runtime

__all__ = ["SelfPlayAgentLoop", "SelfPlayGames", "parse_selfplay_row", "selfplay_rows", "pending_games"]

log = logging.getLogger(__name__)


class _Game:
    def __init__(self) -> None:
        self.task: asyncio.Task | None = None
        self.policies: dict[str, VerlServerPolicy] = {}
        self.claimed: set[int] = set()
        self.finished_at: float | None = None


_MAX_ARRIVALS = 100_000


class SelfPlayGames:
    """The self-play games in flight of one worker's runtime (:class:`~agentfly_gym_verl.runtime.WorkerRuntime`,
    one event loop): which session of a data row plays which game.  Made on first use, dropped when the
    runtime closes (:func:`~agentfly_gym_verl.runtime.aclose`), so no game outlives its manager.

    Attributes:
        games: (uid, game index) -> the game, until both its sessions claimed their rows (or ``claim_timeout``
            after it finished).
        arrivals: uid -> the counter that pairs sessions by arrival order (the legacy trainer gives no
            session id); at most :data:`_MAX_ARRIVALS` uids kept.
    """

    def __init__(self) -> None:
        self.games: dict[tuple[str, int], _Game] = {}
        self.arrivals: dict[str, itertools.count] = {}

    def session_of(self, uid: str) -> int:
        """The next arrival number of a session of ``uid``'s data row."""
        if uid not in self.arrivals and len(self.arrivals) >= _MAX_ARRIVALS:
            self.arrivals.pop(next(iter(self.arrivals)))  # forget the oldest row's counter (bounded memory)
        return next(self.arrivals.setdefault(uid, itertools.count()))

    def purge(self, timeout: float) -> None:
        """Drop finished games whose partner session has not claimed its rows within ``timeout`` seconds."""
        now = time.monotonic()
        for key, g in list(self.games.items()):
            if g.finished_at is not None and now - g.finished_at > timeout:
                log.info("self-play game %s: the partner session never claimed its rows; dropped", key)
                del self.games[key]

    def close(self) -> None:
        """Forget every game; a game still being played is cancelled (its sessions end with CancelledError)."""
        games = list(self.games.values())
        self.games.clear()
        self.arrivals.clear()
        for g in games:
            if g.task is not None and not g.task.done():
                loop = g.task.get_loop()
                if not loop.is_closed():  # from any thread (a runtime is closed from outside its loop too)
                    loop.call_soon_threadsafe(g.task.cancel)


def _games() -> SelfPlayGames:
    """The self-play games of the worker's runtime (made on first use)."""
    runtime = get_runtime()
    if runtime.selfplay is None:
        runtime.selfplay = SelfPlayGames()
    return runtime.selfplay


def pending_games() -> int:
    """Games of the worker's open runtime whose rows are not yet all claimed (for tests and leak checks)."""
    runtime = current_runtime()
    return len(runtime.selfplay.games) if runtime is not None and runtime.selfplay is not None else 0


def parse_selfplay_row(extra_info: Any, *, default_mode: str | None = None, default_max_turns: int = 100,
                       default_history: int = 3, default_env_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """What to play, from a self-play data row's ``extra_info``.

    Keys read: ``env_id`` (a multi-agent env, e.g. ``"ChessSelfPlay-v0"``), ``seed`` (int, < 0 or None:
    none), ``reset_options`` (dict or JSON string, e.g. ``{"fen": ...}``), ``env_kwargs`` (dict or JSON
    string, over ``default_env_kwargs``), ``mode``, ``max_turns`` (per player, >= 1), ``history`` (>= 0).

    Returns:
        dict with env_id (full id), seed, options, env_kwargs, mode, max_turns, history, task_id.

    Raises:
        ConfigError: a missing or unknown env id, a bad mode or number.
    """
    info = _as_dict(extra_info, "extra_info")
    env_id = str(info.get("env_id") or "")
    try:
        full_id = normalize_multiagent_id(env_id)
    except ConfigError:
        raise ConfigError(f"extra_info['env_id']={env_id!r} is not a multi-agent environment; known: "
                          f"{[f'agentfly/{n}' for n in MULTIAGENT_ENVS]}") from None
    mode = info.get("mode") or default_mode or "chain"
    if mode not in MODES:
        raise ConfigError(f"mode={mode!r} is not one of {MODES}")
    max_turns = default_max_turns if info.get("max_turns") is None else info["max_turns"]
    history = default_history if info.get("history") is None else info["history"]
    for key, v, lo in (("max_turns", max_turns, 1), ("history", history, 0)):
        check_int(f"extra_info[{key!r}]", v, minimum=lo)
    seed = info.get("seed")
    if seed is not None:
        if isinstance(seed, bool) or not hasattr(seed, "__index__"):
            raise ConfigError(f"extra_info['seed']={seed!r} must be an integer or None")
        seed = int(seed) if int(seed) >= 0 else None
    options = _as_dict(info.get("reset_options"), "extra_info['reset_options']")
    env_kwargs = dict(default_env_kwargs or {})
    env_kwargs.update(_as_dict(info.get("env_kwargs"), "extra_info['env_kwargs']"))
    return {"env_id": full_id, "seed": seed, "options": options or None, "env_kwargs": env_kwargs,
            "mode": mode, "max_turns": int(max_turns), "history": int(history),
            "task_id": str(options.get("fen", "")) if options else ""}


def selfplay_rows(n: int, *, env_id: str = "agentfly/ChessSelfPlay-v0", seed: int = 0, mode: str | None = None,
                  max_turns: int | None = None, env_kwargs: dict[str, Any] | None = None,
                  fens: list[str] | None = None, agent_name: str = "agentfly_selfplay") -> list[dict[str, Any]]:
    """``n`` self-play data rows in verl's data set format (``prompt``, ``data_source``, ``agent_name``,
    ``reward_model``, ``extra_info``), to write with pandas / pyarrow as a training parquet.  Row ``i``
    plays from ``fens[i % len(fens)]`` when given (else the initial position) with seed ``seed + i``.
    The ``prompt`` column holds the system prompt and the initial position as White sees it (verl's
    data set needs one; the loop renders each player's own prompt).

    Raises:
        ConfigError: an unknown env id or ``n < 1``.
    """
    import json

    check_int("n", n)
    row0 = parse_selfplay_row({"env_id": env_id})
    env = make_multiagent(row0["env_id"], **(env_kwargs or {}))
    system = env.agent_prompt.system
    rows = []
    for i in range(n):
        info: dict[str, Any] = {"env_id": row0["env_id"], "seed": seed + i,
                                "env_kwargs": json.dumps(env_kwargs or {})}
        if fens:
            info["reset_options"] = json.dumps({"fen": fens[i % len(fens)]})
        if mode is not None:
            info["mode"] = mode
        if max_turns is not None:
            info["max_turns"] = max_turns
        rows.append({"prompt": [{"role": "system", "content": system},
                                {"role": "user", "content": "A new chess game: you play one side."}],
                     "data_source": row0["env_id"], "agent_name": agent_name,
                     "reward_model": {"style": "rule", "ground_truth": ""}, "extra_info": {**info, "index": i}})
    return rows


class SelfPlayAgentLoop(AgentFlyAgentLoop):
    """verl agent loop for self-play: paired sessions of one data row play one game, each returning
    its own player's rows (see the module docstring).

    Args (besides :class:`AgentFlyAgentLoop`'s ``mode``, ``max_turns`` (per player), ``history``,
    ``max_tokens_per_turn``, ``env_kwargs``):
        claim_timeout: seconds a finished game keeps the rows of a partner session that has not
            come for them.
    """

    def __init__(self, *args: Any, claim_timeout: float = 600.0, max_turns: int = 100, **kwargs: Any) -> None:
        super().__init__(*args, max_turns=max_turns, **kwargs)
        self.claim_timeout = float(claim_timeout)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        """Play (or join) this session's game and return its player's rows.

        Returns:
            chain mode: one ``AgentLoopOutput``; step mode: a list (one per player turn, or one error row).

        Raises:
            ConfigError: step mode under ``trainer.use_v1=false``.
        """
        start = self._start(sampling_params, kwargs, parse_selfplay_row, what="agentfly self-play", step_rows="turn",
                            chain_hint="chain mode")
        if not isinstance(start, _RunStart):
            return start
        want_logprobs, uid, use_v1, row, mode = start.want_logprobs, start.group_id, start.use_v1, start.row, start.mode
        table = _games()
        session = _scalar(kwargs.get("session_id"))
        if session is None:  # the legacy trainer gives no session id: pair by arrival order
            session = table.session_of(uid)
        session = int(session)
        key, side = (uid, session // 2), session % 2
        table.purge(self.claim_timeout)
        game = table.games.get(key)
        if game is None:
            game = table.games[key] = _Game()
            game.task = asyncio.create_task(self._play(game, key, row, mode, sampling_params, kwargs))
        game.claimed.add(side)
        try:
            trajs = await asyncio.shield(game.task)
        finally:
            if game.claimed >= {0, 1} and table.games.get(key) is game:
                del table.games[key]
        agent_trajs, policies = trajs
        gid = f"{key[0]}-g{key[1]}"
        if isinstance(agent_trajs, BaseException):
            return self._failed(agent_trajs, kwargs, want_logprobs, f"{gid}-{side}", gid, mode, row, None, use_v1)
        traj = agent_trajs[side]
        policy = policies[traj.agent]
        if traj.error:
            # a policy or the env failed mid-game: the result says nothing about either side's play, so (as
            # AgentFlyAgentLoop does for a faulted episode) no row under V1, an error row otherwise
            return self._failed(EnvError(traj.error), kwargs, want_logprobs, traj.trajectory_id, gid, mode, row,
                                policy, use_v1)
        if mode == "chain":
            return self._chain_output(traj, policy, want_logprobs, row)
        if not traj.steps:  # the game ended before this player's first turn: one row that trains nothing
            return [self._chain_output(traj, policy, want_logprobs, row)]
        return self._step_outputs(traj, policy, want_logprobs, row)

    async def _play(self, game: _Game, key: tuple[str, int], row: dict[str, Any], mode: str,
                    sampling_params: dict[str, Any], kwargs: dict[str, Any]
                    ) -> tuple[list[PlayerTrajectory] | BaseException, dict[str, VerlServerPolicy]]:
        gid = f"{key[0]}-g{key[1]}"
        env = None
        try:
            env = make_multiagent(row["env_id"], manager=get_manager(), **row["env_kwargs"])
            game.policies = {a: self._policy(f"{gid}-{a}", sampling_params, mode, kwargs) for a in env.possible_agents}
            chat = chat_tokenizer(self.tokenizer, self.apply_chat_template_kwargs)
            trajs = await run_multiagent_game(
                env, game.policies, chat, mode=mode, sampling=SamplingParams(max_tokens=self.max_tokens_per_turn),
                max_turns=row["max_turns"], max_response_tokens=self.response_length if mode == "chain" else None,
                history=row["history"], seed=row["seed"], options=row["options"], env_id=row["env_id"], game_id=gid)
            return trajs, game.policies
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001  (a game that cannot start becomes error rows, never a failed batch)
            log.warning("agentfly self-play game %s failed: %s: %s", gid, type(e).__name__, e)
            return e, game.policies
        finally:
            game.finished_at = time.monotonic()
            if env is not None:
                await env.aclose()
