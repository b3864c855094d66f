"""The saved record: schema versions, per-row status, and what the loaders accept.

Episodes are real (Chess puzzles, in process, the puzzle's own solution as the expert) with the
Qwen3 tokenizer's chat template; files are written and read with pyarrow and json.
"""

from __future__ import annotations

import json

import gymnasium
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

import agentfly_gym  # noqa: F401
from agentfly_gym.resources import ResourceManager
from agentfly_gym.rollout import ExpertPolicy, load_trajectories, run_chain_episode
from agentfly_gym.rollout.chat import ChatTokenizer
from agentfly_gym.rollout.step import fit_step_prompt, load_step_rows, run_step_episode, save_step_rows
from agentfly_gym.rollout.trajectory import (SCHEMA_VERSION, SchemaVersionError, Trajectory, read_schema_version,
                                             save_trajectories)

PUZZLE = "tewjc"


class NoMove:
    """Answers with something that is not a move: the puzzle goes on (a legal wrong move would end it)."""

    async def act(self, observation, info, env) -> str:
        return "resign"


@pytest.fixture(scope="module")
def chat(test_data):
    return ChatTokenizer(AutoTokenizer.from_pretrained(test_data / "tokenizers" / "qwen3"))


async def _episodes(chat) -> dict[str, Trajectory]:
    """One episode per way of ending: solved, out of turns, out of tokens, an env that faults, step mode."""
    out = {}
    async with ResourceManager() as m:
        def env():
            return gymnasium.make("agentfly/Chess-v0", manager=m, mode="puzzle").unwrapped

        opts = {"task_id": PUZZLE}
        for name, policy, kw in (("solved", ExpertPolicy(), {}), ("turns", NoMove(), {"max_turns": 1}),
                                 ("tokens", ExpertPolicy(), {"max_context_tokens": 1})):
            e = env()
            out[name] = await run_chain_episode(e, policy, chat, options=opts, trajectory_id=name, **kw)
            await e.aclose()
        e = env()
        out["step"] = await run_step_episode(e, ExpertPolicy(), chat, options=opts, trajectory_id="step")
        await e.aclose()
    out["fault"] = Trajectory(trajectory_id="fault", group_id="g", env_id="agentfly/Chess-v0", task_id="", seed=0,
                              mode="chain", prompt_ids=[], error="ResourceStartError: did not start", status="error")
    return out


async def test_status_and_versions_round_trip(tmp_path, chat):
    trajs = await _episodes(chat)
    status = {k: t.status for k, t in trajs.items()}
    assert status == {"solved": "complete", "turns": "truncated", "tokens": "token_budget", "step": "complete",
                      "fault": "error"}
    paths = save_trajectories(list(trajs.values()), tmp_path)
    steps = save_step_rows([trajs["step"]], tmp_path)["steps"]
    for p in (paths["parquet"], paths["jsonl"], steps):
        assert read_schema_version(p) == SCHEMA_VERSION == 5
    assert pq.read_schema(paths["parquet"]).metadata[b"agentfly_gym.schema_version"] == b"5"
    head = json.loads(paths["jsonl"].read_text().splitlines()[0])
    assert head == {"agentfly_gym_schema": "trajectories", "schema_version": 5}
    played = [t.scope_id for k, t in trajs.items() if k != "fault"]
    assert all(s.startswith("Chess-") for s in played), played  # the env's episode (rollout scope) id
    assert len(set(played)) == len(played)
    for p in (paths["parquet"], paths["jsonl"]):
        back = load_trajectories(p)
        assert [b.status for b in back] == list(status.values())
        assert [b.response_ids for b in back] == [t.response_ids for t in trajs.values()]
        for field in ("reply_truncated", "context_cut", "reward_error", "scope_id"):  # versions 3 and 4
            assert [getattr(b, field) for b in back] == [getattr(t, field) for t in trajs.values()]
    rows = load_step_rows(steps)
    assert len(rows) == len(trajs["step"].steps) >= 1
    assert {r["status"] for r in rows} == {"complete"}
    assert [r["response_ids"] for r in rows] == [s.response_ids for s in trajs["step"].steps]


async def test_unknown_versions_are_refused_and_version_1_is_read(tmp_path, chat):
    trajs = list((await _episodes(chat)).values())
    paths = save_trajectories(trajs, tmp_path / "v2")
    # version 1: the same files as written before versions were recorded (no metadata, no header, no status)
    v1 = tmp_path / "v1"
    v1.mkdir()
    table = pq.read_table(paths["parquet"])
    table = table.drop_columns(["status"]).replace_schema_metadata(None)
    pq.write_table(table, v1 / "trajectories.parquet")
    lines = paths["jsonl"].read_text().splitlines()[1:]
    (v1 / "trajectories.jsonl").write_text("\n".join(json.dumps({k: v for k, v in json.loads(x).items()
                                                                 if k != "status"}) for x in lines) + "\n")
    for p in (v1 / "trajectories.parquet", v1 / "trajectories.jsonl"):
        assert read_schema_version(p) == 1
        assert [t.status for t in load_trajectories(p)] == ["", "", "", "", ""]          # as stored ...
        from agentfly_gym.rollout.trajectory import episode_status

        assert [episode_status(t) for t in load_trajectories(p)] == \
            ["complete", "truncated", "truncated", "complete", "error"]                 # ... and as derived
    # a version this code does not know: refused, by name
    v9 = tmp_path / "v9"
    v9.mkdir()
    pq.write_table(pq.read_table(paths["parquet"]).replace_schema_metadata({b"agentfly_gym.schema_version": b"9"}),
                   v9 / "trajectories.parquet")
    (v9 / "trajectories.jsonl").write_text(json.dumps({"agentfly_gym_schema": "trajectories", "schema_version": 9})
                                           + "\n" + "\n".join(lines) + "\n")
    for p in (v9 / "trajectories.parquet", v9 / "trajectories.jsonl"):
        with pytest.raises(SchemaVersionError, match=r"schema version 9 .*versions \[1, 2, 3, 4, 5\]"):
            load_trajectories(p)
    steps = save_step_rows([trajs[3]], tmp_path / "s")["steps"]
    t = pq.read_table(steps)
    pq.write_table(t.replace_schema_metadata({**t.schema.metadata, b"agentfly_gym.schema_version": b"9"}), steps)
    with pytest.raises(SchemaVersionError, match="schema version 9"):
        load_step_rows(steps)


