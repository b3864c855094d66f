"""Task splits without overlap: every env's train / validation / test splits share no task,
data-set rows record the concrete task id, and ``agentfly-gym dataset`` keeps two files apart or says that
they are not.

Real components: the Chess puzzle sample of tests/data, the ALFWorld sample games, the real ScienceWorld
simulator (one JVM), the WebShop server on the catalog sample, and the verl plugin's data-set writer.
"""

from __future__ import annotations

import warnings

import gymnasium
import pyarrow.parquet as pq
import pytest

import agentfly_gym  # noqa: F401  (registers the envs)
from agentfly_gym.envs.chess.puzzles import find_puzzles_file, load_puzzles, split_of
from agentfly_gym.errors import ConfigError

pytest.importorskip("agentfly_gym_verl")
from agentfly_gym_verl.dataset import build_dataset, dataset_main, shared_tasks

pytestmark = pytest.mark.timeout(300)


def _tasks(path) -> list[str]:
    return [r["task_id"] for r in pq.read_table(path).column("extra_info").to_pylist()]


# ---------------------------------------------------------------------- Chess
def test_chess_puzzle_splits_are_a_partition_by_puzzle_id():
    """Each puzzle is in exactly one of train / validation / test, decided by its id alone (~80/10/10%)."""
    puzzles = load_puzzles(find_puzzles_file())
    parts = {s: set(puzzles.puzzle_ids(s)) for s in ("train", "validation", "test")}
    everything = set(puzzles.puzzle_ids("all"))
    assert parts["train"] | parts["validation"] | parts["test"] == everything
    assert sum(len(p) for p in parts.values()) == len(everything) == len(puzzles)
    assert 0.7 < len(parts["train"]) / len(puzzles) < 0.9
    assert len(parts["validation"])
    assert len(parts["test"])
    assert all(split_of(p) == s for s, ids in parts.items() for p in ids)
    assert split_of("tewjc") == split_of("tewjc")  # no seed, no process state


def test_chess_split_draws_only_its_puzzles_and_all_keeps_the_old_draw():
    """split="test" resets only to test puzzles and refuses another split's task_id; the default "all" draws
    the puzzle the seed drew before splits existed (puzzles[np_random.integers(len)]); observations and rewards
    of a puzzle do not depend on the split."""
    import numpy as np

    env = gymnasium.make("agentfly/Chess-v0", split="test").unwrapped
    default = gymnasium.make("agentfly/Chess-v0").unwrapped
    try:
        puzzles = load_puzzles(find_puzzles_file())
        test_ids = set(puzzles.puzzle_ids("test"))
        seen = {env.reset(seed=s)[1]["task_id"] for s in range(20)}
        assert seen <= test_ids
        assert len(seen) > 3
        train_id = puzzles.puzzle_ids("train")[0]
        with pytest.raises(ConfigError, match="train puzzle"):
            env.reset(seed=0, options={"task_id": train_id})
        for s in range(5):
            want = puzzles[int(np.random.default_rng(s).integers(len(puzzles)))].puzzle_id
            assert default.reset(seed=s)[1]["task_id"] == want
        tid = sorted(test_ids)[0]
        a = env.reset(seed=1, options={"task_id": tid})
        b = default.reset(seed=2, options={"task_id": tid})
        assert a[0] == b[0]
        move = a[1]["admissible_actions"][0]
        assert env.step(move)[:4] == default.step(move)[:4]
        with pytest.raises(ConfigError, match="split"):
            gymnasium.make("agentfly/Chess-v0", split="dev")
    finally:
        env.close()
        default.close()


# ---------------------------------------------------------------------- data sets
def test_readme_example_train_and_validation_share_no_task(tmp_path):
    """The README's example: -n 256 training rows (default split) and -n 32 validation rows, both with the
    default seed: every row records its puzzle id, and the two files share none (the old rows drew both from
    seeds 0.. and shared all 32, with empty task ids)."""
    train = tmp_path / "train.parquet"
    val = tmp_path / "val.parquet"
    assert dataset_main(["Chess", "-o", str(train), "-n", "256"]) == 0
    assert dataset_main(["Chess", "-o", str(val), "-n", "32", "--split", "validation"]) == 0
    t, v = _tasks(train), _tasks(val)
    assert len(t) == 256
    assert len(v) == 32
    assert all(t)
    assert all(v)
    assert len(set(t)) == 256  # a permutation: no repeat while the split has tasks left
    assert all(split_of(x) == "train" for x in t)
    assert all(split_of(x) == "validation" for x in v)
    assert not set(t) & set(v)
    assert shared_tasks(train, val)["common"] == []
    assert dataset_main(["check", str(train), str(val)]) == 0
    test = tmp_path / "test.parquet"
    assert dataset_main(["Chess", "-o", str(test), "-n", "8", "--split", "test"]) == 0
    assert all(split_of(x) == "test" for x in _tasks(test))
    rows = pq.read_table(test).column("extra_info").to_pylist()
    assert rows[0]["env_kwargs"] == '{"split": "test"}'
    assert [r["seed"] for r in rows] == list(range(8))


