"""ChessSelfPlay-v0: the PettingZoo AEC env (PettingZoo's own api_test), and multi-agent rollouts
(one trajectory per player, exact token ids, chain and step mode, an opponent that fails).

Real components throughout: python-chess boards from the resource manager, Stockfish for the
expert, a real tiny Qwen2 model (random weights, real tokenizer) for token-id games.
"""

from __future__ import annotations

import math
import warnings

import pytest

pytest.importorskip("pettingzoo")

import agentfly_gym
from agentfly_gym.errors import ConfigError, PolicyError, ResetNeeded
from agentfly_gym.resources import ResourceManager
from agentfly_gym.rollout import ExpertPolicy, RandomPolicy, SamplingParams
from agentfly_gym.rollout.chat import ChatTokenizer
from agentfly_gym.rollout.multiagent import run_multiagent_game, run_multiagent_rollouts, summarize_games

from proctools import live_processes, mark_tree, wait_gone

MATE_IN_ONE = "6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1"  # Ra8#


@pytest.fixture(autouse=True)
def no_leaked_engines(monkeypatch):
    """This test's own engines (tagged or below this process, so that other test runs on the machine do
    not count) must not outlive it."""
    marker = mark_tree(monkeypatch)
    before = live_processes(["stockfish"], marker=marker)
    yield
    assert not wait_gone(live_processes(["stockfish"], marker=marker) - before), "a Stockfish process outlived its test"


def _env(**kw):
    from agentfly_gym.envs.chess.selfplay import ChessSelfPlayEnv

    return ChessSelfPlayEnv(**kw)


def test_pettingzoo_api_test():
    from pettingzoo.test import api_test

    from agentfly_gym.envs.chess import selfplay

    env = selfplay.env()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PettingZoo recommends Box/Discrete spaces: text is the point here
        api_test(env, num_cycles=60)
    env.close()


def test_registered_for_make_multiagent_and_bad_ids_are_named():
    env = agentfly_gym.make_multiagent("agentfly/ChessSelfPlay-v0", max_moves=10)
    assert env.possible_agents == ["white", "black"]
    assert env.max_moves == 10
    with pytest.raises(ConfigError, match="NoSuchGame"):
        agentfly_gym.make_multiagent("NoSuchGame-v0")
    with pytest.raises(ConfigError) as info:
        agentfly_gym.make_multiagent("ChessSelfPlay", max_invalid_moves=0)
    assert info.value.field == "max_invalid_moves"


def test_mate_gives_zero_sum_rewards_and_observations_per_side():
    env = _env()
    env.reset(options={"fen": MATE_IN_ONE})
    assert env.agent_selection == "white"
    assert "a1a8" in env.infos["white"]["admissible_actions"]
    assert env.infos["black"]["admissible_actions"] == []
    assert "Legal moves" in env.observe("white")
    assert "Legal moves" not in env.observe("black")
    env.step("I will mate.\nAction: Ra8#")
    assert env.terminations == {"white": True, "black": True}
    assert env.rewards == {"white": 1.0, "black": -1.0}
    assert env.infos["white"]["result"] == "1-0"
    assert env.infos["white"]["won"]
    assert not env.infos["black"]["won"]
    assert "you lost (checkmate, 1-0)" in env.observe("black")
    # the board went back to its pool when the game ended
    assert env._scope is None
    obs, reward, term, trunc, info = env.last()
    assert reward == 1.0
    assert term
    env.step(None)
    env.step(None)
    assert env.agents == []
    with pytest.raises(ResetNeeded):
        env.step("e4")
    env.close()


def test_board_before_reset_names_the_env():
    """Chess-v0 and ChessSelfPlay-v0 share one ``board`` property; its error names the env."""
    from agentfly_gym.envs.chess.env import ChessEnv

    for env, message in ((ChessEnv(), "Chess: no episode"), (_env(), "ChessSelfPlay: no game")):
        with pytest.raises(ResetNeeded, match=message):
            env.board  # noqa: B018
        env.close()


def test_invalid_moves_keep_the_turn_then_forfeit():
    env = _env(max_invalid_moves=2)
    env.reset()
    env.step("Action: e5")  # not legal for White
    assert env.agent_selection == "white"
    assert "is not a legal move" in env.infos["white"]["invalid_action"]
    assert "Invalid move" in env.observe("white")
    assert env.rewards == {"white": 0.0, "black": 0.0}
    env.step("Action: hello")
    assert env.terminations == {"white": True, "black": True}
    assert env.rewards == {"white": -1.0, "black": 1.0}
    assert env.infos["black"]["termination"] == "forfeit"
    assert env.infos["black"]["result"] == "0-1"
    assert env.infos["white"]["invalid_moves"] == 2
    env.close()


