"""agentfly/Chess-v0: Lichess puzzles from the test data and games against the real Stockfish.

Everything is real: python-chess, the Debian Stockfish binary, the 1,000-puzzle Lichess sample in
tests/data and the resource manager.  Stockfish searches are kept shallow so the module runs in
well under a minute on two busy cores.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import chess
import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import agentfly_gym
from agentfly_gym.envs.chess import (ChessEnv, MoveError, StockfishEngine, find_stockfish, game_outcome, load_puzzles,
                                     parse_move)
from agentfly_gym.errors import ConfigError, DataNotFoundError, ResetNeeded, ResourceUnavailable
from agentfly_gym.resources import ResourceManager
from agentfly_gym.utils.aio import run_sync
from proctools import alive, live_processes
from waiting import until

REPO = Path(__file__).resolve().parents[1]

# Real puzzles of the sample (see tests/data/chess/README.md):
#  tewjc: 3 solver moves, Rxe3+ Qxa1+ Rxa1, no mate.
#  mJDcO: mate in 2, the data's final move a1f1 (Qxf1#) has an alternative mate f8f1 (Rxf1#).
#  rSju2: mate in 2, the data's final move h2h1q (h1=Q#) has an alternative mate h2h1r (h1=R#).
TEWJC = ("tewjc", ["e5e3", "f6a1", "a8a1"])


def _live_stockfish_children() -> set[int]:
    """Pids of this process's live child processes named stockfish."""
    return live_processes(["stockfish"], children_of=os.getpid())


def _pool(manager: ResourceManager) -> dict:
    (metrics,) = manager.metrics().values()
    return metrics


@pytest.fixture(autouse=True)
def _no_stockfish_left_behind():
    before = _live_stockfish_children()
    yield
    leaked = _live_stockfish_children() - before
    for pid in leaked:  # do not let one failure leak into other tests
        os.kill(pid, 9)
    assert not leaked, f"stockfish processes left running: {leaked}"


# ---------------------------------------------------------------------------------------- registration
def test_make_after_import_and_with_module_prefix():
    env = gymnasium.make("agentfly/Chess-v0")
    try:
        assert isinstance(env.unwrapped, ChessEnv)
        obs, info = env.reset(seed=0)
        assert "FEN: " in obs
        assert info["admissible_actions"]
    finally:
        env.close()
    # a fresh interpreter that never imported agentfly_gym: gymnasium imports it from the prefix
    code = ("import gymnasium, sys; env = gymnasium.make('agentfly_gym:agentfly/Chess-v0'); "
            "obs, info = env.reset(seed=3); print(type(env.unwrapped).__name__, info['task_id']); env.close()")
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "ChessEnv"


@pytest.mark.parametrize("kwargs", [{}, {"mode": "play", "skill_level": 0, "engine_depth": 1}])
def test_check_env(kwargs):
    env = gymnasium.make("agentfly/Chess-v0", **kwargs)
    try:
        check_env(env.unwrapped)
    finally:
        env.close()
        run_sync(env.unwrapped.manager.aclose())  # the background loop's default manager (engines of play mode)


# ---------------------------------------------------------------------------------------- puzzles
async def test_puzzle_solved_by_expert_gives_one():
    env = ChessEnv()
    obs, info = await env.areset(options={"task_id": TEWJC[0]})
    assert info["task_id"] == "tewjc"
    assert info["rating"] == 1493
    assert info["last_move"] == "a2a7"
    assert "Side to move: Black" in obs
    assert "Opponent's last move: Rxa7 (a2a7)" in obs
    assert "tewjc" in obs
    assert info["fen"] == obs.split("FEN: ")[1].splitlines()[0]
    rewards = []
    for expected in TEWJC[1]:
        move = await env.expert_action()
        assert move == expected
        obs, reward, terminated, truncated, info = await env.astep(f"Action: {move}")
        rewards.append(reward)
    assert rewards == [0.0, 0.0, 1.0]
    assert terminated
    assert not truncated
    assert info["won"]
    assert info["score"] == 1.0
    assert info["admissible_actions"] == []
    assert "Puzzle solved" in obs
    with pytest.raises(ResetNeeded):
        await env.astep("e4")
    with pytest.raises(ResetNeeded):
        await env.expert_action()
    await env.aclose()