def test_overlap_is_refused_excluded_or_reported(tmp_path):
    """Two files of one split overlap: the second warns (a data set next to it), ``check`` exits 1 and names
    them, ``--exclude`` draws around the first, and a listed task that an excluded file holds is refused."""
    a = build_dataset("Chess", None, 64, tmp_path / "a.parquet")
    with pytest.warns(UserWarning, match="shares 16 task"):
        b = build_dataset("Chess", None, 16, tmp_path / "b.parquet")
    assert len(shared_tasks(a, b)["common"]) == 16
    assert dataset_main(["check", str(a), str(b)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = build_dataset("Chess", None, 16, tmp_path / "sub" / "c.parquet", exclude=[a])
    assert not set(_tasks(a)) & set(_tasks(c))
    assert dataset_main(["Chess", "-o", str(tmp_path / "d.parquet"), "-n", "16", "--exclude", str(a),
                         "--exclude", str(c)]) == 0
    assert not set(_tasks(tmp_path / "d.parquet")) & (set(_tasks(a)) | set(_tasks(c)))
    with pytest.raises(ConfigError, match="excluded"):
        build_dataset("Chess", [_tasks(a)[3]], None, tmp_path / "e.parquet", exclude=[a])
    assert dataset_main(["check", str(tmp_path / "nope.parquet"), str(a)]) == 2


def test_rows_from_seeds_are_flagged(tmp_path):
    """An env that lists no tasks (Chess play mode) still writes seed rows, with a warning that their overlap
    cannot be checked."""
    pytest.importorskip("chess.engine")
    from agentfly_gym.envs.chess import find_stockfish

    try:
        find_stockfish()
    except Exception:
        pytest.skip("no Stockfish")
    with pytest.warns(UserWarning, match="record no task id"):
        p = build_dataset("Chess", None, 2, tmp_path / "play.parquet", env_kwargs={"mode": "play"}, check=False)
    assert _tasks(p) == ["", ""]


# ---------------------------------------------------------------------- the other envs
def test_alfworld_splits_are_disjoint_and_named_alike():
    """ALFWorld: validation = valid_seen, test = valid_unseen; the three splits share no game."""
    from agentfly_gym.utils.aio import run_sync

    env = gymnasium.make("agentfly/ALFWorld-v0").unwrapped
    try:
        ids = {s: run_sync(env.atask_ids(s)) for s in ("train", "validation", "test", "valid_seen")}
        assert ids["validation"] == ids["valid_seen"]
        assert all(ids[s] for s in ("train", "validation", "test"))
        assert not set(ids["train"]) & set(ids["validation"])
        assert not set(ids["train"]) & set(ids["test"])
        assert not set(ids["validation"]) & set(ids["test"])
    finally:
        env.close()


def test_webshop_splits_follow_upstreams_goal_ranges(tmp_path, test_data):
    """WebShop: test = goals 0-499, validation = upstream's eval 500-1499, train 1500-; on the catalog sample
    (fewer goals) the test split holds them and the others are empty, and a train data set says so."""
    from agentfly_gym.utils.aio import run_sync

    env = gymnasium.make("agentfly/WebShop-v0").unwrapped
    try:
        test, val, train, everything = (run_sync(env.atask_ids(s)) for s in ("test", "validation", "train", "all"))
        n = len(everything)
        assert test == [str(i) for i in range(min(500, n))]
        assert val == [str(i) for i in range(min(500, n), min(1500, n))] == run_sync(env.atask_ids("eval"))
        assert train == [str(i) for i in range(min(1500, n), n)]
    finally:
        env.close()
    if not train:
        with pytest.raises(ConfigError, match="no task left"):
            build_dataset("WebShop", None, 4, tmp_path / "w.parquet", check=False)
        p = build_dataset("WebShop", None, 4, tmp_path / "w.parquet", split="test", check=False)
        assert set(_tasks(p)) <= set(test)


def test_scienceworld_validation_is_dev_and_splits_are_disjoint():
    """ScienceWorld: the simulator's own variation splits (validation = dev), one task's ids from a real JVM."""
    from agentfly_gym.utils.aio import run_sync

    env = gymnasium.make("agentfly/ScienceWorld-v0", task_name="boil", max_instances=1).unwrapped
    try:
        ids = {s: run_sync(env.atask_ids(s)) for s in ("train", "validation", "test", "dev")}
    finally:
        env.close()
    assert ids["validation"] == ids["dev"]
    assert all(ids.values())
    assert all(t.startswith("boil:") for v in ids.values() for t in v)
    assert not set(ids["train"]) & set(ids["dev"])
    assert not set(ids["train"]) & set(ids["test"])
    assert not set(ids["dev"]) & set(ids["test"])


def test_exclude_refuses_a_missing_file_and_its_own_output(tmp_path):
    """``--exclude`` of a file that does not exist says so, and an output that is also an exclude file is refused
    before anything is written (it would replace the data set whose tasks are to be left out)."""
    with pytest.raises(ConfigError, match="no such data set file"):
        build_dataset("Chess", None, 4, tmp_path / "a.parquet", exclude=[tmp_path / "missing.parquet"])
    a = build_dataset("Chess", None, 4, tmp_path / "a.parquet")
    before = a.read_bytes()
    with pytest.raises(ConfigError, match="both the output and an --exclude file"):
        build_dataset("Chess", None, 4, a, exclude=[a])
    assert a.read_bytes() == before


def test_exclude_of_a_runs_trajectories_or_a_non_parquet_file_is_one_clear_line(tmp_path, capsys):
    """``--exclude runs/x/trajectories.parquet`` (a rollout run's file, not a data set) used to print pyarrow's
    dump of the whole schema; it is now one line saying what the file is and what --exclude takes."""
    from agentfly_gym.cli import main

    run = tmp_path / "run"
    assert main(["rollout", "--env", "Chess-v0", "--policy", "random", "-n", "1", "--max-turns", "1",
                 "--no-progress", "--output-dir", str(run)]) == 0
    capsys.readouterr()
    assert dataset_main(["Chess", "-n", "2", "-o", str(tmp_path / "a.parquet"), "--no-check",
                         "--exclude", str(run / "trajectories.parquet")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a rollout run's trajectories file, not a data set written by agentfly-gym " \
                                   "dataset; --exclude and `dataset check` take the parquet files" in err, err
    (tmp_path / "notes.parquet").write_text("not parquet")
    with pytest.raises(ConfigError, match=r"notes.parquet is not a parquet file \(\w+\); --exclude"):
        build_dataset("Chess", None, 2, tmp_path / "b.parquet", exclude=[tmp_path / "notes.parquet"], check=False)
    # an extra_info column of strings, a symlink loop: clear errors, not AttributeError / RuntimeError
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"extra_info": ["a", "b"]}), tmp_path / "strings.parquet")
    (tmp_path / "loop.parquet").symlink_to(tmp_path / "loop.parquet")
    for bad, match in (("strings.parquet", "does not hold records"), ("loop.parquet", "no such data set file")):
        with pytest.raises(ConfigError, match=match):
            build_dataset("Chess", None, 2, tmp_path / "b.parquet", exclude=[tmp_path / bad], check=False)
    assert not (tmp_path / "a.parquet").exists()
    assert not (tmp_path / "b.parquet").exists()


def test_split_given_twice_or_to_an_env_without_splits_is_one_clear_config_error():
    """``split=`` and ``env_kwargs={"split": ...}`` that disagree used to let ``split=`` win silently; an env
    without splits given ``split=`` used to get the constructor's list of every argument."""
    from agentfly_gym.data.task_draw import draw_tasks

    with pytest.raises(ConfigError, match=r"split='validation' and env_kwargs split='train' disagree"):
        draw_tasks("agentfly/Chess-v0", n=2, split="validation", env_kwargs={"split": "train"})
    assert draw_tasks("agentfly/Chess-v0", ["tewjc"], split="train", env_kwargs={"split": "train"}).split == "train"
    with pytest.raises(ConfigError) as e:
        draw_tasks("agentfly/CodeInterpreter-v0", n=2, split="train")
    assert str(e.value) == ("agentfly/CodeInterpreter-v0 has no task splits (its constructor takes no split argument),"
                            " so split='train' cannot be drawn from: leave split out, or give task ids")
    from agentfly_gym.tools import make_tool_env

    tool_env = make_tool_env("test/NoSplits-v0", tasks=[{"prompt": "2+3?"}], tools=[], reward=lambda completion: 0.0,
                             replace=True)
    with pytest.raises(ConfigError, match=r"^test/NoSplits-v0 has no task splits \(its constructor"):
        draw_tasks(tool_env, n=1, split="validation")
