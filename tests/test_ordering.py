"""Longest-predicted-first when resources are scarce: priorities of waiting acquisitions (with an
age bound), the prediction of a task's rollout length from its earlier rollouts, and the runners' start order.

Real components: the in-process pool with the test_resources ``Box`` resource (an in-memory resource, as in
tests/test_resources.py), Chess puzzles played by the random policy through the real TaskRunner and
run_rollouts.  The Ray path is tested in tests/test_ray_manager.py (on its cluster).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from transformers import AutoTokenizer

import agentfly_gym  # noqa: F401
from agentfly_gym.errors import ConfigError, ResourceTimeout
from agentfly_gym.resources import InProcessSpec, ResourceManager
from agentfly_gym.resources.pool import ResourcePool
from agentfly_gym.resources.priority import acquire_priority, current_priority, serve_order
from agentfly_gym.rollout import RandomPolicy, RolloutConfig, TaskRow, TaskRunner, run_rollouts
from agentfly_gym.rollout.chat import ChatTokenizer
from agentfly_gym.rollout.models import smollm2_dir
from agentfly_gym.rollout.ordering import RolloutLengths, longest_first

from test_resources import Box


def box_pool(cap: int = 1, **kw) -> ResourcePool:
    return ResourcePool(InProcessSpec(factory="test_resources:Counter", max_instances=cap), lambda s: Box(s), **kw)


async def _queue(pool: ResourcePool, priorities: list[float | None], order: list[int],
                 first: int = 0) -> list[asyncio.Task]:
    """Waiters ``first + i`` with ``priorities[i]``, enqueued in index order; each appends its number to
    ``order`` when served."""
    async def waiter(i: int, p: float | None):
        r = await pool.acquire(priority=p)
        order.append(i)
        await asyncio.sleep(0)
        await pool.release(r)

    tasks = []
    for i, p in enumerate(priorities):
        tasks.append(asyncio.create_task(waiter(first + i, p)))
        await asyncio.sleep(0.01)
    return tasks


# ----------------------------------------------------------------------------- the rule
def test_serve_order_rule():
    w = ["a", "b", "c", "d"]
    ranks = {"a": (None, 0.0), "b": (5.0, 1.0), "c": (9.0, 2.0), "d": (5.0, 3.0)}
    assert serve_order(w, ranks.__getitem__, now=4.0, age_bound=None) == ["c", "b", "d", "a"]
    assert serve_order(w, lambda x: (None, 0.0), now=1.0) == w  # nothing known: FIFO
    # a and b have waited 3 s or more: first, oldest first, then by priority
    assert serve_order(w, ranks.__getitem__, now=4.0, age_bound=3.0) == ["a", "b", "c", "d"]


# ----------------------------------------------------------------------------- the pool
async def test_saturated_pool_serves_larger_priority_first_and_fifo_without():
    pool = box_pool(1)
    held = await pool.acquire()
    order: list[int] = []
    tasks = await _queue(pool, [None, 3.0, 10.0, 3.0, None], order)
    await pool.release(held)
    await asyncio.gather(*tasks)
    assert order == [2, 1, 3, 0, 4]  # 10 first, the two 3s FIFO, the unknown ones last in arrival order
    held = await pool.acquire()
    order.clear()
    tasks = await _queue(pool, [None, None, None], order)
    await pool.release(held)
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2]
    await pool.aclose()


async def test_age_bound_keeps_a_low_priority_waiter_from_starving():
    # the bound is long against the few loop turns between queueing waiters 1 and 2 and serving them (a loaded
    # machine can stall this process for a fraction of a second: with 0.2 s, waiter 1 aged too and came before 2)
    pool = box_pool(1, priority_age_bound=1.0)
    held = await pool.acquire()
    order: list[int] = []
    tasks = await _queue(pool, [1.0], order)
    await asyncio.sleep(1.05)  # waiter 0 is now past the bound
    tasks += await _queue(pool, [50.0, 60.0], order, first=1)
    await pool.release(held)
    await asyncio.gather(*tasks)
    assert order == [0, 2, 1]
    await pool.aclose()


async def test_cancelled_or_timed_out_prioritised_waiter_strands_nothing():
    pool = box_pool(1)
    held = await pool.acquire()
    order: list[int] = []
    low = await _queue(pool, [1.0], order)
    high = asyncio.ensure_future(pool.acquire(priority=100.0))
    with pytest.raises(ResourceTimeout):
        await pool.acquire(timeout=0.05, priority=1000.0)
    await asyncio.sleep(0.01)
    await pool.release(held)  # granted to `high`, which is cancelled before it runs: passed on to `low`
    high.cancel()
    await asyncio.wait_for(asyncio.gather(*low), 2)
    assert order == [0]
    assert pool.size == 1
    assert pool.metrics.in_use == 0
    assert pool.metrics.waiting == 0
    assert not pool._ranks
    await pool.aclose()


async def test_priority_travels_through_the_scope():
    """A scope's acquisitions carry the task's priority (what the runners set) or the scope's own."""
    async with ResourceManager(backend_factory=lambda s, m: Box(s)) as m:
        spec = InProcessSpec(factory="test_resources:Counter", max_instances=1)
        pool = m.pool(spec)
        held = await pool.acquire()
        order: list[str] = []

        async def rollout(name: str, p: float | None, own: float | None = None):
            with acquire_priority(p):
                assert current_priority() == p
                async with m.scope(name, priority=own) as scope:
                    await scope.acquire(spec)
                    order.append(name)

        tasks = []
        for name, p, own in (("short", 1.0, None), ("unknown", None, None), ("long", 50.0, None),
                             ("own", None, 20.0)):
            tasks.append(asyncio.create_task(rollout(name, p, own)))
            await asyncio.sleep(0.01)
        assert current_priority() is None
        await pool.release(held)
        await asyncio.gather(*tasks)
    assert order == ["long", "own", "short", "unknown"]


