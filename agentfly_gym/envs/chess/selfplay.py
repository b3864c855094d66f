"""Chess self-play for language models as a PettingZoo AEC environment (``agentfly/ChessSelfPlay-v0``).

Two agents, ``"white"`` and ``"black"``, take turns writing one move as text; moves are parsed
as leniently as in ``agentfly/Chess-v0`` (:func:`~agentfly_gym.envs.chess.moves.parse_move`) and
a rejected move gets the same feedback (why, and the legal moves).  PettingZoo users find it
where PettingZoo's own environments live, as a module with ``env()`` / ``raw_env``::

    from agentfly_gym.envs.chess import selfplay
    env = selfplay.env()                       # or agentfly_gym.make_multiagent("agentfly/ChessSelfPlay-v0")
    env.reset(seed=0)
    for agent in env.agent_iter():
        obs, reward, terminated, truncated, info = env.last()
        env.step(None if terminated or truncated else info["admissible_actions"][0])
    env.close()

The board of a game is a resource like every other environment's backing state: an
:class:`~agentfly_gym.resources.InProcessSpec` instance of :class:`SelfPlayBoard` (one per running
game, at most ``max_instances`` per manager), acquired at reset in the game's rollout scope, reset when
the pool hands it to a new game and released when the game ends.  :meth:`ChessSelfPlayEnv.expert_action`
additionally acquires a Stockfish engine (as Chess-v0's expert) for a scripted opponent.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any, ClassVar

import chess
import gymnasium
import numpy as np
from pettingzoo import AECEnv

from ...errors import ConfigError, ResetNeeded, ResourceError
from ...limits import check_int
from ...resources.inprocess import InProcessResource, ObjectProxy, forward
from ...resources.protocol import Manager
from ...resources.scope import RolloutScope
from ...resources.spec import InProcessSpec
from ...spaces import TextSpace
from ...utils.aio import run_sync
from ..base import EnvResources
from ..prompting import AgentPrompt
from .engine import EngineProxy, engine_spec, find_stockfish
from .env import BoardView, render_board
from .moves import MoveError, legal_moves_uci, parse_move

__all__ = ["ChessSelfPlayEnv", "SelfPlayBoard", "SELFPLAY_PROMPT", "BOARD_FACTORY", "board_spec", "env", "raw_env"]

#: The factory path of :class:`SelfPlayBoard` for an :class:`InProcessSpec`.
BOARD_FACTORY = "agentfly_gym.envs.chess.selfplay:SelfPlayBoard"

AGENTS = ("white", "black")
_COLOR = {"white": chess.WHITE, "black": chess.BLACK}
_game_ids = itertools.count(1)

SELFPLAY_PROMPT = AgentPrompt(system=(
    "You are a strong chess player in a game against another player. Each observation shows the board as text "
    "(White at the bottom; uppercase letters are White pieces, lowercase are Black: K king, Q queen, R rook, "
    "B bishop, N knight, P pawn; '.' is an empty square), the FEN, the side you play, your opponent's last move "
    "and the legal moves. Play to checkmate your opponent: a win gives reward 1, a loss -1, a draw 0.\n"
    "Think briefly, then end your reply with exactly one line:\n"
    "Action: <move>\n"
    "where <move> is ONE legal move in UCI (e.g. e2e4, g1f3, e7e8q to promote to a queen) or SAN "
    "(e.g. e4, Nf3, exd5, O-O, e8=Q). An illegal move is rejected and you may try again; too many rejected "
    "moves in one turn lose the game."))


class TextObservation(str):
    """A ``str`` observation that also carries the ``dtype`` of gymnasium's ``Text`` space
    (``numpy.dtype(str)``), so NumPy-minded checks such as PettingZoo's ``api_test`` (which compares
    an observation's dtype with its space's) accept text.  Otherwise an ordinary ``str``."""

    __slots__ = ()
    dtype = np.dtype(str)


def _name(color: chess.Color) -> str:
    return "White" if color == chess.WHITE else "Black"


class SelfPlayBoard:
    """The state of one self-play game: a :class:`chess.Board` (with its move stack), driven by the
    resource's worker thread.  The pool calls :meth:`reset` before handing it to a new game.

    Attributes:
        games: games played on this instance (resets).
    """

    def __init__(self) -> None:
        self.board = chess.Board()
        self.games = 0

    def reset(self) -> None:
        """Back to the initial position, move stack cleared."""
        self.board = chess.Board()
        self.games += 1

    def setup(self, fen: str | None) -> chess.Board:
        """Start a game from ``fen`` (None: the initial position); returns a copy of the board.

        Raises:
            ConfigError: ``fen`` is not a FEN or not a playable position (invalid or game over).
        """
        if fen is None:
            self.board = chess.Board()
        else:
            try:
                board = chess.Board(str(fen))
            except ValueError as e:
                raise ConfigError(f"options['fen']={fen!r} is not a FEN: {e}") from e
            if not board.is_valid() or board.is_game_over():
                raise ConfigError(f"options['fen']={fen!r} is not a playable position (invalid or game over)")
            self.board = board
        return self.board.copy()

    def play(self, text: str) -> tuple[chess.Board, str | None, str | None]:
        """Parse ``text`` as a move of the side to move and play it.

        Returns:
            ``(board copy after the step, san of the move or None, reason the move was rejected or None)``.
        """
        try:
            move = parse_move(self.board, text)
        except MoveError as e:
            return self.board.copy(), None, str(e)
        san = self.board.san(move)
        self.board.push(move)
        return self.board.copy(), san, None

    def healthy(self) -> bool:
        return self.board is not None


class SelfPlayBoardProxy(ObjectProxy):
    """The async, typed face of a pooled :class:`SelfPlayBoard`."""

    setup = forward(SelfPlayBoard.setup)
    play = forward(SelfPlayBoard.play)


def board_spec(max_instances: int = 64) -> InProcessSpec:
    """The resource spec of the pool of self-play boards (at most ``max_instances`` games at once).

    Raises:
        ConfigError: ``max_instances`` is not an integer >= 1.
    """
    check_int("max_instances", max_instances)
    return InProcessSpec(factory=BOARD_FACTORY, kwargs={}, max_instances=max_instances, start_timeout=30.0,
                         close_timeout=5.0, name="chess-board")


class ChessSelfPlayEnv(BoardView, EnvResources, AECEnv):
    """A chess game between two language-model agents, ``"white"`` and ``"black"`` (PettingZoo AEC).

    Observations and actions are text (:class:`~agentfly_gym.spaces.TextSpace`).  ``observe(agent)``
    gives that agent's view: the feedback on the last step, the board diagram, the FEN, the side the
    agent plays, the side to move, the opponent's last move, and (to the side to move) the legal moves.

    Action masks: a text action has no fixed index, so the mask takes the form that fits text:
    ``infos[agent]["admissible_actions"]``, the legal moves in UCI (sorted) for the side to move and
    ``[]`` for the other agent and after the game.  Any legal move in another notation is accepted too.

    A turn: the side to move writes a move.  A legal move is played and the turn passes.  A rejected
    move (unparsable, illegal, ambiguous) leaves the position unchanged, the same agent stays selected
    and its observation says why (as Chess-v0).  After ``max_invalid_moves`` rejected moves in a row
    in one turn the agent forfeits the game.

    Rewards (zero-sum, given only when the game ends; every other step gives 0 to both):

    ===================================================  ==========  ==========  ==========  =========
    event                                                 winner      loser       terminated  truncated
    ===================================================  ==========  ==========  ==========  =========
    checkmate                                             +1          -1          both        no
    forfeit (``max_invalid_moves`` rejected in a row)     +1          -1          both        no
    draw (stalemate, insufficient material, threefold /   0           0           both        no
    fivefold repetition, fifty / seventy-five moves)
    ``max_moves`` plies without a result                  0           0           no          both
    ===================================================  ==========  ==========  ==========  =========

    Draws are claimed automatically (``board.outcome(claim_draw=True)``), as in Chess-v0.

    ``infos[agent]`` keys: ``admissible_actions`` (see above), ``fen``, ``color``, ``to_move`` (the
    agent to move, None after the game), ``last_move`` (the last move played, UCI, or None),
    ``invalid_action`` (why this agent's last move was rejected, else None), ``invalid_moves`` (its
    rejected moves this game), ``moves`` (its legal moves this game), ``task_id``, ``error`` (a
    handled fault, else None), and at the end ``result`` (``"1-0"``, ``"0-1"``, ``"1/2-1/2"`` or
    ``"*"``), ``termination`` (e.g. ``"checkmate"``, ``"forfeit"``, ``"max moves"``) and ``won``.

    Args:
        max_moves: plies (moves of both sides) after which a game without result is truncated.
        max_invalid_moves: rejected moves in a row in one turn after which the agent forfeits;
            None for no limit (the agent may retry forever).
        max_instances: capacity of the board pool of the manager (games at once).
        show_legal_moves: list the legal moves in the observation of the side to move.
        expert_depth: search depth of :meth:`expert_action` (Stockfish at full strength).
        stockfish_path: the Stockfish executable for :meth:`expert_action` (found on first use).
        manager: the resource manager (default: the running loop's default manager).
        render_mode: None or ``"ansi"`` (``render()`` returns the board diagram and FEN).

    Reset options: ``fen`` (a start position; the side to move in it moves first).  Other keys are
    ignored with a warning (PettingZoo's ``api_test`` passes an arbitrary option).

    Async API: ``await env.areset(...)``, ``await env.astep(action)``, ``await env.aclose()``; the
    sync ``reset`` / ``step`` / ``close`` run them on the library's background loop.

    Raises:
        ConfigError: a bad argument (the message names it and what is valid).
    """

    metadata: ClassVar[dict[str, Any]] = {"name": "chess_selfplay_v0", "render_modes": ["ansi"],
                                          "is_parallelizable": False, "render_fps": 1}
    env_name: ClassVar[str] = "ChessSelfPlay"
    _no_board_message: ClassVar[str] = "ChessSelfPlay: no game; call reset() first"
    agent_prompt: ClassVar[AgentPrompt] = SELFPLAY_PROMPT
    max_observation_length: ClassVar[int] = 1 << 16
    max_action_length: ClassVar[int] = 1 << 16

    def __init__(self, *, max_moves: int = 200, max_invalid_moves: int | None = 3, max_instances: int = 64,
                 show_legal_moves: bool = True, expert_depth: int = 8, stockfish_path: str | None = None,
                 manager: Manager | None = None, render_mode: str | None = None) -> None:
        super().__init__()
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigError(f"render_mode={render_mode!r} is not one of {self.metadata['render_modes']}")
        check_int("max_moves", max_moves, unit="plies")
        check_int("max_invalid_moves", max_invalid_moves, optional=True)
        check_int("expert_depth", expert_depth, unit="plies")
        self.max_moves = max_moves
        self.max_invalid_moves = max_invalid_moves
        self.show_legal_moves = bool(show_legal_moves)
        self.expert_depth = expert_depth
        self.render_mode = render_mode
        self._board_spec = board_spec(max_instances)
        self._stockfish_path = stockfish_path
        self._engine_spec = None
        self._manager = manager
        self.possible_agents = list(AGENTS)
        self.agents: list[str] = []
        obs_space = TextSpace(self.max_observation_length)
        act_space = TextSpace(self.max_action_length)
        self.observation_spaces = {a: obs_space for a in self.possible_agents}
        self.action_spaces = {a: act_space for a in self.possible_agents}
        self.rewards, self._cumulative_rewards, self.terminations, self.truncations, self.infos = {}, {}, {}, {}, {}
        self.agent_selection = "white"
        self._scope: RolloutScope | None = None
        self._board_res: SelfPlayBoardProxy | None = None
        self._engine: EngineProxy | None = None
        self._board: chess.Board | None = None  # a snapshot of the game's board after the last step
        self._feedback: dict[str, str] = {}
        self._last: tuple[str, str] | None = None  # (uci, san) of the last move played
        self._invalid_streak = 0
        self._counts: dict[str, dict[str, int]] = {}
        self._outcome: dict[str, Any] | None = None
        self._game_id = ""
        self._closed = False

    # ------------------------------------------------------------------ spaces
    def observation_space(self, agent: str) -> gymnasium.spaces.Space:
        """The agent's observation space: :class:`TextSpace` (the same object on every call)."""
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> gymnasium.spaces.Space:
        """The agent's action space: :class:`TextSpace` (the same object on every call)."""
        return self.action_spaces[agent]

    # ------------------------------------------------------------------ properties
    @property
    def game_id(self) -> str:
        """The id of the current game (also the rollout scope id), ``""`` before the first reset."""
        return self._game_id

    @property
    def scope_id(self) -> str:
        """The id of the current game's rollout scope (the game id), ``""`` before the first reset."""
        return self._game_id

    @property
    def outcome(self) -> dict[str, Any] | None:
        """After the game: ``{"result", "termination", "winner"}`` (winner ``"white"``, ``"black"`` or None)."""
        return None if self._outcome is None else dict(self._outcome)

    # ------------------------------------------------------------------ async API
    async def areset(self, seed: int | None = None, options: dict | None = None) -> None:
        """Start a new game (releasing the previous one's resources).

        Args:
            seed: accepted for the PettingZoo API; a game from a given position is deterministic.
            options: ``{"fen": ...}`` for a start position; other keys are ignored with a warning.

        Raises:
            ConfigError: a bad ``fen`` or options not a dict.
            ResourceTimeout / ResourceStartError: no board could be had from the pool.
        """
        if self._closed:
            raise ResetNeeded("ChessSelfPlay: the environment is closed")
        if options is not None and not isinstance(options, dict):
            raise ConfigError(f"options must be a dict or None, got {type(options).__name__}")
        options = dict(options or {})
        unknown = sorted(set(options) - {"fen"})
        if unknown:
            warnings.warn(f"ChessSelfPlay: reset option(s) {unknown} ignored; valid: ['fen']", stacklevel=2)
        await self._end_game()
        self._game_id = f"{self.env_name}-{next(_game_ids)}"
        self._scope = self.manager.scope(self._game_id)
        try:
            self._board_res = SelfPlayBoardProxy(await self._scope.acquire(self._board_spec))
            self._board = await self._board_res.setup(options.get("fen"))
        except BaseException:
            await self._end_game()
            raise
        self.agents = list(self.possible_agents)
        self.agent_selection = "white" if self._board.turn == chess.WHITE else "black"
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self._feedback = {a: "New game." for a in self.agents}
        self._counts = {a: {"moves": 0, "invalid_moves": 0} for a in self.agents}
        self._last = None
        self._invalid_streak = 0
        self._outcome = None
        self._engine = None
        self.infos = {a: self._info(a) for a in self.agents}

    async def astep(self, action: str | None) -> None:
        """The selected agent acts (PettingZoo AEC ``step``): ``action`` is its move as text.

        For an agent already terminated or truncated, ``action`` must be None and the agent is
        removed (PettingZoo's dead step).  A resource fault ends the game truncated for both
        agents with ``infos[agent]["error"]`` set (never an exception).

        Raises:
            ResetNeeded: no game is running.
            TypeError: ``action`` is not a str.
        """
        if not self.agents:
            raise ResetNeeded("ChessSelfPlay: no game is running; call reset() first")
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        if not isinstance(action, str):
            raise TypeError(f"ChessSelfPlay: action must be a str (a move), got {type(action).__name__}: {action!r}")
        self._cumulative_rewards[agent] = 0.0
        self._clear_rewards()
        other = "black" if agent == "white" else "white"
        action = action[: self.max_action_length].encode("utf-8", "replace").decode("utf-8")
        assert self._board_res is not None
        try:
            board, san, reason = await self._board_res.play(action)
        except (ResourceError, OSError, RuntimeError) as e:
            await self._fault(f"{type(e).__name__}: {e}")
            return
        self._board = board
        if reason is not None:
            self._counts[agent]["invalid_moves"] += 1
            self._invalid_streak += 1
            limit = self.max_invalid_moves
            if limit is not None and self._invalid_streak >= limit:
                self._feedback[agent] = f"Invalid move: {reason}. That is {limit} rejected moves in a row: you forfeit."
                self._feedback[other] = f"{_name(_COLOR[agent])} forfeits after {limit} rejected moves in a row."
                await self._game_over("0-1" if agent == "white" else "1-0", "forfeit", winner=other)
            else:
                self._feedback[agent] = (f"Invalid move: {reason}. The position is unchanged; "
                                         f"{_name(board.turn)} to move.")
                self.infos = {a: self._info(a, invalid=reason if a == agent else None) for a in self.agents}
            self._accumulate_rewards()
            return
        move = board.peek()
        self._last = (move.uci(), san)
        self._counts[agent]["moves"] += 1
        self._invalid_streak = 0
        self._feedback[agent] = f"You played {san} ({move.uci()})."
        self._feedback[other] = f"{_name(_COLOR[agent])} played {san} ({move.uci()}). Your move."
        outcome = board.outcome(claim_draw=True)
        if outcome is not None:
            winner = None if outcome.winner is None else ("white" if outcome.winner == chess.WHITE else "black")
            await self._game_over(outcome.result(), outcome.termination.name.lower().replace("_", " "), winner=winner)
        elif len(board.move_stack) >= self.max_moves:
            await self._game_over("*", "max moves", winner=None, truncated=True)
        else:
            self.agent_selection = other
            self.infos = {a: self._info(a) for a in self.agents}
        self._accumulate_rewards()

    async def aend_game(self) -> None:
        """End the running game now, releasing its rollout scope; the next call must be a reset."""
        await self._end_game()
        self.agents = []

    async def aclose(self) -> None:
        """End the running game (releasing its resources); the shared manager stays open."""
        await self._end_game()
        self._closed = True

    async def expert_action(self) -> str:
        """Stockfish's best move (UCI) for the side to move, at full strength and ``expert_depth`` plies.

        The engine is acquired in the game's scope on first use (as Chess-v0's expert).

        Raises:
            ResetNeeded: no game is running.
            ResourceUnavailable: no Stockfish executable.
        """
        if self._scope is None or self._board is None or not self.agents:
            raise ResetNeeded("ChessSelfPlay: no game is running; call reset() first")
        if self._engine is None:
            if self._engine_spec is None:
                self._engine_spec = engine_spec(find_stockfish(self._stockfish_path), max_instances=4)
            self._engine = EngineProxy(await self._scope.acquire(self._engine_spec))
        move = await self._engine.best_move(self._board.copy(), depth=self.expert_depth)
        return move.uci()

    # ------------------------------------------------------------------ sync API (PettingZoo)
    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        """Sync wrapper of :meth:`areset` (PettingZoo AEC ``reset``)."""
        run_sync(self.areset(seed=seed, options=options))

    def step(self, action: str | None) -> None:
        """Sync wrapper of :meth:`astep` (PettingZoo AEC ``step``; returns None)."""
        if self.agents and (self.terminations[self.agent_selection] or self.truncations[self.agent_selection]):
            self._was_dead_step(action)  # no resource involved
            return
        run_sync(self.astep(action))

    def observe(self, agent: str) -> TextObservation:
        """``agent``'s text observation of the current position (see the class docstring); a ``str``."""
        if self._board is None:
            raise ResetNeeded("ChessSelfPlay: no game; call reset() first")
        board = self._board
        color = _COLOR[agent]
        last = "none" if self._last is None else f"{self._last[1]} ({self._last[0]})"
        parts = [self._feedback.get(agent, ""), "", render_board(board), "", f"FEN: {board.fen()}",
                 f"You play: {_name(color)}"]
        if self._outcome is not None:
            o = self._outcome
            res = "draw" if o["winner"] is None else ("you won" if o["winner"] == agent else "you lost")
            if o["result"] == "*":
                res = "no result"
            parts.append(f"Game over: {res} ({o['termination']}, {o['result']}).")
        else:
            parts += [f"Side to move: {_name(board.turn)}", f"Last move: {last}"]
            if board.turn == color and self.show_legal_moves:
                parts.append("Legal moves (UCI): " + " ".join(legal_moves_uci(board)))
        return TextObservation("\n".join(parts))

    def render(self) -> str | None:
        """The board diagram and FEN (``render_mode="ansi"``), else None."""
        if self.render_mode != "ansi" or self._board is None:
            return None
        return render_board(self._board) + f"\nFEN: {self._board.fen()}"

    # ------------------------------------------------------------------ internals
    def _info(self, agent: str, *, invalid: str | None = None) -> dict[str, Any]:
        board = self._board
        assert board is not None
        over = self._outcome is not None
        to_move = None if over else ("white" if board.turn == chess.WHITE else "black")
        info: dict[str, Any] = {
            "admissible_actions": legal_moves_uci(board) if to_move == agent else [],
            "fen": board.fen(), "color": agent, "to_move": to_move,
            "last_move": self._last[0] if self._last else None, "invalid_action": invalid,
            "invalid_moves": self._counts[agent]["invalid_moves"], "moves": self._counts[agent]["moves"],
            "task_id": self._game_id, "error": None,
        }
        if over:
            o = self._outcome
            assert o is not None
            info.update(result=o["result"], termination=o["termination"], won=o["winner"] == agent)
            if o.get("error"):
                info["error"] = o["error"]
        return info

    async def _game_over(self, result: str, termination: str, *, winner: str | None, truncated: bool = False,
                         error: str | None = None) -> None:
        self._outcome = {"result": result, "termination": termination, "winner": winner, "error": error}
        for a in self.agents:
            self.rewards[a] = 0.0 if winner is None else (1.0 if a == winner else -1.0)
            self.terminations[a] = not truncated
            self.truncations[a] = truncated
        invalid = {a: None for a in self.agents}
        if termination == "forfeit":
            loser = "white" if winner == "black" else "black"
            invalid[loser] = self._feedback[loser]
        self.infos = {a: self._info(a, invalid=invalid[a]) for a in self.agents}
        for a in self.agents:
            self._feedback[a] = self._feedback[a].replace(" Your move.", "")
        await self._end_game()

    async def _fault(self, message: str) -> None:
        scope = self._scope
        if scope is not None:
            for r in list(scope.resources.values()):
                if isinstance(r, InProcessResource):
                    r.mark_dead(message)
                await scope.discard(r)
        for a in self.agents:
            self._feedback[a] = f"Error: {message}. The game has ended."
        await self._game_over("*", "error", winner=None, truncated=True, error=message)

    async def _end_game(self) -> None:
        scope, self._scope = self._scope, None
        self._board_res = None
        self._engine = None
        if scope is not None:
            await scope.aclose()


def raw_env(**kwargs: Any) -> ChessSelfPlayEnv:
    """A :class:`ChessSelfPlayEnv` (PettingZoo's ``raw_env`` convention)."""
    return ChessSelfPlayEnv(**kwargs)


def env(**kwargs: Any) -> AECEnv:
    """A :class:`ChessSelfPlayEnv` in PettingZoo's ``OrderEnforcingWrapper`` (PettingZoo's ``env()``
    convention: stepping before a reset raises a clear error)."""
    from pettingzoo.utils import wrappers

    return wrappers.OrderEnforcingWrapper(ChessSelfPlayEnv(**kwargs))