def test_move_cap_truncates_both_without_reward():
    env = _env(max_moves=2)
    env.reset()
    env.step("e4")
    env.step("e5")
    assert env.truncations == {"white": True, "black": True}
    assert not any(env.terminations.values())
    assert env.rewards == {"white": 0.0, "black": 0.0}
    assert env.outcome["termination"] == "max moves"
    env.close()


def test_bad_fen_names_the_value():
    env = _env()
    with pytest.raises(ConfigError, match="not-a-fen"):
        env.reset(options={"fen": "not-a-fen"})
    env.close()


# ------------------------------------------------------------------ rollouts (scripted policies)
@pytest.fixture(scope="module")
def qwen_chat(test_data):
    from transformers import AutoTokenizer

    return ChatTokenizer(AutoTokenizer.from_pretrained(test_data / "tokenizers" / "qwen3"))


class Failing:
    """An opponent whose model server goes away after ``after`` turns."""

    def __init__(self, inner, after: int) -> None:
        self.inner, self.after, self.calls = inner, after, 0

    async def act(self, observation, info, env):
        self.calls += 1
        if self.calls > self.after:
            raise PolicyError("the opponent's server went away")
        return await self.inner.act(observation, info, env)


@pytest.mark.slow
async def test_expert_beats_random_and_rewards_are_zero_sum(qwen_chat):
    async with ResourceManager() as manager:
        env = _env(manager=manager, max_moves=300)
        white, black = await run_multiagent_game(env, {"white": ExpertPolicy(), "black": RandomPolicy(seed=1)},
                                                 qwen_chat, max_turns=200, game_id="g1")
        await env.aclose()
        assert (white.agent, black.agent) == ("white", "black")
        assert white.group_id == black.group_id == "g1"
        assert white.trajectory_id != black.trajectory_id
        assert white.result == "1-0"
        assert white.termination == "checkmate"
        assert white.reward == 1.0
        assert black.reward == -1.0
        assert white.success
        assert not black.success
        assert white.terminated
        assert black.terminated
        assert white.error is None
        # chain sequence: scripted actions with mask 1 and NaN logprobs, observations mask 0
        assert len(white.response_ids) == len(white.response_mask) == len(white.response_logprobs)
        assert white.num_sampled_tokens > 0
        assert 0 in white.response_mask
        # White moved first: White has as many turns as Black or one more (no rejected moves here)
        assert white.num_turns - black.num_turns in (0, 1)
        assert white.invalid_moves == black.invalid_moves == 0
        # the final -1 is on Black's last turn
        assert black.turns[-1].reward == -1.0
        # the board and the expert's engine came from the manager's pools
        labels = [p.spec.label for p in manager.pools.values()]
        assert any("chess-board" in x for x in labels) and any("stockfish" in x for x in labels), labels


async def test_an_opponent_failure_is_recorded_not_raised(qwen_chat):
    async with ResourceManager() as manager:
        env = _env(manager=manager)
        for mode in ("chain", "step"):
            white, black = await run_multiagent_game(
                env, {"white": RandomPolicy(seed=0), "black": Failing(RandomPolicy(seed=2), after=2)}, qwen_chat,
                mode=mode)
            assert black.error.startswith("black: PolicyError")
            assert white.error.startswith("opponent failed: black")
            assert white.truncated
            assert black.truncated
            assert white.reward == black.reward == 0.0
            assert white.num_turns == 3
            assert black.num_turns == 2
            assert summarize_games([white, black])["failed"] == 1
            assert white.scope_id == black.scope_id == env.game_id != ""  # the game's rollout scope, recorded
            assert env._scope is None  # the game's resources were released
        await env.aclose()


async def test_step_mode_rows_per_player_and_runner_summary(qwen_chat, tmp_path):
    res = await run_multiagent_rollouts("ChessSelfPlay-v0", ExpertPolicy(), qwen_chat, opponent=RandomPolicy(seed=3),
                                        num_games=2, concurrency=2, mode="step", max_turns=150,
                                        env_kwargs={"max_moves": 40}, output_dir=tmp_path)
    trajs = res.trajectories
    assert len(trajs) == 4
    assert [t.agent for t in trajs] == ["white", "black", "white", "black"]
    for t in trajs:
        assert t.error is None
        assert len(t.steps) == t.num_turns
        assert all(r.group_id == t.group_id and r.trajectory_id == t.trajectory_id for r in t.steps)
        assert t.steps[-1].done
        assert all(r.episode_return == t.reward for r in t.steps)
    games = res.summary["games"]
    assert games["games"] == 2
    assert games["white_wins"] + games["black_wins"] + games["draws"] + games["no_result"] == 2
    # the expert plays White in game 0 and Black in game 1 and never loses
    assert trajs[0].reward >= 0
    assert trajs[3].reward >= 0
    assert games["illegal_move_rate"] == 0.0
    assert res.summary["config"]["limits"]["max_turns"] == 150  # the old keyword built the limits
    assert (tmp_path / "steps.parquet").is_file()
    assert (tmp_path / "summary.json").is_file()


