"""Multi-agent rollout: play a turn-based PettingZoo AEC game (e.g. ``agentfly/ChessSelfPlay-v0``) with one
policy on both sides (self-play) or one policy per side, and record one trajectory per player.

Each player's trajectory is built exactly as a single-agent one (:mod:`.chain`, :mod:`.step`) from the
player's own view: its prompt is the system prompt + its first observation, its sampled ids are kept
verbatim (mask 1, logprobs), and the observation it sees at its next turn (which includes the
opponent's reply) is appended as a user message with incremental chat-template rendering (mask 0).  In
step mode every turn is a fresh prompt and one :class:`~agentfly_gym.rollout.step.StepRow`.

The players of one game share ``group_id`` (the game id) and carry ``agent`` and ``game_id``; a
zero-sum game then gives a GRPO group whose advantages are the winner's against the loser's.

A policy that fails (an exception from ``generate`` / ``act``) or an environment that fails ends the
game: both trajectories are returned with what was played so far, ``truncated`` set, reward 0 for both
and ``error`` naming who failed (``"white: PolicyError: ..."`` for the failing side, ``"opponent
failed: ..."`` for the other).  Nothing is raised.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import statistics
import time
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from ..limits import EpisodeLimits, check_int
from .chain import budget_reached
from .episode import MODES
from .outputs import IF_EXISTS
from .policies.base import SamplingParams, check_policy, take_turn
from .step import StepRow, render_step_prompt
from .trajectory import Trajectory, Turn
from .turns import append_reply, info_summary

__all__ = ["MultiAgentConfig", "PlayerTrajectory", "run_multiagent_game", "run_multiagent_rollouts", "summarize_games",
           "DEFAULT_MAX_TURNS"]

log = logging.getLogger(__name__)

#: Turns per player of a game, unless told otherwise (a chess game runs longer than a single-agent episode).
DEFAULT_MAX_TURNS = 200
#: The episode limits that :class:`MultiAgentConfig` and :func:`run_multiagent_game` accept as keywords.
_LIMIT_KEYS = frozenset(f.name for f in dataclasses.fields(EpisodeLimits))


@dataclasses.dataclass(frozen=True)
class MultiAgentConfig:
    """How to play a multi-agent run (:func:`run_multiagent_rollouts`); checked when built.

    Attributes:
        num_games: games to play (two trajectories each), an integer >= 1.
        concurrency: most games in flight at once, an integer >= 1.
        mode: ``"chain"`` (one sequence per player) or ``"step"`` (one row per player turn).
        sampling: sampling parameters for model policies (None: the defaults).
        limits: each player's :class:`~agentfly_gym.limits.EpisodeLimits` (default: 200 turns per player).
        seed: game ``g`` resets with seed ``seed + g``.
        env_kwargs: the env's constructor keyword arguments.
        output_dir: where to write trajectories and summary.json; None writes nothing.
        if_exists: ``"fail"`` or ``"replace"`` a run already in ``output_dir`` (games are never appended).

    Raises:
        ConfigError: a value out of range, an unknown ``mode`` or ``if_exists`` (``field`` names it).
    """

    num_games: int = 4
    concurrency: int = 4
    mode: str = "chain"
    sampling: SamplingParams | None = None
    limits: EpisodeLimits = dataclasses.field(default_factory=lambda: EpisodeLimits(max_turns=DEFAULT_MAX_TURNS))
    seed: int = 0
    env_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    output_dir: Any = None
    if_exists: str = "fail"

    def __post_init__(self) -> None:
        check_int("num_games", self.num_games)
        check_int("concurrency", self.concurrency)
        if self.mode not in MODES:
            raise ConfigError(f"mode={self.mode!r} is not one of {MODES}", field="mode")
        if self.if_exists == "append":
            raise ConfigError("if_exists='append' (--append) is for single-agent runs; give multi-agent games "
                              "their own output folder or replace the run there", field="if_exists")
        if self.if_exists not in IF_EXISTS:
            raise ConfigError(f"if_exists={self.if_exists!r} is not one of {IF_EXISTS}", field="if_exists")
        if not isinstance(self.limits, EpisodeLimits):
            raise ConfigError(f"limits={self.limits!r} must be an EpisodeLimits", field="limits")
        object.__setattr__(self, "sampling", self.sampling or SamplingParams())
        object.__setattr__(self, "env_kwargs", dict(self.env_kwargs or {}))

    @classmethod
    def merge(cls, config: MultiAgentConfig | None = None, /, **given: Any) -> MultiAgentConfig:
        """``config`` (None: the defaults) with the given fields replaced; the episode limits' names
        (``max_turns``, ``history``, ...) replace those fields of ``limits`` (None leaves a limit as it is).

        Raises:
            TypeError: a keyword that is neither a field nor a limit.
            ConfigError: a value out of range.
        """
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(given) - fields - _LIMIT_KEYS)
        if unknown:
            raise TypeError(f"unexpected keyword arguments {unknown}; valid: {sorted(fields | _LIMIT_KEYS)}")
        base = config if config is not None else cls()
        limits = EpisodeLimits.merge(given.pop("limits", None) or base.limits,
                                     **{k: given.pop(k) for k in list(given) if k in _LIMIT_KEYS})
        return dataclasses.replace(base, limits=limits, **given)


@dataclasses.dataclass
class PlayerTrajectory(Trajectory):
    """One player's :class:`Trajectory` of a multi-agent game.

    Attributes (besides :class:`Trajectory`'s):
        agent: the player (``"white"`` / ``"black"``).
        game_id: the game (also ``group_id``).
        result: the game's result (e.g. ``"1-0"``, ``"1/2-1/2"``, ``"*"`` when it had none).
        termination: how the game ended (``"checkmate"``, ``"forfeit"``, ``"max moves"``, ``"error"``,
            ``"max turns"``, ...).
        invalid_moves: the player's turns whose action the env rejected (``info["invalid_action"]``).
    """

    agent: str = ""
    game_id: str = ""
    result: str = "*"
    termination: str = ""
    invalid_moves: int = 0


class _Player:
    def __init__(self, agent: str, policy: Any, chat: Any, traj: PlayerTrajectory) -> None:
        self.agent, self.policy, self.chat, self.traj = agent, policy, chat, traj
        self.messages: list[dict[str, str]] = []
        self.task_obs: str | None = None
        self.past: list[tuple[str, str]] = []
        self.pending_user = False  # chain mode: the next observation must be appended before sampling


def _as_map(value: Any, agents: list[str], name: str) -> dict[str, Any]:
    if isinstance(value, Mapping):
        missing = [a for a in agents if a not in value]
        if missing:
            raise ConfigError(f"{name} has no entry for agent(s) {missing}; agents: {agents}")
        return {a: value[a] for a in agents}
    return {a: value for a in agents}


async def run_multiagent_game(env: Any, policies: Any, chats: Any, *, mode: str = "chain",
                              sampling: SamplingParams | None = None, limits: EpisodeLimits | None = None,
                              max_turns: int | None = None, max_context_tokens: int | None = None,
                              max_response_tokens: int | None = None, history: int | None = None,
                              seed: int | None = None,
                              options: dict[str, Any] | None = None,
                              env_id: str = "agentfly/ChessSelfPlay-v0", game_id: str | None = None,
                              trajectory_prefix: str | None = None) -> list[PlayerTrajectory]:
    """Play one game of the AEC ``env`` and return one :class:`PlayerTrajectory` per agent (in
    ``env.possible_agents`` order).

    Args:
        env: an unwrapped turn-based AEC env with the async face of
            :class:`~agentfly_gym.envs.chess.selfplay.ChessSelfPlayEnv` (``areset``, ``astep``,
            ``aend_game``, ``observe``, ``outcome``, ``game_id``, ``agent_prompt``).
        policies: one :class:`TextPolicy` / :class:`ActionPolicy` for every agent (self-play), or a
            mapping agent -> policy (e.g. ``{"white": model, "black": ExpertPolicy()}``).
        chats: a :class:`~agentfly_gym.rollout.chat.ChatTokenizer`, or a mapping agent -> chat (one
            per policy tokenizer).
        mode: ``"chain"`` (one sequence per player) or ``"step"`` (one row per player turn).
        sampling: sampling parameters for model policies.
        limits: each player's :class:`~agentfly_gym.limits.EpisodeLimits` (None: the defaults with
            :data:`DEFAULT_MAX_TURNS` turns).  ``max_turns``: most turns per player (rejected moves
            count); past it the game ends truncated (``termination="max turns"``).
            ``max_context_tokens``: chain mode: a player whose next turn could exceed this many tokens
            ends the game truncated (``termination="context"``).  ``max_response_tokens``: chain mode: a
            player whose response already holds at least this many tokens ends the game truncated
            (``termination="context"``; a trainer's response budget).  ``history``: step mode: past
            (action, observation) pairs in each fresh prompt.
        max_turns, max_context_tokens, max_response_tokens, history: the older way to give limits; each
            one given (not None) replaces that field of ``limits``.
        seed, options: passed to ``env.areset``.
        game_id: the game's id (default: the env's game id); trajectories are ``<prefix>-<agent>``.

    Returns:
        one trajectory per agent; the game's resources are released before returning (also on
        error or cancellation).

    Raises:
        ConfigError: a bad ``mode`` or limit, or a mapping missing an agent.
        Any exception of ``env.areset`` (the game never started: nothing to record).
    """
    limits = EpisodeLimits.merge(limits, default_max_turns=DEFAULT_MAX_TURNS, max_turns=max_turns,
                                 max_context_tokens=max_context_tokens, max_response_tokens=max_response_tokens,
                                 history=history)
    max_turns, history = limits.max_turns, limits.history
    max_context_tokens, max_response_tokens = limits.max_context_tokens, limits.max_response_tokens
    if mode not in MODES:
        raise ConfigError(f"mode={mode!r} is not one of {MODES}")
    sampling = sampling or SamplingParams()
    agents = list(env.possible_agents)
    pols = _as_map(policies, agents, "policies")
    chts = _as_map(chats, agents, "chats")
    for p in pols.values():
        check_policy(p)
    t_start = time.monotonic()
    try:
        t0 = time.monotonic()
        await env.areset(seed=seed, options=options)
        reset_s = time.monotonic() - t0
        gid = game_id or env.game_id
        prefix = trajectory_prefix or gid
        players = {a: _Player(a, pols[a], chts[a], PlayerTrajectory(
            trajectory_id=f"{prefix}-{a}", group_id=gid, env_id=env_id, task_id=gid, seed=seed, mode=mode,
            prompt_ids=[], agent=a, game_id=gid, scope_id=env.scope_id)) for a in agents}
        prompt = env.agent_prompt
        failure: tuple[str, str] | None = None  # (agent, message)
        stop: str | None = None
        while env.agents:
            agent = env.agent_selection
            if env.terminations[agent] or env.truncations[agent]:
                await env.astep(None)
                continue
            pl = players[agent]
            tr = pl.traj
            obs = str(env.observe(agent))
            info = dict(env.infos[agent])
            if tr.num_turns >= max_turns:
                stop = "max turns"
                break
            if mode == "chain":
                if pl.task_obs is None:
                    pl.task_obs = obs
                    pl.messages = [{"role": "system", "content": prompt.system},
                                   {"role": "user", "content": prompt.first_message(obs)}]
                    tr.prompt_ids = list(pl.chat.prompt_ids(pl.messages))
                elif pl.pending_user:
                    user = {"role": "user", "content": prompt.turn_message(obs)}
                    pl.messages.append(user)
                    tr.extend(pl.chat.append_ids([user]), 0)
                pl.pending_user = False
                if budget_reached(tr, sampling, max_context_tokens, max_response_tokens):
                    stop = "context"
                    break
                prompt_ids = tr.prompt_ids + tr.response_ids
            else:
                if pl.task_obs is None:
                    pl.task_obs = obs
                step = len(tr.steps)
                messages = render_step_prompt(env, pl.task_obs, pl.past, obs, step, history)
                prompt_ids = list(pl.chat.prompt_ids(messages))
                if step == 0:
                    tr.prompt_ids = prompt_ids
                    tr.messages = list(messages)
            t0 = time.monotonic()
            try:
                sampled, logprobs, finish, reply = await take_turn(pl.policy, pl.chat, prompt_ids, sampling, obs,
                                                                   info, env)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a policy's failure ends the game, recorded
                log.warning("game %s: %s's policy failed: %s", gid, agent, e)
                failure = (agent, f"{type(e).__name__}: {e}")
                break
            gen_s = time.monotonic() - t0
            action = prompt.parse_action(reply)
            t0 = time.monotonic()
            try:
                await env.astep(action)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - an env's failure ends the game, recorded
                log.warning("game %s: the env failed on %s's move %r: %s", gid, agent, action, e)
                failure = ("env", f"{type(e).__name__}: {e}")
                break
            env_s = time.monotonic() - t0
            rewards = {a: float(env.rewards.get(a, 0.0)) for a in agents}
            new_info = env.infos.get(agent, {})
            terminated, truncated = bool(env.terminations.get(agent)), bool(env.truncations.get(agent))
            new_obs = str(env.observe(agent))
            if new_info.get("invalid_action"):
                tr.invalid_moves += 1
            tr.turns.append(Turn(reply=reply, action=action, observation=new_obs, reward=rewards[agent],
                                 terminated=terminated, truncated=truncated, sampled_tokens=len(sampled),
                                 finish_reason=finish, generate_s=gen_s, env_s=env_s, info=info_summary(new_info)))
            if mode == "chain":
                append_reply(tr, pl.chat, sampled, logprobs)
                pl.messages.append({"role": "assistant", "content": reply})
                pl.pending_user = True
            else:
                tr.steps.append(StepRow.from_reply(pl.chat, trajectory_id=tr.trajectory_id, group_id=gid,
                                                   step=len(tr.steps), prompt_ids=prompt_ids, sampled=sampled,
                                                   logprobs=logprobs, reward=rewards[agent], anchor_obs=obs,
                                                   action=action, done=terminated or truncated,
                                                   finish_reason=finish))
                pl.past.append((action, new_obs))
            for a, r in rewards.items():
                players[a].traj.reward += r
                if a != agent and r and players[a].traj.turns:
                    # a reward earned by the opponent's move (the game ended) belongs to this player's last turn
                    players[a].traj.turns[-1].reward += r
                    if players[a].traj.steps:
                        players[a].traj.steps[-1].reward += r
        outcome = env.outcome if hasattr(env, "outcome") else None
        for a, pl in players.items():
            tr = pl.traj
            if pl.task_obs is None:  # the game ended before this player's first turn: its prompt, nothing sampled
                pl.messages = [{"role": "system", "content": prompt.system},
                               {"role": "user", "content": prompt.first_message(str(env.observe(a)))}]
                tr.prompt_ids = list(pl.chat.prompt_ids(pl.messages))
            if mode == "chain" or not tr.messages:
                tr.messages = pl.messages
            for row in tr.steps:
                row.episode_return = tr.reward
            if tr.steps:
                tr.steps[-1].done = True
            if failure is not None:
                tr.reward = 0.0
                for row in tr.steps:
                    row.episode_return = 0.0
                who, msg = failure
                tr.error = f"{who}: {msg}" if who == a else (f"environment failed: {msg}" if who == "env"
                                                             else f"opponent failed: {who}: {msg}")
                tr.truncated, tr.terminated = True, False
                tr.termination = "policy error" if who != "env" else "error"
            elif stop is not None:
                tr.truncated, tr.terminated = True, False
                tr.termination = stop
            else:
                tr.terminated = bool(outcome) and outcome["result"] != "*"
                tr.truncated = not tr.terminated
                if outcome:
                    tr.result, tr.termination = outcome["result"], outcome["termination"]
                    tr.success = outcome["winner"] == a
                    if outcome.get("error"):
                        tr.error = str(outcome["error"])
            tr.timings = {"wall": time.monotonic() - t_start, "generate": sum(t.generate_s for t in tr.turns),
                          "env": sum(t.env_s for t in tr.turns), "reset": reset_s}
        return [players[a].traj for a in agents]
    finally:
        await env.aend_game()


def summarize_games(trajectories: list[Trajectory]) -> dict[str, Any]:
    """Per-side results of multi-agent games: ``games``, ``white_wins``, ``black_wins``, ``draws``,
    ``no_result`` (truncated: move cap, turn cap, context), ``failed`` (a policy or the env failed),
    ``illegal_move_rate`` (rejected moves / player turns, over both sides) and per agent ``turns``,
    ``invalid_moves``, ``illegal_move_rate``, ``mean_reward``, ``mean_sampled_tokens``.
    """
    games: dict[str, dict[str, Any]] = {}
    for t in trajectories:
        games.setdefault(getattr(t, "game_id", "") or t.group_id, {})[getattr(t, "agent", "")] = t
    out: dict[str, Any] = {"games": len(games), "white_wins": 0, "black_wins": 0, "draws": 0, "no_result": 0,
                           "failed": 0}
    for players in games.values():
        any_t = next(iter(players.values()))
        result = getattr(any_t, "result", "*")
        if any(t.error and getattr(t, "termination", "") in ("policy error", "error") for t in players.values()):
            out["failed"] += 1
        elif result == "1-0":
            out["white_wins"] += 1
        elif result == "0-1":
            out["black_wins"] += 1
        elif result == "1/2-1/2":
            out["draws"] += 1
        else:
            out["no_result"] += 1
    per_agent: dict[str, Any] = {}
    total_turns = total_invalid = 0
    for agent in sorted({getattr(t, "agent", "") for t in trajectories}):
        ts = [t for t in trajectories if getattr(t, "agent", "") == agent]
        turns = sum(t.num_turns for t in ts)
        invalid = sum(getattr(t, "invalid_moves", 0) for t in ts)
        total_turns += turns
        total_invalid += invalid
        per_agent[agent] = {"trajectories": len(ts), "turns": turns, "invalid_moves": invalid,
                            "illegal_move_rate": invalid / turns if turns else 0.0,
                            "mean_reward": statistics.fmean(t.reward for t in ts) if ts else 0.0,
                            "mean_sampled_tokens": statistics.fmean(t.num_sampled_tokens for t in ts) if ts else 0.0}
    out["illegal_move_rate"] = total_invalid / total_turns if total_turns else 0.0
    out["per_agent"] = per_agent
    return out


async def run_multiagent_rollouts(env_id: str, policy: Any, chat: Any, *, config: MultiAgentConfig | None = None,
                                  opponent: Any = None, opponent_chat: Any = None, manager: Any = None,
                                  progress: bool = False, **fields: Any):
    """Play ``config.num_games`` games of the multi-agent env ``env_id`` concurrently (one env per game, bounded
    by ``config.concurrency``) and (optionally) save every player's trajectory.

    ``policy`` plays every side (self-play) unless ``opponent`` is given; then ``policy`` plays the first
    agent (White) in even games and the second in odd games, ``opponent`` the other side, so both play
    both colours.  A game that fails to start is recorded as two empty trajectories with ``error`` set.

    Args:
        env_id: a registered multi-agent env id.
        policy, chat: the policy and its :class:`~agentfly_gym.rollout.chat.ChatTokenizer`.
        config: the run's :class:`MultiAgentConfig` (None: the defaults).
        opponent, opponent_chat: the other side's policy and chat (None: self-play; the opponent's chat
            defaults to ``chat``).
        manager: the resource manager (None: one of the kind ``AGENTFLY_GYM_MANAGER`` names, made and
            closed here).
        progress: show a progress bar.
        **fields: the older way to configure a run: any :class:`MultiAgentConfig` field (``num_games``,
            ``concurrency``, ``mode``, ``sampling``, ``seed``, ``env_kwargs``, ``output_dir``, ``if_exists``)
            or episode limit (``max_turns``, ``max_context_tokens``, ``history``, ...) replaces that of
            ``config`` (:meth:`MultiAgentConfig.merge`).

    Returns:
        a :class:`~agentfly_gym.rollout.runner.RolloutResult`: trajectories (two per game, by game then
        agent) and a summary with :func:`summarize_games`' per-side results under ``"games"`` besides
        the usual counts; written to ``output_dir`` (trajectories.parquet/jsonl, steps.parquet in step
        mode, summary.json) when given, under the folder's lock, each file renamed into place when complete
        (:mod:`agentfly_gym.rollout.outputs`; ``if_exists``: ``"fail"`` or ``"replace"`` a run already there).
        If the run is cancelled (Ctrl-C under ``asyncio.run``, SIGTERM in ``agentfly-gym rollout``), the games
        finished so far are saved (``summary["interrupted"] = True``; in ``interrupted/`` when the folder holds
        a complete run) before the cancellation propagates, as :func:`~agentfly_gym.rollout.runner.run_rollouts`
        does; a SIGTERM the application does not handle tears the resources down
        (:func:`agentfly_gym.resources.teardown.sigterm_teardown`).

    Raises:
        ConfigError: an unknown env id, bad numbers or env kwargs, or ``if_exists="append"`` (games are
            not appended to another run's).
        TypeError: a keyword that is neither a config field nor an episode limit.
        OutputExistsError, OutputBusyError: the output folder holds a run / is being written by another process.
        OutputWriteError: a file could not be written (a full disk); nothing half-written is published.
    """
    from ..registration import make_multiagent
    from .outputs import check_output_dir, run_output

    config = MultiAgentConfig.merge(config, **fields)
    probe = make_multiagent(env_id, **config.env_kwargs)  # bad kwargs fail before any game starts
    probe.discard()  # nothing was acquired: closing needs no event loop
    if config.output_dir is not None:
        check_output_dir(config.output_dir, config.if_exists, mode=config.mode)
    from ..resources import teardown

    with teardown.sigterm_teardown(), run_output(config.output_dir, config.if_exists, mode=config.mode) as out:
        return await _run_games(env_id, config, (policy, chat), (opponent, opponent_chat), out=out, manager=manager,
                                progress=progress, agents=list(probe.possible_agents),
                                full_id=f"agentfly/{type(probe).env_name}-v0")


async def _run_games(env_id: str, config: MultiAgentConfig, player: tuple[Any, Any], other: tuple[Any, Any], *,
                     out: Any, manager: Any, progress: bool, agents: list[str], full_id: str):
    """The games of :func:`run_multiagent_rollouts` (``player`` and ``other``: (policy, chat) of each side;
    ``other``'s policy None: self-play)."""
    from ..registration import make_multiagent
    from .runner import RolloutResult
    from .summary import summarize

    policy, chat = player
    opponent, opponent_chat = other
    num_games, mode, seed = config.num_games, config.mode, config.seed
    own = manager is None
    if manager is None:  # AGENTFLY_GYM_MANAGER: local (default), ray or auto
        from ..resources.select import manager_from_environment

        manager = manager_from_environment()
    sem = asyncio.Semaphore(config.concurrency)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=num_games, desc="games", unit="game")

    async def one(g: int) -> list[PlayerTrajectory]:
        gid = f"game-{g:05d}"
        if opponent is None:
            pols, chts = policy, chat
        else:
            first, second = (policy, opponent) if g % 2 == 0 else (opponent, policy)
            c1, c2 = (chat, opponent_chat or chat) if g % 2 == 0 else (opponent_chat or chat, chat)
            pols, chts = {agents[0]: first, agents[1]: second}, {agents[0]: c1, agents[1]: c2}
        async with sem:
            env = make_multiagent(env_id, manager=manager, **config.env_kwargs)
            try:
                return await run_multiagent_game(env, pols, chts, mode=mode, sampling=config.sampling,
                                                 limits=config.limits, seed=seed + g, env_id=full_id, game_id=gid)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a game that cannot start is recorded
                log.warning("game %s failed to start: %s", gid, e)
                return [PlayerTrajectory(trajectory_id=f"{gid}-{a}", group_id=gid, env_id=full_id, task_id=gid,
                                         seed=seed + g, mode=mode, prompt_ids=[], agent=a, game_id=gid,
                                         termination="error", error=f"{type(e).__name__}: {e}") for a in agents]
            finally:
                await env.aclose()
                if bar is not None:
                    bar.update(1)

    finished: dict[int, list[PlayerTrajectory]] = {}
    stopping: list[bool] = []  # set once an interrupt's save began: games that end after it were cut, not finished

    async def guarded(g: int) -> list[PlayerTrajectory]:
        game = await one(g)
        if stopping:
            return game
        finished[g] = game
        log.info("game %s finished: %s (%s)", game[0].game_id or f"game-{g:05d}", game[0].result,
                 game[0].termination or "no termination")
        return game

    def finish(games: list[list[PlayerTrajectory]], *, interrupted: bool = False) -> RolloutResult:
        trajectories = [t for game in games for t in game]
        summary = summarize(trajectories, time.monotonic() - t0, manager)
        summary["mode"] = mode
        summary["interrupted"] = interrupted
        summary["games"] = summarize_games(trajectories)
        summary["config"] = {"env_id": full_id, "num_games": num_games, "concurrency": config.concurrency,
                             "max_turns": config.limits.max_turns, "limits": config.limits.to_dict(), "seed": seed,
                             "self_play": opponent is None, "sampling": config.sampling.to_dict()}
        result = RolloutResult(trajectories=trajectories, summary=summary)
        if out is not None:
            result.paths = out.save(trajectories, summary, interrupted=interrupted)
        return result

    t0 = time.monotonic()
    tasks = [asyncio.create_task(guarded(g)) for g in range(num_games)]
    try:
        # asyncio.wait, not gather: a cancellation (Ctrl-C, SIGTERM in the CLI) reaches this task at once, so the
        # finished games are saved before the running ones are torn down, as run_rollouts does
        await asyncio.wait(tasks)
        return finish([t.result() for t in tasks])
    except asyncio.CancelledError:
        stopping.append(True)
        if out is not None:
            saved = finish([finished[g] for g in sorted(finished)], interrupted=True)
            where = saved.paths["summary"].parent if saved.paths else out.folder
            log.warning("rollout interrupted: saved %d finished games (%d trajectories) to %s", len(finished),
                        len(saved.trajectories), where)
        raise
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if bar is not None:
            bar.close()
        if own:
            await manager.aclose()
