"""The verl plugin's start order: each agent-loop worker keeps the predicted rollout lengths across
training steps and starts the rollouts of a batch longest-predicted first, in chain and step mode.

Built as verl builds the agent loops (the plugin's YAML through hydra, verl's generated trainer config, rows
from verl's RLHFDataset over a data set written by ``build_dataset``) and run on real Chess puzzles; the batch
is started as verl's ``AgentLoopWorker.generate_sequences`` starts it (one task per row, all created at once).
The one stand-in, as in tests/test_verl_plugin.py: verl's GPU server manager, here a server that replies with
fixed text (``ScriptedServer``) and records which rollout asked first and under which acquisition priority.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import logging

import pytest

pytest.importorskip("verl.experimental.agent_loop.agent_loop")

from transformers import AutoTokenizer

from agentfly_gym.resources.priority import current_priority
from agentfly_gym.rollout.ordering import StartGate
from agentfly_gym_verl.runtime import aclose, get_runtime
from test_verl_plugin import ScriptedServer, _make_loop, _rows, _sampling, _trainer_config

ENV = "agentfly/Chess-v0"


class FirstCalls(ScriptedServer):
    """Records, for each rollout (request id), the acquisition priority its first generate call runs under, in the
    order the rollouts first asked."""

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer, ["Action: pass"])  # an unparsable move: the puzzle goes on to max_turns
        self.first: list[tuple[str, float | None]] = []

    async def generate(self, request_id, **kw):
        if not self.of(request_id):
            self.first.append((request_id, current_priority()))
        await asyncio.sleep(0.01)  # the others would run meanwhile, were they let in
        return await super().generate(request_id, **kw)


@pytest.fixture
def tok(tiny_qwen):
    return AutoTokenizer.from_pretrained(tiny_qwen)


@pytest.fixture
def puzzles(test_data) -> list[str]:
    with open(test_data / "chess" / "lichess_puzzles_sample.csv") as f:
        return [r["PuzzleId"] for r, _ in zip(csv.DictReader(f), range(4))]


@pytest.fixture
async def worker():
    """The worker's runtime is closed after the test (and before, as a new worker process starts clean)."""
    await aclose()
    yield
    await aclose()


async def _batch(loop_name: str, server, tok, cfg, rows, **options) -> list[str]:
    """Run ``rows`` as verl starts a batch; returns the task ids in the order their rollouts started."""
    loops = [_make_loop(loop_name, server, tok, cfg, max_turns=2, **options) for _ in rows]
    server.first.clear()
    outs = await asyncio.gather(*(asyncio.create_task(lp.run(_sampling(cfg), **row)) for lp, row in zip(loops, rows)))
    task_of = {}
    for o in outs:
        o = o[0] if isinstance(o, list) else o
        assert not o.extra_fields["error"], o.extra_fields["error"]
        task_of[o.extra_fields["trajectory_id"]] = o.extra_fields["task_id"]
    return [task_of[rid] for rid, _ in server.first]


