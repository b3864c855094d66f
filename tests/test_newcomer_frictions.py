"""What a newcomer met on the way, each now fixed: a README example that made an illegal move, a bare ``TypeError``
for a misspelt ``@tool`` option, a task row the reward cannot score accepted until the first episode ended, rows
counted from 0 in messages about a file whose lines count from 1, ``dataset check`` missing from ``dataset
--help``, a misspelt ``--env-kwargs`` key without a suggestion, and a verl example that asked for a data folder
while the samples ship with the package.

Real components: the Chess env on the shipped puzzles, the tool layer, the ``agentfly-gym`` command as a
subprocess, the example script's own data preparation (run up to verl's trainer, which needs a GPU).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium
import pyarrow.parquet as pq
import pytest

import agentfly_gym  # noqa: F401  (registers the envs)
from agentfly_gym.errors import ConfigError
from agentfly_gym.tools import make_tool_env, tool

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentfly_gym", *args], capture_output=True, text=True,
                          timeout=300, env=env or dict(os.environ))


def test_the_readme_first_chess_move_is_legal_at_its_seed(monkeypatch):
    """The README's first block plays a literal move on Chess-v0 after ``reset(seed=...)``: that move must be
    legal there (it was ``Nf3`` in a position with Black to move).  Read, as the README's blocks run, from the
    puzzles shipped in the package (no data folder)."""
    monkeypatch.delenv("AGENTFLY_GYM_DATA", raising=False)
    first = FENCE.search((ROOT / "README.md").read_text(encoding="utf-8")).group(1)
    assert 'gymnasium.make("agentfly/Chess-v0")' in first
    seed = int(re.search(r"env\.reset\(seed=(\d+)\)", first).group(1))
    move = re.search(r'env\.step\("([^"]+)"\)', first).group(1)
    env = gymnasium.make("agentfly/Chess-v0")
    try:
        env.reset(seed=seed)
        obs, reward, terminated, truncated, info = env.step(move)
    finally:
        env.close()
    assert info["invalid_action"] is None, obs
    assert info["error"] is None


def test_a_misspelt_tool_option_names_the_right_one():
    with pytest.raises(ConfigError, match=r"'timout' \(did you mean 'timeout'\?\)"):
        @tool(timout=5)
        def add(a: int, b: int) -> int:
            """Add two integers.

            Args:
                a: the first number
                b: the second number
            """
            return a + b


def _add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def exact(completion: str, answer: str, **row) -> float:
    return float(answer in completion)


def test_a_row_without_a_field_the_reward_reads_is_refused_by_make_tool_env():
    rows = [{"prompt": "What is 2+3?", "answer": "5"}, {"prompt": "What is 1+1?", "solution": "2"}]
    with pytest.raises(ConfigError, match=r"task row 2 lacks the field\(s\) \['answer'\]"):
        make_tool_env("frictions/MissingField-v0", tasks=rows, tools=[_add], reward=exact)
    assert "frictions/MissingField-v0" not in gymnasium.registry


def test_a_reward_that_reads_only_row_kwargs_or_defaults_needs_no_field():
    def lenient(completion: str, answer: str = "", **row) -> float:
        return float(bool(answer) and answer in completion)

    env_id = make_tool_env("frictions/Lenient-v0", tasks=[{"prompt": "What is 2+3?"}], tools=[_add], reward=lenient)
    try:
        assert env_id in gymnasium.registry
    finally:
        del gymnasium.registry[env_id]


def test_task_file_messages_count_lines_from_1(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"prompt": "What is 2+3?", "answer": "5"}\n\n{"prompt": "What is 1+1?"}\n')
    with pytest.raises(ConfigError, match=r"tasks\.jsonl, line 3 lacks the field\(s\) \['answer'\]"):
        make_tool_env("frictions/Lines-v0", tasks=tasks, tools=[_add], reward=exact)
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"prompt": "a", "id": "x"}\n{"prompt": "b", "id": "x"}\n')
    with pytest.raises(ConfigError, match=r"dup\.jsonl, line 1 and .*dup\.jsonl, line 2 share the id 'x'"):
        make_tool_env("frictions/Dup-v0", tasks=dup, tools=[_add], reward=exact)
    with pytest.raises(ConfigError, match=r"^task row 1 needs a non-empty str 'prompt'"):
        make_tool_env("frictions/NoPrompt-v0", tasks=[{"question": "?"}], tools=[_add], reward=exact)


def test_dataset_help_shows_the_check_subcommand():
    r = cli("dataset", "--help")
    assert r.returncode == 0, r.stderr
    assert "dataset check A.parquet B.parquet" in r.stdout, r.stdout
    r = cli("--help")
    assert "check A.parquet" in r.stdout, r.stdout


@pytest.mark.parametrize(("kwargs", "said"), [
    ({"Chess-v0": {"mdoe": "play"}}, "'mdoe' (did you mean 'mode'?)"),
    ({"Chess-v0": {"max_episode_step": 3}}, "'max_episode_step' (did you mean 'max_episode_steps'?)"),
    ({"Chss-v0": {"mode": "play"}}, "'Chss-v0' (did you mean 'agentfly/Chess-v0'?)"),
])
def test_a_misspelt_env_kwargs_key_gets_a_suggestion(kwargs, said):
    r = cli("rollout", "--env", "Chess-v0", "--policy", "random", "--tokenizer", "qwen3", "--no-progress",
            "--env-kwargs", json.dumps(kwargs))
    assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.slow  # two data sets built and checked: 20 s on the loaded 2-core machine
def test_the_verl_example_prepares_its_data_from_the_shipped_samples(tmp_path):
    """The example's data step runs with no data folder (the Lichess sample ships in the package) and writes a
    training and a validation set from disjoint splits, checked with ``dataset check``; ``PREPARE_ONLY=1`` stops
    before verl's trainer (which needs a GPU)."""
    script = ROOT / "plugins" / "verl" / "examples" / "run_grpo_chess.sh"
    assert "$AGENTFLY_GYM_DATA/chess" not in script.read_text()
    env = {k: v for k, v in os.environ.items() if k != "AGENTFLY_GYM_DATA"}
    env.update(PREPARE_ONLY="1", N_TRAIN="4", N_VAL="2", DATA=str(tmp_path), PATH=f"{Path(sys.executable).parent}:"
               f"{env.get('PATH', '')}")
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    train, val = pq.read_table(tmp_path / "train.parquet"), pq.read_table(tmp_path / "val.parquet")
    assert (train.num_rows, val.num_rows) == (4, 2)
    assert "0 shared task" in r.stdout + r.stderr


def test_the_verl_example_needs_no_data_folder_and_splits_its_sets():
    """The fast half of the check above: the script builds from the train and validation splits (not from two seed
    ranges of one task list) and checks them, and no longer says it needs a data folder."""
    text = (ROOT / "plugins" / "verl" / "examples" / "run_grpo_chess.sh").read_text()
    assert "$AGENTFLY_GYM_DATA/chess" not in text
    assert '"$N_TRAIN" train' in text
    assert '"$N_VAL" validation' in text
    assert "dataset check" in text


def test_the_verl_quickstart_says_why_it_writes_two_data_sets():
    text = (ROOT / "docs" / "trainers.md").read_text(encoding="utf-8")
    before = text[:text.index("agentfly-gym dataset Chess -o data/train.parquet")]
    said = " ".join(before[-700:].split())
    assert "two data sets" in said
    assert "validation" in said
    assert "share no task" in said
