"""Chess for language-model agents: Lichess puzzles and games against Stockfish (``agentfly/Chess-v0``).

    import gymnasium, agentfly_gym
    env = gymnasium.make("agentfly/Chess-v0")                 # Lichess puzzles
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("Action: Qxd5")
    game = gymnasium.make("agentfly/Chess-v0", mode="play", skill_level=1)   # versus Stockfish

Importing this package starts nothing; Stockfish processes are resources of the resource manager.
"""

from typing import TYPE_CHECKING

from ...utils.lazy import lazy_exports

if TYPE_CHECKING:  # what type checkers and the API reference read; at run time each name is imported on
    # first use (agentfly_gym.utils.lazy), so `agentfly-gym envs` imports no engine or simulator module
    from .engine import ENGINE_FACTORY, StockfishEngine, engine_spec, find_stockfish
    from .env import CHESS_PROMPT, ChessEnv, game_outcome, render_board
    from .moves import MoveError, legal_moves_uci, parse_move
    from .puzzles import Puzzle, PuzzleSet, find_puzzles_file, load_puzzles

__getattr__, __dir__ = lazy_exports(__name__, {
    "CHESS_PROMPT": "env",
    "ChessEnv": "env",
    "ENGINE_FACTORY": "engine",
    "MoveError": "moves",
    "Puzzle": "puzzles",
    "PuzzleSet": "puzzles",
    "StockfishEngine": "engine",
    "engine_spec": "engine",
    "find_puzzles_file": "puzzles",
    "find_stockfish": "engine",
    "game_outcome": "env",
    "legal_moves_uci": "moves",
    "load_puzzles": "puzzles",
    "parse_move": "moves",
    "render_board": "env",
})

__all__ = [
    "CHESS_PROMPT",
    "ChessEnv",
    "ENGINE_FACTORY",
    "MoveError",
    "Puzzle",
    "PuzzleSet",
    "StockfishEngine",
    "engine_spec",
    "find_puzzles_file",
    "find_stockfish",
    "game_outcome",
    "legal_moves_uci",
    "load_puzzles",
    "parse_move",
    "render_board",
]