@pytest.mark.parametrize("loop_name", ["agentfly_chain", "agentfly_step"])
async def test_a_worker_starts_longest_predicted_first_across_steps_and_keeps_the_estimate(
        tmp_path, tok, puzzles, worker, loop_name):
    cfg = _trainer_config(response_length=256)
    rows = _rows(tmp_path, tok, cfg, "Chess", puzzles, max_turns=2, env_kwargs={"mode": "puzzle"},
                 mode="step" if loop_name == "agentfly_step" else "chain")
    path = tmp_path / "lengths.json"  # what an earlier run left: three of the four tasks known
    known = {puzzles[0]: 1.0, puzzles[1]: 9.0, puzzles[2]: 5.0}
    path.write_text(json.dumps({"version": 1, "alpha": 0.5, "tasks": {
        f"{ENV}/{t}": {"seconds": s, "turns": 2.0, "n": 1} for t, s in known.items()}}))
    server = FirstCalls(tok)
    opts = dict(lengths_path=str(path), max_concurrent=1)

    # step 1: the rows arrive in data set order; they start longest-predicted first, the unknown one as the mean
    assert await _batch(loop_name, server, tok, cfg, rows, **opts) == [puzzles[1], puzzles[2], puzzles[3], puzzles[0]]
    assert [p for _, p in server.first] == [9.0, 5.0, 5.0, 1.0]  # each rollout's acquisitions carry it
    saved = json.loads(path.read_text())["tasks"]  # written at the end of the batch, learned from it
    assert {k: v["n"] for k, v in saved.items()} == {f"{ENV}/{t}": 2 if t in known else 1 for t in puzzles}
    lengths = get_runtime().lengths[str(path)]
    assert all(lengths.predict(f"{ENV}/{t}") == pytest.approx(saved[f"{ENV}/{t}"]["seconds"]) for t in puzzles)

    # step 2 (same worker): the order follows what the worker has learned since
    expect = sorted(puzzles, key=lambda t: -lengths.predict(f"{ENV}/{t}"))
    assert await _batch(loop_name, server, tok, cfg, rows[::-1], **opts) == expect

    # a resumed training (a new worker) reads the file; order: arrival turns the ordering off
    await aclose()
    now = json.loads(path.read_text())["tasks"]
    assert all(v["n"] == (3 if k.split("/")[-1] in known else 2) for k, v in now.items())
    assert get_runtime().ordering(str(path), 1)[0].predict(f"{ENV}/{puzzles[1]}") == now[f"{ENV}/{puzzles[1]}"]["seconds"]
    assert await _batch(loop_name, server, tok, cfg, rows, order="arrival", **opts) == puzzles
    assert [p for _, p in server.first] == [None] * 4


async def test_a_bad_lengths_file_is_a_warning_and_a_fresh_start(tmp_path, tok, puzzles, worker, caplog,
                                                                 monkeypatch):
    """A lengths_path that holds something else (cut off, another program's file) never fails a rollout: a
    warning, a fresh estimate, and a good file at the end of the batch; without a cap the batch still starts
    longest-predicted first (the gate lets them in by priority) and each rollout's acquisitions carry it.

    Without a cap both rollouts run at once, so which asks the server first depends on how long each reset
    took (CI once saw the shorter one first under load): the start order is read where the gate lets each in."""
    admitted: list[float | None] = []
    real_admit = StartGate.admit

    @contextlib.asynccontextmanager
    async def admit(self, priority=None):
        async with real_admit(self, priority):
            admitted.append(priority)
            yield

    monkeypatch.setattr(StartGate, "admit", admit)
    cfg = _trainer_config(response_length=256)
    rows = _rows(tmp_path, tok, cfg, "Chess", puzzles[:2], max_turns=2, env_kwargs={"mode": "puzzle"})
    path = tmp_path / "lengths.json"
    path.write_text('{"version": 1, "tasks": {"x": ')
    server = FirstCalls(tok)
    with caplog.at_level(logging.WARNING):
        assert sorted(await _batch("agentfly_chain", server, tok, cfg, rows, lengths_path=str(path))) == \
            sorted(puzzles[:2])
    assert admitted == [None, None]  # nothing known yet: arrival order
    assert "is not a saved RolloutLengths" in caplog.text
    assert "fresh estimate" in caplog.text
    assert sorted(json.loads(path.read_text())["tasks"]) == sorted(f"{ENV}/{t}" for t in puzzles[:2])
    lengths = get_runtime().lengths[str(path)]
    lengths.observe(f"{ENV}/{puzzles[0]}", 50.0)  # make the second row the longer one
    lengths.observe(f"{ENV}/{puzzles[0]}", 50.0)
    lengths.observe(f"{ENV}/{puzzles[0]}", 50.0)
    longer, shorter = (lengths.priority(f"{ENV}/{t}") for t in puzzles[:2])
    assert longer > shorter
    admitted.clear()
    assert sorted(await _batch("agentfly_chain", server, tok, cfg, rows[::-1], lengths_path=str(path))) == \
        sorted(puzzles[:2])
    assert admitted == [longer, shorter]  # the row that arrived second is let in first
    assert sorted(p for _, p in server.first) == [shorter, longer]  # each rollout's acquisitions carry its own
    with pytest.raises(Exception, match="order="):
        _make_loop("agentfly_chain", server, tok, cfg, order="random")