# ----------------------------------------------------------------------------- the prediction
def test_lengths_learn_persist_and_take_a_user_estimate(tmp_path):
    path = tmp_path / "run" / "lengths.json"
    lengths = RolloutLengths(path=path, alpha=0.5)
    assert lengths.predict("t") is None
    assert longest_first([None, None]) == [0, 1]
    lengths.observe("t", 10.0, 4)
    lengths.observe("t", 20.0, 8)
    lengths.observe("u", 2.0, 1)
    assert lengths.predict("t") == 15.0
    assert lengths.predict_turns("t") == 6.0
    assert lengths.order(["u", "new", "t"]) == ([2, 1, 0], [2.0, 8.5, 15.0])  # unknown: the mean of known ones
    lengths.save()
    again = RolloutLengths(path=path)  # a resumed run
    assert again.predict("t") == 15.0
    assert len(again) == 2
    assert json.loads(path.read_text())["version"] == 1
    own = RolloutLengths({"u": 99.0}, path=path)
    assert own.predict("u") == 99.0
    assert own.predict("t") == 15.0
    assert RolloutLengths(lambda k: len(k)).predict("abc") == 3.0
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not a saved RolloutLengths"):
        RolloutLengths(path=path)
    with pytest.raises(ConfigError):
        RolloutLengths(alpha=0)


# ----------------------------------------------------------------------------- the runners
@pytest.fixture(scope="module")
def chat():
    return ChatTokenizer(AutoTokenizer.from_pretrained(smollm2_dir()))