async def test_puzzle_wrong_legal_move_fails_with_zero():
    env = ChessEnv()
    await env.areset(options={"task_id": "tewjc"})
    obs, reward, terminated, truncated, info = await env.astep("Kh8")
    assert (reward, terminated, truncated, info["won"]) == (0.0, True, False, False)
    assert "Wrong move: Kh8" in obs
    assert "Rxe3+ (e5e3)" in obs
    # failing after a correct move: progress is kept in the score
    await env.areset(options={"task_id": "tewjc"})
    _, reward, terminated, _, info = await env.astep("Rxe3+")
    assert (reward, terminated, info["score"]) == (0.0, False, pytest.approx(1 / 3))
    assert info["last_move"] == "f2e3"
    _, reward, terminated, _, info = await env.astep("Qf5")
    assert (reward, terminated, info["score"]) == (0.0, True, pytest.approx(1 / 3))
    await env.aclose()


@pytest.mark.parametrize("puzzle_id, first, final, final_alt",
                         [("mJDcO", "d4a1", "a1f1", "Rxf1#"), ("rSju2", "c8h3", "h2h1q", "h1=R#")])
async def test_puzzle_accepts_any_mate(puzzle_id, first, final, final_alt):
    env = ChessEnv()
    await env.areset(options={"task_id": puzzle_id})
    _, reward, terminated, _, _ = await env.astep(first)
    assert (reward, terminated) == (0.0, False)
    assert await env.expert_action() == final  # the data lists another mating move
    obs, reward, terminated, _, info = await env.astep(final_alt)
    assert (reward, terminated, info["won"]) == (1.0, True, True)
    assert "checkmate" in obs
    await env.aclose()


async def test_puzzle_choice_by_seed_and_rating_filter():
    env = ChessEnv(min_rating=1900, max_rating=2100)
    ids = set()
    for seed in range(6):
        _, info = await env.areset(seed=seed)
        assert 1900 <= info["rating"] <= 2100
        ids.add(info["task_id"])
    assert len(ids) > 1
    _, a = await env.areset(seed=42)
    _, b = await env.areset(seed=42)
    assert a["task_id"] == b["task_id"]
    with pytest.raises(ConfigError, match="tewjc"):  # rated 1493: filtered out
        await env.areset(options={"task_id": "tewjc"})
    with pytest.raises(ConfigError, match="unknown reset option"):
        await env.areset(options={"puzzle": 1})
    await env.aclose()
    with pytest.raises(ConfigError, match="no puzzle"):
        await ChessEnv(min_rating=3500).areset()
    with pytest.raises(ConfigError) as info:
        ChessEnv(min_rating=2000, max_rating=1000)
    assert info.value.field == "min_rating"


def test_puzzle_data_resolution(tmp_path, test_data):
    with pytest.raises(DataNotFoundError, match=r"database\.lichess\.org"):
        ChessEnv(data_dir=tmp_path)
    # the full-dump name is preferred over the sample; puzzles_file= picks any CSV
    lines = (test_data / "chess" / "lichess_puzzles_sample.csv").read_text().splitlines()
    (tmp_path / "lichess_db_puzzle.csv").write_text("\n".join([lines[0], lines[1]]) + "\n")
    (tmp_path / "mine.csv").write_text("\n".join([lines[0], lines[2]]) + "\n")
    env = ChessEnv(data_dir=tmp_path)
    assert env.reset(seed=0)[1]["task_id"] == "tewjc"
    env.close()
    env = ChessEnv(data_dir=tmp_path, puzzles_file="mine.csv")
    assert env.reset(seed=0)[1]["task_id"] == "0kDWS"
    env.close()
    env = ChessEnv(puzzles_file=tmp_path / "mine.csv")
    assert env.reset(seed=0)[1]["task_id"] == "0kDWS"
    env.close()
    with pytest.raises(DataNotFoundError):
        ChessEnv(puzzles_file=tmp_path / "missing.csv")
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="Lichess puzzle CSV"):
        load_puzzles(tmp_path / "bad.csv")


# ---------------------------------------------------------------------------------------- actions
START = chess.Board()


@pytest.mark.parametrize("text, uci", [
    ("e2e4", "e2e4"), ("e4", "e2e4"), ("Move: e2e4", "e2e4"), ("1. e4", "e2e4"), ("1.e4", "e2e4"),
    ("Nf3+", "g1f3"), ("**e2e4**", "e2e4"), ("e2-e4", "e2e4"), ("E2E4", "e2e4"), ("nf3", "g1f3"),
    ("NF3", "g1f3"), ("Action: **Nf3**", "g1f3"), ("`e4`", "e2e4"), ('"e4".', "e2e4"), ("e2 e4", "e2e4"),
    ("Ng1-f3", "g1f3"), ("I think so.\nAction: g1f3", "g1f3"), ("**Action**: Nc3!", "b1c3"),
])
def test_parse_move_lenient(text, uci):
    assert parse_move(START, text).uci() == uci


