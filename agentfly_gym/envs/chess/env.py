"""The chess environment ``agentfly/Chess-v0``: Lichess puzzles, or a game against Stockfish."""

from __future__ import annotations

import asyncio
import numbers
import os
from types import MappingProxyType
from typing import Any, ClassVar

import chess

from ...errors import ConfigError, ResetNeeded
from ...limits import check_int
from ...resources.protocol import Manager
from ...resources.scope import RolloutScope
from ..base import AgentFlyEnv, StepResult
from ..prompting import AgentPrompt
from .engine import EngineProxy, engine_spec, find_stockfish
from .moves import MoveError, legal_moves_uci, parse_move
from .puzzles import SPLITS, Puzzle, PuzzleSet, find_puzzles_file, load_puzzles, split_of

__all__ = ["ChessEnv", "CHESS_PROMPT", "game_outcome", "render_board"]

CHESS_PROMPT = AgentPrompt(system=(
    "You are a strong chess player. Each observation shows the board as text (White at the bottom; "
    "uppercase letters are White pieces, lowercase are Black: K king, Q queen, R rook, B bishop, N knight, "
    "P pawn; '.' is an empty square), the FEN, the side to move, the opponent's last move and your task.\n"
    "In a puzzle, find the best move; the opponent answers and you continue until the puzzle is solved. "
    "A legal but wrong move fails the puzzle. In a game, play to checkmate the opponent.\n"
    "Think briefly, then end your reply with exactly one line:\n"
    "Action: <move>\n"
    "where <move> is ONE legal move in UCI (e.g. e2e4, g1f3, e7e8q to promote to a queen) or SAN "
    "(e.g. e4, Nf3, exd5, O-O, e8=Q). An illegal move is rejected and you may try again."))

_PIECE_ORDER = ".PNBRQKpnbrqk"
#: reset options per mode (AgentFlyEnv.reset_options)
_PUZZLE_OPTIONS = MappingProxyType({"task_id": "a PuzzleId of the puzzle set (of the split, unless split='all')",
                                    "split": "'all', 'train', 'validation' or 'test' (overrides the constructor's)"})
_PLAY_OPTIONS = MappingProxyType({"agent_color": "'white', 'black' or 'random'", "fen": "the starting position (FEN)"})


def render_board(board: chess.Board) -> str:
    """An ASCII diagram of ``board`` with rank and file labels, White at the bottom.

    Uppercase letters are White pieces, lowercase Black (python-chess ``Piece.symbol()``), ``.`` empty.
    """
    lines = ["  +-----------------+"]
    for rank in range(7, -1, -1):
        row = []
        for file in range(8):
            piece = board.piece_at(chess.square(file, rank))
            row.append(piece.symbol() if piece else ".")
        lines.append(f"{rank + 1} | {' '.join(row)} |")
    lines.append("  +-----------------+")
    lines.append("    a b c d e f g h")
    return "\n".join(lines)


def game_outcome(board: chess.Board) -> chess.Outcome | None:
    """The result of ``board`` if the game is over now, else None.

    Over means, by the FIDE Laws of Chess (articles 5, 9.2, 9.3, 9.6) as python-chess implements them:
    checkmate, stalemate, insufficient material, the seventy-five-move rule or a fivefold repetition (all
    automatic, ``board.outcome(claim_draw=False)``), or a draw that has already happened and may be claimed:
    the current position occurred for the third time (``board.is_repetition(3)``) or fifty moves of each side
    passed without a capture or pawn move (``halfmove_clock >= 100``).  Unlike ``outcome(claim_draw=True)``,
    a draw that only the *next* move would produce is not counted: nobody claims it on the engine's behalf.

    Returns:
        a :class:`chess.Outcome` (``winner`` None for a draw), or None while the game goes on.
    """
    outcome = board.outcome(claim_draw=False)
    if outcome is not None:
        return outcome
    if board.is_repetition(3):
        return chess.Outcome(chess.Termination.THREEFOLD_REPETITION, None)
    if board.halfmove_clock >= 100:
        return chess.Outcome(chess.Termination.FIFTY_MOVES, None)
    return None


def _color_name(color: chess.Color) -> str:
    return "White" if color == chess.WHITE else "Black"


class BoardView:
    """The ``board`` property both chess envs share (a copy of their ``_board``)."""

    #: the ResetNeeded message when there is no position yet
    _no_board_message: ClassVar[str]
    _board: chess.Board | None

    @property
    def board(self) -> chess.Board:
        """A copy of the current position (with its move stack).

        Raises:
            ResetNeeded: no episode (game) was started.
        """
        if self._board is None:
            raise ResetNeeded(self._no_board_message)
        return self._board.copy()