def test_long_step_prompts_keep_the_system_prompt(chat):
    """Over the budget, the OLDEST history goes first, then the task text after the system part; never the
    system prompt, never the current observation."""
    env = gymnasium.make("agentfly/Chess-v0", mode="puzzle").unwrapped
    env._closed = True  # nothing acquired
    past = [(f"a{i}a{i}", f"observation {i} " + "x " * 40) for i in range(4)]
    current = "the current board " + "y " * 10
    TASK = "task text " * 100
    full_msgs, full, shown, cut = fit_step_prompt(chat, env, TASK, past, current, 4, 3, None)
    assert shown == 3
    assert cut == 0
    system_ids = chat.tokenizer.apply_chat_template(full_msgs[:1], tokenize=True, return_dict=False)
    # one pair too many: the oldest shown pair (step 2's) is dropped, the newest two stay
    _, two, _, _ = fit_step_prompt(chat, env, TASK, past, current, 4, 2, None)
    msgs, ids, shown, cut = fit_step_prompt(chat, env, TASK, past, current, 4, 3, len(two))
    assert (shown, cut, ids) == (2, 0, two)
    text = chat.tokenizer.decode(ids)
    assert "observation 3" in text
    assert "observation 2" in text
    assert "observation 1" not in text
    # smaller than any history: no history, then the task text is cut after the system part
    budget = len(system_ids) + 80
    msgs, ids, shown, cut = fit_step_prompt(chat, env, TASK, past, current, 4, 3, budget)
    assert shown == 0
    assert len(ids) == budget
    assert cut > 0
    assert ids[:len(system_ids)] == system_ids                       # the system prompt, whole
    generation_prompt = chat.tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    assert ids[-len(generation_prompt):] == generation_prompt
    assert "current board " + "y " * 9 in chat.tokenizer.decode(ids)
    with pytest.raises(ValueError, match="max_prompt_tokens=1"):
        fit_step_prompt(chat, env, "t", past, current, 4, 3, 1)


async def test_version_2_files_read_with_the_version_3_defaults(tmp_path, chat):
    """A file written before version 3 (no reply_truncated / context_cut / reward_error columns) loads
    with reply_truncated False, context_cut 0 and reward_error None; step rows with reply_truncated False."""
    trajs = await _episodes(chat)
    paths = save_trajectories(list(trajs.values()), tmp_path)
    new = ["reply_truncated", "context_cut", "reward_error"]
    table = pq.read_table(paths["parquet"]).drop_columns(new)
    pq.write_table(table.replace_schema_metadata({b"agentfly_gym.schema_version": b"2"}), tmp_path / "v2.parquet")
    back = load_trajectories(tmp_path / "v2.parquet")
    assert [(b.reply_truncated, b.context_cut, b.reward_error) for b in back] == [(False, 0, None)] * len(trajs)
    steps = save_step_rows([trajs["step"]], tmp_path / "s")["steps"]
    t = pq.read_table(steps).drop_columns(["reply_truncated"])
    pq.write_table(t.replace_schema_metadata({**t.schema.metadata, b"agentfly_gym.schema_version": b"2"}), steps)
    assert {r["reply_truncated"] for r in load_step_rows(steps)} == {False}


async def test_version_3_files_read_with_an_empty_scope_id(tmp_path, chat):
    """A file written before version 4 (no scope_id column / key) loads with scope_id ""."""
    trajs = await _episodes(chat)
    paths = save_trajectories(list(trajs.values()), tmp_path)
    table = pq.read_table(paths["parquet"]).drop_columns(["scope_id"])
    pq.write_table(table.replace_schema_metadata({b"agentfly_gym.schema_version": b"3"}), tmp_path / "v3.parquet")
    lines = paths["jsonl"].read_text().splitlines()[1:]
    (tmp_path / "v3.jsonl").write_text(
        json.dumps({"agentfly_gym_schema": "trajectories", "schema_version": 3}) + "\n"
        + "\n".join(json.dumps({k: v for k, v in json.loads(x).items() if k != "scope_id"}) for x in lines) + "\n")
    for p in (tmp_path / "v3.parquet", tmp_path / "v3.jsonl"):
        assert read_schema_version(p) == 3
        back = load_trajectories(p)
        assert [b.scope_id for b in back] == [""] * len(trajs)
        assert [b.response_ids for b in back] == [t.response_ids for t in trajs.values()]