def test_parse_move_special_moves_and_errors():
    castle = chess.Board("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1")
    for text, uci in [("O-O", "e1g1"), ("0-0", "e1g1"), ("o-o-o", "e1c1"), ("e1h1", "e1g1")]:
        assert parse_move(castle, text).uci() == uci
    promo = chess.Board("8/4P3/8/8/8/k7/8/K7 w - - 0 1")
    for text in ("e8=Q", "e7e8q", "e8q", "E7E8Q", "e7e8=Q"):
        assert parse_move(promo, text).uci() == "e7e8q"
    with pytest.raises(MoveError, match="promotion needs its piece") as e:
        parse_move(promo, "e7e8")
    assert e.value.kind == "illegal"
    with pytest.raises(MoveError) as e:
        parse_move(chess.Board("4k3/8/8/8/8/8/8/1N2KN2 w - - 0 1"), "Nd2")
    assert e.value.kind == "ambiguous"
    for text, kind in [("e2e5", "illegal"), ("Ke2", "illegal"), ("garbage!!", "unparsable"), ("", "unparsable")]:
        with pytest.raises(MoveError) as e:
            parse_move(START, text)
        assert e.value.kind == kind


async def test_illegal_and_garbage_actions_are_handled():
    env = ChessEnv()
    _, info0 = await env.areset(options={"task_id": "tewjc"})
    for step, action in enumerate(["garbage", "e2e4", "Qxf1", "x" * 5000, "\x00\n\t"], start=1):
        obs, reward, terminated, truncated, info = await env.astep(action)
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert obs.startswith("Invalid move:")
        assert "Legal moves (UCI): " in obs
        assert "e5e3" in obs
        assert info["invalid_action"]
        assert info["step"] == step
        assert info["error"] is None
        assert info["fen"] == info0["fen"]
        assert info["admissible_actions"] == info0["admissible_actions"]
    _, reward, terminated, _, info = await env.astep("Rxe3+")  # the puzzle still goes on
    assert (reward, terminated, info["invalid_action"], info["last_move"]) == (0.0, False, None, "f2e3")
    with pytest.raises(TypeError):
        await env.astep(None)  # type: ignore[arg-type]
    await env.aclose()


# ---------------------------------------------------------------------------------------- play
async def test_play_game_with_expert_and_move_cap():
    async with ResourceManager() as m:
        env = ChessEnv(manager=m, mode="play", skill_level=0, engine_depth=1, expert_depth=6, max_moves=120)
        obs, info = await env.areset()
        assert info["task_id"] == "stockfish-white-skill0"
        assert len(info["admissible_actions"]) == 20
        assert "Side to move: White" in obs
        assert "skill level 0" in obs
        terminated = truncated = False
        while not (terminated or truncated):
            obs, reward, terminated, truncated, info = await env.astep(await env.expert_action())
        # full-strength Stockfish (depth 6) beats skill level 0 at depth 1
        assert terminated and reward == 1.0 and info["won"] and info["result"] == "1-0", obs
        assert "Game over: You won" in obs

        black = ChessEnv(manager=m, mode="play", skill_level=0, engine_depth=1, max_moves=2)
        obs, info = await black.areset(options={"agent_color": "black"})
        assert "Stockfish moved first" in obs
        assert chess.Board(info["fen"]).turn == chess.BLACK
        assert info["last_move"] is not None
        results = [await black.astep(info["admissible_actions"][0])]
        results.append(await black.astep(results[-1][4]["admissible_actions"][0]))
        assert [r[2:4] for r in results] == [(False, False), (False, True)]  # truncated at the move cap
        assert results[-1][1] == 0.0
        assert "move cap" in results[-1][0]
        await env.aclose()
        await black.aclose()


async def test_play_draw_scores_half():
    async with ResourceManager() as m:
        env = ChessEnv(manager=m, mode="play", engine_depth=1)
        # White to move; Qb6 stalemates the black king on a8
        await env.areset(options={"fen": "k7/2K5/8/1Q6/8/8/8/8 w - - 0 1"})
        obs, reward, terminated, truncated, info = await env.astep("Qb6")
        assert (reward, terminated, info["won"], info["result"]) == (0.5, True, False, "1/2-1/2")
        assert "stalemate" in obs
        with pytest.raises(ConfigError, match="fen"):
            await env.areset(options={"fen": "not a fen"})
        await env.aclose()