class ChessEnv(BoardView, AgentFlyEnv):
    """Chess for language-model agents: Lichess puzzles (``mode="puzzle"``) or a game against Stockfish
    (``mode="play"``).  Actions are one move in UCI or SAN, parsed leniently (see
    :func:`agentfly_gym.envs.chess.moves.parse_move`); observations are text (board diagram, FEN, side to
    move, the opponent's last move, the task).

    Puzzle mode (data: the Lichess puzzle CSV, see :mod:`agentfly_gym.envs.chess.puzzles`): the episode
    starts after the opponent's setup move ``Moves[0]``; the agent must play ``Moves[1]``, ``Moves[3]``, ...
    and the environment plays the opponent's replies ``Moves[2]``, ``Moves[4]``, ... from the data.  Any
    checkmating move is accepted in place of the listed move (as Lichess accepts alternative mates).  No
    engine is started in puzzle mode.

    Play mode: the agent plays ``agent_color`` against Stockfish at ``skill_level`` and ``engine_depth`` /
    ``engine_movetime``; the engine (an :class:`~agentfly_gym.resources.InProcessSpec` resource, one
    Stockfish process per instance, at most ``max_instances`` alive per manager) is acquired at reset, reset
    (``ucinewgame`` + cleared hash) whenever the pool hands it to a new episode, and released when the
    episode ends.  A game is drawn only when the position on the board is really drawn (see
    :func:`game_outcome`): stalemate, insufficient material, a threefold or fivefold repetition that has
    occurred, or fifty or seventy-five moves without a capture or pawn move.  No draw is claimed because the
    *next* move could repeat a position (python-chess's ``outcome(claim_draw=True)`` does that), so an agent
    that repeats twice while the engine is winning does not end the game with 0.5.

    Rewards (``reward`` of a step; every other step gives 0.0):

    ========================================  =======  ===========  ==========
    event                                      reward   terminated   truncated
    ========================================  =======  ===========  ==========
    puzzle solved (last solution move played)  1.0      True         False
    puzzle: legal but wrong move               0.0      True         False
    puzzle: correct move, puzzle continues     0.0      False        False
    play: game won (agent mates, or wins)      1.0      True         False
    play: draw                                 0.5      True         False
    play: game lost                            0.0      True         False
    play: ``max_moves`` agent moves, no result 0.0      False        True
    illegal or unparsable move (both modes)    0.0      False        False
    ========================================  =======  ===========  ==========

    An illegal or unparsable move leaves the position unchanged, returns an observation that says why and
    lists the legal moves, and still counts as a step (``max_episode_steps``).

    ``info`` adds to the standard keys: ``admissible_actions`` (legal moves in UCI, sorted; empty when the
    game is over), ``fen`` (the position after the step), ``mode``, ``last_move`` (the opponent's last move
    in UCI or None), ``invalid_action`` (the reason a move was rejected, else None), and in puzzle mode
    ``rating`` and ``solution_progress`` (solver moves found / solver moves needed).  ``score`` is the
    solution progress in puzzle mode and the game result (1 / 0.5 / 0) in play mode; ``won`` is True for a
    solved puzzle or a won game.

    Args:
        mode: ``"puzzle"`` or ``"play"``.
        data_dir: folder holding the puzzle CSV (default: see
            :func:`agentfly_gym.envs.chess.puzzles.find_puzzles_file`).
        puzzles_file: a CSV path (absolute, or relative to the current folder or to the data folder).
        min_rating, max_rating: keep puzzles with ``min_rating <= Rating <= max_rating``.
        split: the puzzles drawn at reset without a ``task_id`` (puzzle mode): ``"all"`` (the default: every
            puzzle, uniformly, as before splits existed) or ``"train"`` / ``"validation"`` / ``"test"``, three
            disjoint parts of the set chosen by a hash of the ``PuzzleId``
            (:func:`~agentfly_gym.envs.chess.puzzles.split_of`: ~80/10/10%).  A split changes only which
            puzzles are drawn, never a puzzle's observations or rewards.
        agent_color: ``"white"``, ``"black"`` or ``"random"`` (drawn with ``np_random`` at reset), play mode.
        skill_level: Stockfish ``Skill Level`` 0-20 (20 = full strength), or ``None`` for full strength.
            Below 20 Stockfish randomises its choice with a clock-seeded generator: games are then not
            reproducible from the seed.
        engine_depth: the opponent's search depth in plies, or ``None``.
        engine_movetime: the opponent's search time per move in seconds, or ``None``.
        max_moves: agent moves after which a game without result is truncated (play mode).
        expert_depth: search depth of :meth:`expert_action` in play mode (full strength).
        stockfish_path: the Stockfish executable (default: ``stockfish`` on PATH, then ``/usr/games``).
        max_instances: capacity of the Stockfish pool of the manager (Stockfish processes at once).
        engine_threads, engine_hash_mb: UCI ``Threads`` and ``Hash`` (MiB) of each engine.
        show_legal_moves: also list the legal moves in every observation (always in ``info``).
        manager, step_timeout, reset_timeout, max_episode_steps, render_mode: see :class:`AgentFlyEnv`.

    Reset options: ``task_id`` (a Lichess ``PuzzleId``, puzzle mode; it must belong to ``split`` unless that is
    ``"all"``) and ``split``; ``agent_color`` and ``fen`` (a start
    position, default the initial position), play mode.

    Raises:
        ConfigError: a bad argument or option (the message names it and what is valid).
        DataNotFoundError: puzzle mode without a puzzle CSV (the message says where to download it).
        ResourceUnavailable: play mode without a Stockfish executable.
    """

    env_name = "Chess"
    agent_prompt = CHESS_PROMPT
    _no_board_message = "Chess: no episode; call reset() first"

    def __init__(self, *, mode: str = "puzzle", data_dir: str | os.PathLike | None = None,
                 puzzles_file: str | os.PathLike | None = None, min_rating: int | None = None,
                 max_rating: int | None = None, split: str = "all", agent_color: str = "white",
                 skill_level: int | None = 3,
                 engine_depth: int | None = 8, engine_movetime: float | None = None, max_moves: int = 150,
                 expert_depth: int = 12, stockfish_path: str | os.PathLike | None = None, max_instances: int = 4,
                 engine_threads: int = 1, engine_hash_mb: int = 16, show_legal_moves: bool = False,
                 manager: Manager | None = None, step_timeout: float | None = 60.0,
                 reset_timeout: float | None = 300.0, max_episode_steps: int | None = None,
                 render_mode: str | None = None) -> None:
        super().__init__(manager=manager, step_timeout=step_timeout, reset_timeout=reset_timeout,
                         max_episode_steps=max_episode_steps, render_mode=render_mode)
        if mode not in ("puzzle", "play"):
            raise ConfigError(f"mode={mode!r} is not one of 'puzzle', 'play'", field="mode")
        for name, value in (("min_rating", min_rating), ("max_rating", max_rating)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
                raise ConfigError(f"{name}={value!r} must be None or an integer rating")
        min_rating = None if min_rating is None else int(min_rating)
        max_rating = None if max_rating is None else int(max_rating)
        if min_rating is not None and max_rating is not None and min_rating > max_rating:
            raise ConfigError(f"min_rating={min_rating} is above max_rating={max_rating}", field="min_rating")
        self._check_color(agent_color, "agent_color")
        self._check_split(split)
        check_int("skill_level", skill_level, minimum=0, maximum=20, optional=True)
        check_int("engine_depth", engine_depth, optional=True, unit="plies")
        if engine_movetime is not None and not engine_movetime > 0:
            raise ConfigError(f"engine_movetime={engine_movetime!r} must be None or > 0 seconds")
        check_int("max_moves", max_moves)
        check_int("expert_depth", expert_depth, unit="plies")
        self.mode = mode
        self.reset_options = _PUZZLE_OPTIONS if mode == "puzzle" else _PLAY_OPTIONS
        self.min_rating, self.max_rating = min_rating, max_rating
        self.split = split
        self.agent_color = agent_color
        self.skill_level, self.engine_depth, self.engine_movetime = skill_level, engine_depth, engine_movetime
        self.max_moves, self.expert_depth = max_moves, expert_depth
        self.show_legal_moves = bool(show_legal_moves)
        self._stockfish_path = stockfish_path
        self._engine_args = dict(max_instances=max_instances, threads=engine_threads, hash_mb=engine_hash_mb)
        self._engine_spec_cache = None
        if mode == "play":
            self._engine_spec_cache = engine_spec(find_stockfish(stockfish_path), **self._engine_args)
        else:
            engine_spec("stockfish", **self._engine_args)  # validate the numbers now
        self._puzzles_path = find_puzzles_file(data_dir, puzzles_file) if mode == "puzzle" else None
        self._puzzles: PuzzleSet | None = None
        # episode state
        self._board: chess.Board | None = None
        self._puzzle: Puzzle | None = None
        self._next_index = 0  # index into puzzle.moves of the solver's next move
        self._found = 0
        self._last_move: tuple[str, str] | None = None  # (uci, san) of the opponent's last move
        self._color: chess.Color = chess.WHITE
        self._agent_moves = 0
        self._engine: EngineProxy | None = None
        self._expert_cache: tuple[tuple[int, str], str] | None = None
        self._result: float = 0.0

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _check_color(value: Any, name: str) -> None:
        if value not in ("white", "black", "random"):
            raise ConfigError(f"{name}={value!r} is not one of 'white', 'black', 'random'", field=name)

    @staticmethod
    def _check_split(value: Any) -> str:
        if value not in SPLITS:
            raise ConfigError(f"split={value!r} is not one of {list(SPLITS)}")
        return value

    async def atask_ids(self, split: str | None = None) -> list[str]:
        """The ``PuzzleId`` s of ``split`` (None: the env's ``split``), in file order (puzzle mode).

        Raises:
            NotImplementedError: play mode (its games have no task list).
            ConfigError: an unknown split.
        """
        if self.mode != "puzzle":
            raise NotImplementedError("Chess play mode has no task list; task ids exist in mode='puzzle'")
        puzzles = await self.puzzles()
        return puzzles.puzzle_ids(self._check_split(self.split if split is None else split))

    def episode_resource_specs(self) -> list:
        """A game (play mode) holds one Stockfish engine; a puzzle holds none."""
        return [self.engine_spec] if self.mode == "play" else []

    @property
    def engine_spec(self):
        """The :class:`~agentfly_gym.resources.InProcessSpec` of the Stockfish pool (resolved on first use).

        Raises:
            ResourceUnavailable: no Stockfish executable.
        """
        if self._engine_spec_cache is None:
            self._engine_spec_cache = engine_spec(find_stockfish(self._stockfish_path), **self._engine_args)
        return self._engine_spec_cache

    @property
    def puzzle(self) -> Puzzle | None:
        """The current puzzle (puzzle mode), else None."""
        return self._puzzle

    async def puzzles(self) -> PuzzleSet:
        """The puzzle set (loaded on first use in a worker thread, then cached per process)."""
        if self._puzzles is None:
            if self._puzzles_path is None:
                raise ConfigError("puzzles are only used in mode='puzzle'")
            self._puzzles = await asyncio.to_thread(load_puzzles, self._puzzles_path, min_rating=self.min_rating,
                                                    max_rating=self.max_rating)
        return self._puzzles

    def _observation(self, header: str) -> str:
        board = self._board
        assert board is not None
        if self._last_move is not None:
            last = f"{self._last_move[1]} ({self._last_move[0]})"
        else:
            last = "none"
        if self.mode == "puzzle":
            p = self._puzzle
            assert p is not None
            task = (f"Lichess puzzle {p.puzzle_id} (rating {p.rating}). You play {_color_name(self._color)}. "
                    "Find the best move; a legal but wrong move fails the puzzle.")
        else:
            strength = "full strength" if self.skill_level is None else f"skill level {self.skill_level} of 20"
            task = (f"A game against Stockfish ({strength}). You play {_color_name(self._color)}. "
                    "Win by checkmate (reward 1), a draw gives 0.5, a loss 0.")
        parts = [header, "", render_board(board), "",
                 f"FEN: {board.fen()}",
                 f"Side to move: {_color_name(board.turn)}",
                 f"Opponent's last move: {last}",
                 f"Task: {task}"]
        if self.show_legal_moves and not board.is_game_over():
            parts.append("Legal moves (UCI): " + " ".join(legal_moves_uci(board)))
        return "\n".join(parts)

    def _info(self, *, invalid: str | None = None) -> dict[str, Any]:
        board = self._board
        assert board is not None
        over = board.is_game_over() or self._scope is None
        info: dict[str, Any] = {
            "admissible_actions": [] if over else legal_moves_uci(board),
            "fen": board.fen(),
            "mode": self.mode,
            "last_move": self._last_move[0] if self._last_move else None,
            "invalid_action": invalid,
        }
        if self.mode == "puzzle":
            p = self._puzzle
            assert p is not None
            progress = self._found / p.solver_moves if p.solver_moves else 0.0
            info.update(rating=p.rating, solution_progress=progress, score=progress)
        else:
            info["score"] = self._result
        return info

    # ------------------------------------------------------------------ reset
    async def _reset_episode(self, scope: RolloutScope, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self._engine = None
        self._expert_cache = None
        self._last_move = None
        self._agent_moves = 0
        self._found = 0
        self._result = 0.0
        if self.mode == "puzzle":
            return await self._reset_puzzle(options)
        return await self._reset_play(scope, options)

    async def _reset_puzzle(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        puzzles = await self.puzzles()
        split = self._check_split(options.get("split", self.split))
        task_id = options.get("task_id")
        if task_id is not None:
            puzzle = puzzles.get(str(task_id))
            if puzzle is None:
                bounds = "" if self.min_rating is None and self.max_rating is None else \
                    f" with a rating in [{self.min_rating}, {self.max_rating}]"
                raise ConfigError(f"task_id={task_id!r} is not a PuzzleId in {puzzles.source}{bounds}")
            if split != "all" and split_of(puzzle.puzzle_id) != split:
                home = split_of(puzzle.puzzle_id)
                raise ConfigError(f"task_id={task_id!r} is a {home} puzzle, not in split={split!r}; "
                                  f"pass split={home!r} or 'all' to use it")
        elif split == "all":  # the draw as before splits existed: a seed gives the same puzzle
            puzzle = puzzles[int(self.np_random.integers(len(puzzles)))]
        else:
            indices = puzzles.split_indices(split)
            if not indices:
                raise ConfigError(f"split={split!r} has no puzzle in {puzzles.source}; use split='all'")
            puzzle = puzzles[indices[int(self.np_random.integers(len(indices)))]]
        board = chess.Board(puzzle.fen)
        if len(puzzle.moves) < 2:
            raise ConfigError(f"puzzle {puzzle.puzzle_id} has fewer than 2 moves: {' '.join(puzzle.moves)!r}")
        try:
            setup = board.parse_uci(puzzle.moves[0])
        except ValueError as e:
            raise ConfigError(f"puzzle {puzzle.puzzle_id}: setup move {puzzle.moves[0]!r} is not legal in {puzzle.fen}") from e
        self._last_move = (setup.uci(), board.san(setup))
        board.push(setup)
        self._board = board
        self._puzzle = puzzle
        self._color = board.turn
        self._next_index = 1
        self._task_id = puzzle.puzzle_id
        return self._observation(f"Puzzle: find the best move for {_color_name(board.turn)}."), self._info()

    async def _reset_play(self, scope: RolloutScope, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        color = options.get("agent_color", self.agent_color)
        self._check_color(color, "options['agent_color']")
        if color == "random":
            color = "white" if int(self.np_random.integers(2)) == 0 else "black"
        fen = options.get("fen")
        if fen is None:
            board = chess.Board()
        else:
            try:
                board = chess.Board(str(fen))
            except ValueError as e:
                raise ConfigError(f"options['fen']={fen!r} is not a FEN: {e}") from e
            if not board.is_valid() or board.is_game_over():
                raise ConfigError(f"options['fen']={fen!r} is not a playable position (invalid or game over)")
        self._board = board
        self._puzzle = None
        self._color = chess.WHITE if color == "white" else chess.BLACK
        strength = "full" if self.skill_level is None else f"skill{self.skill_level}"
        self._task_id = f"stockfish-{color}-{strength}" + ("" if fen is None else f"-{board.fen()}")
        self._engine = EngineProxy(await scope.acquire(self.engine_spec))
        header = f"New game: you play {_color_name(self._color)}."
        if board.turn != self._color:
            await self._engine_move()
            header += " Stockfish moved first."
        return self._observation(header), self._info()

    # ------------------------------------------------------------------ step
    async def _step_episode(self, action: str) -> StepResult:
        board = self._board
        assert board is not None
        try:
            move = parse_move(board, action)
        except MoveError as e:
            return self._invalid(e)
        if self.mode == "puzzle":
            return self._step_puzzle(move)
        return await self._step_play(move)

    def _invalid(self, e: MoveError) -> StepResult:
        board = self._board
        assert board is not None
        reason = str(e)
        header = (f"Invalid move: {reason}. The position is unchanged; {_color_name(board.turn)} to move.\n"
                  f"Legal moves (UCI): {' '.join(legal_moves_uci(board))}")
        return self._observation(header), 0.0, False, False, self._info(invalid=reason)

    def _step_puzzle(self, move: chess.Move) -> StepResult:
        board, p = self._board, self._puzzle
        assert board is not None and p is not None
        expected = board.parse_uci(p.moves[self._next_index])
        san = board.san(move)
        expected_san = board.san(expected)
        board.push(move)
        if move != expected and not board.is_checkmate():
            board.pop()  # show the position where the mistake was made
            header = (f"Wrong move: {san} ({move.uci()}). The solution was {expected_san} ({expected.uci()}). "
                      "Puzzle failed.")
            obs = self._observation(header)
            return obs, 0.0, True, False, {**self._info(), "admissible_actions": []}
        self._found += 1
        self._next_index += 1
        if board.is_checkmate() or self._next_index >= len(p.moves):
            self._found = p.solver_moves
            header = f"Correct: {san} ({move.uci()})" + (" is checkmate" if board.is_checkmate() else "") + \
                ". Puzzle solved!"
            info = self._info()
            info.update(won=True, admissible_actions=[])
            return self._observation(header), 1.0, True, False, info
        reply = board.parse_uci(p.moves[self._next_index])
        self._last_move = (reply.uci(), board.san(reply))
        board.push(reply)
        self._next_index += 1
        header = f"Correct: {san} ({move.uci()}). The opponent replied {self._last_move[1]}. Find the next move."
        return self._observation(header), 0.0, False, False, self._info()

    async def _engine_move(self) -> None:
        board = self._board
        assert board is not None and self._engine is not None
        reply = await self._engine.play(board.copy(), depth=self.engine_depth, movetime=self.engine_movetime,
                                        skill_level=self.skill_level)
        if reply not in board.legal_moves:  # never expected from Stockfish; keep the game consistent
            raise RuntimeError(f"stockfish answered the illegal move {reply} in {board.fen()}")
        self._last_move = (reply.uci(), board.san(reply))
        board.push(reply)
        self._expert_cache = None

    def _game_over(self, outcome: chess.Outcome, header: str) -> StepResult:
        if outcome.winner is None:
            self._result, text = 0.5, "Draw"
        elif outcome.winner == self._color:
            self._result, text = 1.0, "You won"
        else:
            self._result, text = 0.0, "You lost"
        reason = outcome.termination.name.lower().replace("_", " ")
        header = f"{header}\nGame over: {text} ({reason}, {outcome.result()})."
        info = self._info()
        info.update(won=self._result == 1.0, admissible_actions=[], result=outcome.result(), termination=reason)
        return self._observation(header), self._result, True, False, info

    async def _step_play(self, move: chess.Move) -> StepResult:
        board = self._board
        assert board is not None
        san = board.san(move)
        board.push(move)
        self._agent_moves += 1
        self._expert_cache = None
        header = f"You played {san} ({move.uci()})."
        outcome = game_outcome(board)
        if outcome is not None:
            return self._game_over(outcome, header)
        await self._engine_move()
        assert self._last_move is not None
        header += f" Stockfish replied {self._last_move[1]} ({self._last_move[0]})."
        outcome = game_outcome(board)
        if outcome is not None:
            return self._game_over(outcome, header)
        if self._agent_moves >= self.max_moves:
            header += f"\nThe game reached the move cap (max_moves={self.max_moves}) without a result."
            info = self._info()
            info["admissible_actions"] = []
            return self._observation(header), 0.0, False, True, info
        return self._observation(header + " Your move."), 0.0, False, False, self._info()

    # ------------------------------------------------------------------ expert
    async def expert_action(self) -> str:
        """The expert's next move in UCI: the puzzle's next solution move (from the data, no engine), or in
        play mode Stockfish's best move at full strength and ``expert_depth`` (computed once per position;
        uses the episode's engine).

        Raises:
            ResetNeeded: no episode is running.
        """
        if self._scope is None or self._board is None:
            raise ResetNeeded("Chess: no episode is running; call reset() first")
        if self.mode == "puzzle":
            assert self._puzzle is not None
            return self._puzzle.moves[self._next_index]
        board = self._board
        key = (len(board.move_stack), board.fen())
        if self._expert_cache is not None and self._expert_cache[0] == key:
            return self._expert_cache[1]
        if self._engine is None:
            self._engine = EngineProxy(await self.scope.acquire(self.engine_spec))
        move = await self._engine.best_move(board.copy(), depth=self.expert_depth)
        self._expert_cache = (key, move.uci())
        return move.uci()

    async def _end_of_episode(self) -> None:
        self._engine = None