class Recording(RandomPolicy):
    """The random policy, recording the acquisition priority each episode runs under at its first turn.

    It holds every env it has seen: keyed by ``id(env)`` alone, a later episode's env could be given a freed
    env's id and go unrecorded (CI saw 3 of 4)."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.seen: list[float | None] = []
        self._envs: list = []

    async def act(self, observation, info, env):
        if not any(e is env for e in self._envs):
            self._envs.append(env)
            self.seen.append(current_priority())
        return await super().act(observation, info, env)


async def test_task_runner_starts_longest_predicted_first_and_learns(chat, tmp_path):
    rows = [TaskRow("Chess-v0", seed=s) for s in range(4)]
    keys = [r.length_key() for r in rows]
    assert keys[0] == "agentfly/Chess-v0/seed=0"
    policy = Recording()
    path = tmp_path / "lengths.json"
    async with ResourceManager() as m:
        runner = TaskRunner(policy, chat, manager=m, max_turns=1, concurrency=1,
                            lengths=RolloutLengths({keys[1]: 6.0, keys[3]: 9.0, keys[0]: 0.0}, path=path))
        trajs = await runner.aplay(rows)
        assert [t.seed for t in trajs] == [0, 1, 2, 3]  # returned in row order
        assert policy.seen == [9.0, 6.0, 5.0, 0.0]  # started longest first; seed 2 unknown: the mean
        # a second call (as the next training step) learns from the first: the user's estimate is gone
        runner.lengths.estimate = None
        walls = {k: t.timings["wall"] for k, t in zip(keys, trajs)}
        assert {k: runner.lengths.predict(k) for k in keys} == pytest.approx(walls)
        policy.seen.clear()
        await runner.aplay(rows)
        assert policy.seen == sorted(policy.seen, reverse=True)
        assert len(set(policy.seen)) == 4
        assert RolloutLengths(path=path).predict(keys[0]) is not None  # saved for a resumed run
        arrival = TaskRunner(policy, chat, manager=m, max_turns=1, concurrency=1, order="arrival")
        policy.seen.clear()
        await arrival.aplay(rows)
        assert policy.seen == [None] * 4
    with pytest.raises(ConfigError, match="order="):
        TaskRunner(policy, chat, order="random")


async def test_a_row_with_neither_task_nor_seed_has_no_length_key(chat, tmp_path):
    """A row naming neither a task nor a seed (a task drawn at random) predicts nothing: no key (it used to be
    ``"ENV/seed=None"``, one key shared by every random row), not learned from, started as an unseen row."""
    assert TaskRow("Chess-v0").length_key() is None
    assert TaskRow("Chess-v0", seed=0).length_key() == "agentfly/Chess-v0/seed=0"
    assert RolloutLengths({"agentfly/Chess-v0/seed=0": 4.0}).order([None, "agentfly/Chess-v0/seed=0"]) == (
        [0, 1], [4.0, 4.0])
    policy = Recording()
    async with ResourceManager() as m:
        runner = TaskRunner(policy, chat, manager=m, max_turns=1, concurrency=1,
                            lengths=RolloutLengths(path=tmp_path / "lengths.json"))
        trajs = await runner.aplay([TaskRow("Chess-v0"), TaskRow("Chess-v0", seed=0)])
    assert len(trajs) == 2
    assert not any(t.error for t in trajs)
    assert sorted(json.loads((tmp_path / "lengths.json").read_text())["tasks"]) == ["agentfly/Chess-v0/seed=0"]


async def test_run_rollouts_starts_longest_predicted_first(chat):
    policy = Recording()
    config = RolloutConfig(env_ids=["Chess-v0"], num_trajectories=3, max_turns=1, concurrency=1, seed=7,
                           lengths={"agentfly/Chess-v0/seed=8": 4.0, "agentfly/Chess-v0/seed=9": 8.0,
                                    "agentfly/Chess-v0/seed=7": 2.0})
    async with ResourceManager() as m:
        result = await run_rollouts(config, policy, chat, manager=m, progress=False)
    assert [t.seed for t in result.trajectories] == [7, 8, 9]
    assert policy.seen == [8.0, 4.0, 2.0]
    assert len(config.lengths) == 3  # learned from the finished trajectories, kept with the config


# ----------------------------------------------------------------------------- kept beside a run's outputs
async def test_run_rollouts_keeps_lengths_json_for_a_resumed_run(chat, tmp_path):
    """Ordering by prediction (the default), a run with an output folder keeps the estimate there as
    lengths.json; a resumed (appended) run in a new process, a new config, starts longest-predicted first from
    it and updates it."""
    from agentfly_gym.rollout.runner import LENGTHS_NAME

    out = tmp_path / "run"
    keys = [f"agentfly/Chess-v0/seed={s}" for s in (7, 8, 9)]
    async with ResourceManager() as m:
        first = RolloutConfig(env_ids=["Chess-v0"], num_trajectories=3, max_turns=1, concurrency=1, seed=7,
                              output_dir=out)
        policy = Recording()
        await run_rollouts(first, policy, chat, manager=m, progress=False)
        assert policy.seen == [None] * 3  # nothing known yet: arrival order, FIFO acquisitions
        saved = json.loads((out / LENGTHS_NAME).read_text())
        assert sorted(saved["tasks"]) == keys
        assert all(v["n"] == 1 for v in saved["tasks"].values())
        walls = {k: v["seconds"] for k, v in saved["tasks"].items()}
        assert not list(out.glob(".*.json*")), "no temporary file left"

        resumed = RolloutConfig(env_ids=["Chess-v0"], num_trajectories=3, max_turns=1, concurrency=1, seed=7,
                                output_dir=out, if_exists="append")
        policy = Recording()
        result = await run_rollouts(resumed, policy, chat, manager=m, progress=False)
        assert policy.seen == sorted(walls.values(), reverse=True)  # longest predicted first, from the file
        assert [t.trajectory_id for t in result.trajectories] == ["traj-00003", "traj-00004", "traj-00005"]
        again = json.loads((out / LENGTHS_NAME).read_text())["tasks"]
        assert all(again[k]["n"] == 2 for k in keys)

        arrival = RolloutConfig(env_ids=["Chess-v0"], num_trajectories=3, max_turns=1, concurrency=1, seed=7,
                                output_dir=out, if_exists="append", order="arrival")
        policy = Recording()
        await run_rollouts(arrival, policy, chat, manager=m, progress=False)
        assert policy.seen == [None] * 3                                 # arrival order, FIFO acquisitions ...
        after = json.loads((out / LENGTHS_NAME).read_text())["tasks"]   # ... but its lengths are recorded
        assert sorted(after) == keys
        assert all(after[k]["n"] == 3 for k in keys)

        fresh = tmp_path / "arrival-first"                             # an arrival run's file orders a later run
        await run_rollouts(RolloutConfig(env_ids=["Chess-v0"], num_trajectories=3, max_turns=1, concurrency=1,
                                         seed=7, output_dir=fresh, order="arrival"), Recording(), chat, manager=m,
                           progress=False)
        recorded = json.loads((fresh / LENGTHS_NAME).read_text())["tasks"]
        assert sorted(recorded) == keys
        policy = Recording()
        await run_rollouts(RolloutConfig(env_ids=["Chess-v0"], num_trajectories=3, max_turns=1, concurrency=1,
                                         seed=7, output_dir=fresh, if_exists="append"), policy, chat, manager=m,
                           progress=False)
        assert policy.seen == sorted((v["seconds"] for v in recorded.values()), reverse=True)
    with pytest.raises(ConfigError, match="order="):
        RolloutConfig(env_ids=["Chess-v0"], order="shortest")


@pytest.mark.parametrize("content", ["{\"version\": 1, \"tasks\": {\"a\": {\"seconds\"", "[1, 2]",
                                     "{\"version\": 99, \"tasks\": {}}", "a,b\n1,2\n"])
async def test_a_corrupt_or_foreign_lengths_json_is_refused_before_the_run(chat, tmp_path, content):
    """A lengths.json in the output folder that is not a saved estimate (cut off, another program's file, a
    later version) is a clear ConfigError before anything runs, and is left as it was."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "lengths.json").write_text(content)
    config = RolloutConfig(env_ids=["Chess-v0"], num_trajectories=1, max_turns=1, seed=0, output_dir=out)
    policy = Recording()
    with pytest.raises(ConfigError, match="lengths.json is not a saved RolloutLengths"):
        await run_rollouts(config, policy, chat, progress=False)
    assert policy.seen == []
    assert (out / "lengths.json").read_text() == content
    assert not (out / "summary.json").exists()