async def test_engine_reused_and_reset_between_episodes():
    async with ResourceManager() as m:
        env = ChessEnv(manager=m, mode="play", skill_level=0, engine_depth=1, expert_depth=4)
        await env.areset()
        first = env.scope.resources[env.engine_spec.key]
        await env.astep("e4")
        await env.expert_action()
        assert first.obj.searches == 2
        assert first.obj.resets == 0
        pid = first.obj.pid
        await env.areset()  # ends episode 1 (engine back to the pool) and acquires it again
        again = env.scope.resources[env.engine_spec.key]
        assert again is first
        assert again.obj.pid == pid
        assert again.obj.resets == 1
        assert again.obj.searches == 0
        metrics = _pool(m)
        assert metrics["started"] == 1
        assert metrics["reused"] >= 1
        assert metrics["resets"] >= 1
        assert _live_stockfish_children() == {pid}
        await env.aclose()
        assert _pool(m)["in_use"] == 0
        assert _pool(m)["idle"] == 1
    assert _live_stockfish_children() == set()


async def test_max_instances_caps_concurrency():
    async with ResourceManager() as m:
        envs = [ChessEnv(manager=m, mode="play", skill_level=0, engine_depth=1, max_instances=2) for _ in range(3)]
        await asyncio.gather(envs[0].areset(), envs[1].areset())
        third = asyncio.ensure_future(envs[2].areset())
        await until(lambda: _pool(m)["waiting"] == 1, 30, "the third env to queue")
        assert not third.done()
        metrics = _pool(m)
        assert (metrics["in_use"], metrics["waiting"], metrics["started"]) == (2, 1, 2)
        assert len(_live_stockfish_children()) == 2
        await envs[0].aclose()  # its engine goes to the waiting third env
        await asyncio.wait_for(third, 10)
        metrics = _pool(m)
        assert (metrics["started"], metrics["max_in_use"], metrics["reused"]) == (2, 2, 1)
        for env in envs[1:]:
            await env.aclose()
    assert _live_stockfish_children() == set()


async def test_killed_engine_is_a_handled_fault_and_replaced():
    async with ResourceManager() as m:
        env = ChessEnv(manager=m, mode="play", skill_level=0, engine_depth=1)
        await env.areset()
        pid = env.scope.resources[env.engine_spec.key].obj.pid
        os.kill(pid, 9)
        obs, reward, terminated, truncated, info = await env.astep("e4")
        assert truncated
        assert not terminated
        assert reward == 0.0
        assert info["error"]
        assert obs.startswith("Error:")
        _, info = await env.areset()  # a fresh engine replaces the dead one
        new_pid = env.scope.resources[env.engine_spec.key].obj.pid
        assert new_pid != pid
        assert _live_stockfish_children() == {new_pid}
        await env.aclose()
        os.kill(new_pid, 9)  # dies while idle in the pool: the health check on acquisition replaces it
        await until(lambda: not alive(new_pid), 10, "the killed engine to exit")
        env = ChessEnv(manager=m, mode="play", skill_level=0, engine_depth=1)
        await env.areset()
        assert env.scope.resources[env.engine_spec.key].obj.pid not in (pid, new_pid)
        assert _pool(m)["started"] == 3
        assert _pool(m)["replaced"] == 2
        await env.aclose()
    assert _live_stockfish_children() == set()


def test_no_stockfish_outlives_close_api():
    env = gymnasium.make("agentfly/Chess-v0", mode="play", skill_level=0, engine_depth=1)
    env.reset(seed=0)
    env.step("d4")
    assert len(_live_stockfish_children()) == 1
    env.close()
    run_sync(env.unwrapped.manager.aclose())
    assert _live_stockfish_children() == set()


# ---------------------------------------------------------------------------------------- config
def test_bad_config_and_missing_stockfish(tmp_path):
    with pytest.raises(ResourceUnavailable, match="stockfish_path"):
        ChessEnv(mode="play", stockfish_path=tmp_path / "nope")
    for kwargs, field in (({"mode": "blitz"}, "mode"), ({"mode": "play", "skill_level": 25}, "skill_level"),
                          ({"mode": "play", "agent_color": "red"}, "agent_color"),
                          ({"mode": "play", "max_instances": 0}, "max_instances")):
        with pytest.raises(ConfigError) as info:
            ChessEnv(**kwargs)
        assert info.value.field == field, kwargs
    assert os.access(find_stockfish(), os.X_OK)


