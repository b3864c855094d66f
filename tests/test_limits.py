"""The one integer rule (check_int) and the episode limits shared by every runner (EpisodeLimits).

Pure value checks plus the runners' constructors: nothing is played, so the module runs in well under a second.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pickle

import numpy as np
import pytest

from agentfly_gym.errors import ConfigError
from agentfly_gym.limits import DEFAULT_HISTORY, EpisodeLimits, check_int
from agentfly_gym.rollout.episode import play_episode
from agentfly_gym.rollout.multiagent import DEFAULT_MAX_TURNS, MultiAgentConfig
from agentfly_gym.rollout.runner import RolloutConfig
from agentfly_gym.rollout.tasks import TaskRunner


@pytest.mark.parametrize("value", [1, 7, np.int64(3)])
def test_check_int_accepts_integers_and_returns_plain_int(value):
    out = check_int("n", value)
    assert out == value
    assert type(out) is int


@pytest.mark.parametrize("value", [0, -1, 1.0, "2", True, None])
def test_check_int_refuses_with_field(value):
    with pytest.raises(ConfigError) as info:
        check_int("num_games", value)
    assert info.value.field == "num_games"
    assert str(info.value).startswith(f"num_games={value!r} must be an integer >= 1")


def test_check_int_bounds_optional_and_unit():
    assert check_int("history", 0, minimum=0) == 0
    assert check_int("cap", None, optional=True) is None
    with pytest.raises(ConfigError, match=r"must be None or an integer >= 1 \(tokens\)$"):
        check_int("cap", 0, optional=True, unit="tokens")
    with pytest.raises(ConfigError, match=r"must be an integer in \[0, 20\]$") as info:
        check_int("skill", 21, minimum=0, maximum=20)
    assert info.value.field == "skill"


def test_config_error_keeps_its_field_through_pickle():
    err = pickle.loads(pickle.dumps(ConfigError("bad", field="max_turns")))
    assert type(err) is ConfigError
    assert err.field == "max_turns"
    assert str(err) == "bad"
    assert ConfigError("message only").field is None


def test_episode_limits_defaults_frozen_and_checked():
    lim = EpisodeLimits()
    assert lim.to_dict() == {"max_turns": 10, "max_context_tokens": None, "max_response_tokens": None,
                             "max_prompt_tokens": None, "history": DEFAULT_HISTORY}
    with pytest.raises(dataclasses.FrozenInstanceError):
        lim.max_turns = 3  # type: ignore[misc]
    assert hash(lim) == hash(EpisodeLimits())
    for field, bad in (("max_turns", 0), ("max_context_tokens", 0), ("max_response_tokens", -5),
                       ("max_prompt_tokens", 1.5), ("history", -1)):
        with pytest.raises(ConfigError) as info:
            EpisodeLimits(**{field: bad})
        assert info.value.field == field


def test_merge_replaces_only_what_is_given():
    base = EpisodeLimits(max_turns=5, max_context_tokens=512)
    assert EpisodeLimits.merge(base) is base
    merged = EpisodeLimits.merge(base, max_turns=None, history=1)
    assert (merged.max_turns, merged.max_context_tokens, merged.history) == (5, 512, 1)
    assert EpisodeLimits.merge(None, default_max_turns=200).max_turns == 200
    with pytest.raises(ConfigError) as info:
        EpisodeLimits.merge(None, max_tokens=3)
    assert info.value.field == "max_tokens"


def test_rollout_config_builds_and_mirrors_limits():
    old = RolloutConfig(env_ids=["agentfly/ALFWorld-v0"], max_turns=4, history=2)
    assert old.limits == EpisodeLimits(max_turns=4, history=2)
    new = RolloutConfig(env_ids=["agentfly/ALFWorld-v0"], limits=EpisodeLimits(max_turns=6, max_prompt_tokens=900))
    assert (new.max_turns, new.history, new.limits.max_prompt_tokens) == (6, DEFAULT_HISTORY, 900)
    assert dataclasses.replace(new, seed=3).limits == new.limits  # replace (run_rollouts does) keeps them
    with pytest.raises(ConfigError) as info:
        RolloutConfig(env_ids=["agentfly/ALFWorld-v0"], max_turns=0)
    assert info.value.field == "max_turns"
    with pytest.raises(ConfigError) as info:
        RolloutConfig(env_ids=["agentfly/ALFWorld-v0"], concurrency=0)
    assert info.value.field == "concurrency"


def test_task_runner_keeps_limits_and_old_attributes():
    runner = TaskRunner(None, None, max_turns=3, max_response_tokens=64)
    assert runner.limits == EpisodeLimits(max_turns=3, max_response_tokens=64)
    assert (runner.max_turns, runner.max_response_tokens, runner.history) == (3, 64, DEFAULT_HISTORY)
    assert TaskRunner(None, None, limits=EpisodeLimits(max_turns=2), history=0).limits.history == 0
    with pytest.raises(ConfigError) as info:
        TaskRunner(None, None, concurrency=0)
    assert info.value.field == "concurrency"


def test_play_episode_refuses_a_bad_limit_before_making_the_env():
    with pytest.raises(ConfigError) as info:  # an unknown env id would raise otherwise (nothing is made)
        asyncio.run(play_episode("agentfly/NoSuchEnv-v0", None, None, max_turns=0))
    assert info.value.field == "max_turns"


def test_multiagent_config_defaults_merge_and_refusals():
    cfg = MultiAgentConfig()
    assert cfg.limits.max_turns == DEFAULT_MAX_TURNS
    assert cfg.sampling is not None
    merged = MultiAgentConfig.merge(cfg, num_games=2, max_turns=7, history=1)
    assert (merged.num_games, merged.limits.max_turns, merged.limits.history) == (2, 7, 1)
    for kwargs, field in (({"num_games": 0}, "num_games"), ({"concurrency": -1}, "concurrency"),
                          ({"mode": "tree"}, "mode"), ({"if_exists": "append"}, "if_exists"),
                          ({"max_turns": 0}, "max_turns")):
        with pytest.raises(ConfigError) as info:
            MultiAgentConfig.merge(None, **kwargs)
        assert info.value.field == field
    with pytest.raises(TypeError, match="num_gams"):
        MultiAgentConfig.merge(None, num_gams=3)