# ------------------------------------------------------------------ a real model on both sides
@pytest.mark.slow
async def test_tiny_model_self_play_keeps_exact_ids_in_chain_and_step_mode(tiny_qwen):
    from agentfly_gym.rollout.policies.transformers_policy import TransformersPolicy

    policy = TransformersPolicy(tiny_qwen, seed=0, max_batch_size=4)
    try:
        chat = ChatTokenizer(policy.tokenizer)
        recorded = []
        inner = policy.generate

        async def generate(prompt_ids, sampling):
            g = await inner(prompt_ids, sampling)
            recorded.append((list(prompt_ids), g))
            return g

        policy.generate = generate
        sampling = SamplingParams(max_tokens=12, temperature=1.0, seed=0)
        async with ResourceManager() as manager:
            env = _env(manager=manager, max_invalid_moves=2)
            white, black = await run_multiagent_game(env, policy, chat, sampling=sampling, max_turns=6)
            # a random model writes no legal move: White forfeits after two rejected moves
            assert white.result == "0-1"
            assert white.termination == "forfeit"
            assert white.reward == -1.0
            assert black.reward == 1.0
            assert black.num_turns == 0
            assert white.invalid_moves == 2
            assert summarize_games([white, black])["illegal_move_rate"] == 1.0
            # every sampled id and logprob is stored verbatim, in order, with mask 1
            gens = [g for _, g in recorded]
            sampled = [i for i, m in zip(white.response_ids, white.response_mask) if m == 1]
            assert sampled == [i for g in gens for i in g.token_ids]
            lps = [lp for lp, m in zip(white.response_logprobs, white.response_mask) if m == 1]
            assert all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(lps, [x for g in gens for x in g.logprobs]))
            # the second prompt is exactly the chain so far (prompt + first reply + feedback message)
            assert recorded[1][0] == white.prompt_ids + white.response_ids[:len(recorded[1][0]) - len(white.prompt_ids)]
            recorded.clear()
            w2, b2 = await run_multiagent_game(env, policy, chat, mode="step", sampling=sampling, max_turns=6)
            assert len(w2.steps) == 2
            assert [r.response_ids[:len(g.token_ids)] for r, (_, g) in
                                           zip(w2.steps, recorded)] == [g.token_ids for _, g in recorded]
            assert [r.prompt_ids for r in w2.steps] == [p for p, _ in recorded]
            assert w2.steps[-1].episode_return == -1.0
            assert b2.reward == 1.0
            await env.aclose()
    finally:
        policy.close()


@pytest.mark.slow
def test_cli_rollout_reports_per_side_results(tmp_path, capsys):
    """`agentfly-gym rollout --env ChessSelfPlay-v0` plays games, prints per-side results and saves them."""
    import json

    from agentfly_gym.cli import main

    rc = main(["rollout", "--env", "ChessSelfPlay-v0", "--policy", "expert", "--opponent", "random",
               "--tokenizer", "qwen3", "-n", "2", "--max-turns", "100", "--no-progress",
               "--env-kwargs", '{"ChessSelfPlay-v0": {"max_moves": 30}}', "--output-dir", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    for label in ("white wins", "black wins", "draws", "illegal-move rate"):
        assert label in out
    games = json.loads((tmp_path / "summary.json").read_text())["games"]
    assert games["games"] == 2
    assert games["failed"] == 0
    assert games["illegal_move_rate"] == 0.0
    assert games["white_wins"] + games["black_wins"] + games["draws"] + games["no_result"] == 2
    assert set(games["per_agent"]) == {"white", "black"}
    assert main(["rollout", "--env", "ChessSelfPlay-v0", "--env", "Chess-v0", "--policy", "random"]) != 0
    assert "a multi-agent environment is rolled out on its own" in capsys.readouterr().err
    assert main(["envs"]) == 0
    assert "agentfly/ChessSelfPlay-v0 (multi-agent)" in capsys.readouterr().out.replace("\n", "")