def test_stockfish_engine_object_directly():
    engine = StockfishEngine()
    try:
        assert engine.healthy()
        board = chess.Board()
        assert engine.best_move(board, depth=2) in board.legal_moves
        engine.reset()
        assert engine.searches == 0
        assert engine.resets == 1
    finally:
        engine.close()
    assert not engine.healthy()
    assert engine.pid not in _live_stockfish_children()


def test_agent_prompt_round_trip():
    prompt = ChessEnv.agent_prompt
    assert "Action: <move>" in prompt.system
    reply = "The knight fork wins material.\nAction: Nf3"
    assert parse_move(START, prompt.parse_action(reply)).uci() == "g1f3"
    assert agentfly_gym.__version__


# ---------------------------------------------------------------------------------------- fidelity
# Black (the engine) a queen up; both kings shuffle e1-f1 / e8-f8.
QUEEN_UP = "q3k3/8/8/8/8/8/8/4K3 w - - 0 1"
SHUFFLE = ["e1f1", "e8f8", "f1e1", "f8e8", "e1f1", "e8f8"]


def test_game_outcome_counts_only_draws_that_happened():
    board = chess.Board(QUEEN_UP)
    for uci in SHUFFLE + ["f1e1"]:
        board.push_uci(uci)
    # after two repetitions Black *could* repeat a third time (Ke8): python-chess's claim_draw=True calls that a
    # draw already; the game is not drawn until the position has really occurred three times
    assert board.outcome(claim_draw=True) is not None
    assert game_outcome(board) is None
    board.push_uci("f8e8")
    assert game_outcome(board) == chess.Outcome(chess.Termination.THREEFOLD_REPETITION, None)
    fifty = chess.Board("q3k3/8/8/8/8/8/8/4K3 w - - 99 80")
    assert game_outcome(fifty) is None
    assert fifty.outcome(claim_draw=True) is not None
    fifty.push_uci("e1f1")  # the 100th half-move without capture or pawn move
    assert game_outcome(fifty) == chess.Outcome(chess.Termination.FIFTY_MOVES, None)
    # automatic endings are unchanged
    for fen, termination, winner in [("k7/8/1QK5/8/8/8/8/8 b - - 0 1", chess.Termination.STALEMATE, None),
                                     ("k7/8/2K5/8/8/8/8/8 b - - 0 1", chess.Termination.INSUFFICIENT_MATERIAL, None),
                                     ("k7/1Q6/2K5/8/8/8/8/8 b - - 0 1", chess.Termination.CHECKMATE, chess.WHITE),
                                     ("q3k3/8/8/8/8/8/8/4K3 w - - 150 100", chess.Termination.SEVENTYFIVE_MOVES, None)]:
        assert game_outcome(chess.Board(fen)) == chess.Outcome(termination, winner), fen
    assert game_outcome(chess.Board()) is None


async def test_play_no_draw_claimed_for_the_engine():
    """The position after two repetitions with the engine a queen up: the game goes on (it ended 0.5 before).

    The repetition history is pushed onto the env's board after reset (a FEN carries no history).
    """
    async with ResourceManager() as m:
        env = ChessEnv(manager=m, mode="play", skill_level=None, engine_depth=6)
        await env.areset(options={"fen": QUEEN_UP})
        for uci in SHUFFLE:
            env._board.push_uci(uci)
        obs, reward, terminated, truncated, info = await env.astep("Ke1")
        assert (reward, terminated, truncated) == (0.0, False, False), obs
        assert "Game over" not in obs
        assert info["admissible_actions"]
        assert not env.board.is_repetition(3)  # Stockfish, a queen up, did not repeat either
        await env.aclose()


def test_bare_destination_of_a_promotion_gets_the_promotion_hint():
    white = chess.Board("8/4P3/8/8/8/k7/8/K7 w - - 0 1")
    black = chess.Board("8/8/8/8/8/k7/3p4/K3R3 b - - 0 1")
    for board, texts, hint in [(white, ["e8", "e7e8", "Action: e8"], "e7e8q"), (black, ["d1", "d2d1"], "d2d1q"),
                               (black, ["dxe1", "de1", "d2e1"], "d2e1q")]:
        for text in texts:
            with pytest.raises(MoveError, match=rf"a promotion needs its piece, e\.g\. {hint}\)") as e:
                parse_move(board, text)
            assert e.value.kind == "illegal", text
    with pytest.raises(MoveError) as e:
        parse_move(black, "e1")  # no pawn can reach e1 straight: no promotion hint
    assert "promotion" not in str(e.value)