async def test_overwrite_ignores_and_replaces_a_corrupt_lengths_json(chat, tmp_path, caplog):
    """``if_exists="replace"`` (CLI ``--overwrite``) replaces the folder's files: a lengths.json there that is not
    a saved estimate no longer blocks it; it is ignored with a warning and replaced by this run's estimate."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "lengths.json").write_text("{\"version\": 1, \"tasks\": {\"a\": {\"seconds\"")
    config = RolloutConfig(env_ids=["Chess-v0"], num_trajectories=2, max_turns=1, seed=0, output_dir=out,
                           if_exists="replace")
    async with ResourceManager() as m:
        result = await run_rollouts(config, RandomPolicy(seed=0), chat, manager=m, progress=False)
    assert len(result.trajectories) == 2
    assert (out / "summary.json").exists()
    assert sorted(RolloutLengths(path=out / "lengths.json").as_dict()["tasks"]) == [
        "agentfly/Chess-v0/seed=0", "agentfly/Chess-v0/seed=1"]
    assert "is not a saved RolloutLengths" in caplog.text
    assert "ignored" in caplog.text


async def test_a_lengths_file_that_cannot_be_written_loses_nothing_of_the_run(chat, tmp_path, caplog):
    """Saving the estimate fails (its folder is a file here): a warning, after the run's trajectories are saved;
    never an error that loses the run."""
    (tmp_path / "not-a-folder").write_text("")
    config = RolloutConfig(env_ids=["Chess-v0"], num_trajectories=2, max_turns=1, seed=0, output_dir=tmp_path / "run",
                           lengths=RolloutLengths(path=tmp_path / "not-a-folder" / "lengths.json"))
    async with ResourceManager() as m:
        result = await run_rollouts(config, RandomPolicy(seed=0), chat, manager=m, progress=False)
    assert len(result.trajectories) == 2
    assert (tmp_path / "run" / "summary.json").exists()
    assert "could not save the rollout-length estimate" in caplog.text


def test_saves_are_atomic_merges_that_survive_a_file_gone_bad(tmp_path, caplog):
    """Two processes (verl's agent-loop workers) keeping one file: each save merges (keys observed since the
    last save win, the others' keys stay); a file that went bad is replaced with a warning, not raised."""
    path = tmp_path / "lengths.json"
    a, b = RolloutLengths(path=path), RolloutLengths(path=path)
    a.observe("x", 10.0, 2)
    a.save()
    b.observe("y", 4.0, 1)
    b.save()
    assert b.predict("x") == 10.0  # b took in a's key
    a.observe("x", 20.0, 2)
    a.save()
    assert json.loads(path.read_text())["tasks"].keys() == {"x", "y"}
    assert RolloutLengths(path=path).predict("x") == 15.0
    path.write_text("{not json")
    a.observe("z", 1.0, 1)
    a.save()
    assert "not a saved RolloutLengths" in caplog.text
    assert RolloutLengths(path=path).predict("z") == 1.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lengths.json"]
    fresh = RolloutLengths().load(path)
    assert fresh.predict("x") == 15.0
    assert RolloutLengths().load(tmp_path / "absent.json").predict("x") is None


def test_cli_rollout_keeps_lengths_json_and_refuses_a_foreign_one(tmp_path, capsys):
    """``agentfly-gym rollout`` orders by prediction by default: its output folder gets lengths.json; a run into a
    folder whose lengths.json is not a saved estimate is refused (exit 2, a one-line reason, no traceback)."""
    from agentfly_gym.cli import main

    out = tmp_path / "run"
    argv = ["rollout", "--env", "Chess-v0", "--policy", "random", "-n", "2", "--max-turns", "1", "--no-progress",
            "--output-dir", str(out)]
    assert main(argv) == 0
    assert sorted(json.loads((out / "lengths.json").read_text())["tasks"]) == [
        "agentfly/Chess-v0/seed=0", "agentfly/Chess-v0/seed=1"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "lengths.json").write_text("[\"someone else's\"]")
    assert main(argv[:-1] + [str(other)]) == 2
    err = capsys.readouterr().err
    assert "lengths.json is not a saved RolloutLengths" in err
    assert "Traceback" not in err
    assert main(argv[:-1] + [str(other), "--overwrite"]) == 0      # --overwrite replaces it
    assert sorted(json.loads((other / "lengths.json").read_text())["tasks"]) == [
        "agentfly/Chess-v0/seed=0", "agentfly/Chess-v0/seed=1"]
    assert main(argv + ["--append", "--order", "arrival"]) == 0


def test_a_lengths_file_nested_too_deep_or_with_negative_seconds_is_refused_clearly(tmp_path):
    """A lengths.json of '[' * 200000 raised a bare RecursionError out of the CLI; negative or infinite seconds were
    merged into the estimate.  Both are now the ConfigError of a file that is not a saved estimate."""
    deep, negative = tmp_path / "deep.json", tmp_path / "negative.json"
    deep.write_text("[" * 200_000)
    negative.write_text(json.dumps({"version": RolloutLengths.VERSION,
                                    "tasks": {"a": {"seconds": -5.0, "turns": 1.0, "n": 1}}}))
    for path in (deep, negative):
        with pytest.raises(ConfigError, match="is not a saved RolloutLengths"):
            RolloutLengths().load(path)
