"""``agentfly-gym eval`` and its library (:mod:`agentfly_gym.eval`).

Real parts: a real tool environment (``tests/evaltools.py``, made with ``make_tool_env``), the env's scripted
expert and the random policy, the real command line; the endpoint runs go through the official ``openai``
client to the fault-injecting stub of ``tests/test_endpoint_policy.py`` (a 5xx is a fault no real server gives
on demand) and, in the slow test, to a real ``transformers serve`` running the bundled SmolLM2 on the CPU.
pass@k is checked against values computed by hand from its definition ``1 - C(n-c, k) / C(n, k)``.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction

import evaltools
import pytest
from test_endpoint_policy import SECRET, Stub, _tool_answer

from agentfly_gym.cli import main
from agentfly_gym.errors import ConfigError
from agentfly_gym.eval import bootstrap_ci, parse_tasks, pass_at_k, plan_tasks

ENV = "evaltools:make_env"


# ----------------------------------------------------------------------------- pass@k and intervals
@pytest.mark.parametrize("n,c,k,expected", [
    (1, 0, 1, 0.0), (1, 1, 1, 1.0),
    (5, 0, 1, 0.0), (5, 0, 5, 0.0),            # c = 0: never
    (5, 1, 1, 0.2), (5, 1, 2, 0.4),            # 1 - C(4,2)/C(5,2) = 1 - 6/10
    (5, 2, 2, 0.7),                            # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (5, 1, 5, 1.0), (5, 3, 5, 1.0),            # k = n with a success: every draw holds it
    (4, 2, 2, 5 / 6),                          # 1 - C(2,2)/C(4,2) = 1 - 1/6
    (10, 3, 4, 1 - 35 / 210),                  # 1 - C(7,4)/C(10,4)
    (4, 2, 3, 1.0),                            # n - c < k
])
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_is_stable_where_binomials_overflow_a_float():
    n, c, k = 2000, 3, 500
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert math.comb(n, k) > 10**400
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)


@pytest.mark.parametrize("n,c,k", [(3, 4, 1), (3, 1, 0), (3, 1, 4), (2.0, 1, 1), (True, 1, 1), (3, -1, 1)])
def test_pass_at_k_refuses_bad_counts(n, c, k):
    with pytest.raises(ConfigError):
        pass_at_k(n, c, k)


def test_bootstrap_interval():
    assert bootstrap_ci([0.5, 0.5, 0.5]) == (0.5, 0.5)
    lo, hi = bootstrap_ci([0.0, 1.0] * 20)
    assert lo < 0.5 < hi
    assert 0.25 < lo
    assert hi < 0.75
    assert bootstrap_ci([0.0, 1.0, 1.0], seed=3) == bootstrap_ci([0.0, 1.0, 1.0], seed=3)  # seeded
    assert all(math.isnan(x) for x in bootstrap_ci([]))
    with pytest.raises(ConfigError, match="confidence"):
        bootstrap_ci([1.0], confidence=1.5)


# ----------------------------------------------------------------------------- task choice
def test_parse_and_plan_tasks():
    assert parse_tasks("all") == "all"
    assert parse_tasks("3") == 3
    assert parse_tasks("a, b,a") == ["a", "b"]
    with pytest.raises(ConfigError):
        parse_tasks("0")
    env = evaltools.make_env()
    assert plan_tasks(env, "all").tasks == ["right", "wrong", "half", "broken"]
    assert plan_tasks(env, 2).tasks == ["right", "wrong"]  # the first N, never drawn with replacement
    assert plan_tasks(env, 9).tasks == ["right", "wrong", "half", "broken"]
    assert plan_tasks(env, "half,right").tasks == ["half", "right"]
    with pytest.raises(ConfigError, match="no task \\['nope'\\]"):
        plan_tasks(env, "nope")


# ----------------------------------------------------------------------------- scoring and resuming (library)
def _traj(task, j, *, success=False, reward=0.0, error=None):
    from agentfly_gym.rollout.trajectory import Trajectory

    return Trajectory(trajectory_id=f"{task}/{j}", group_id=task, env_id="e", task_id=task, seed=j, mode="chain",
                      prompt_ids=[], success=success, reward=reward, error=error, status="error" if error else "")


def test_summarize_scores_each_task_alike_and_counts_errors_apart():
    from agentfly_gym.eval.results import summarize_eval

    samples = {"e": {"a": [_traj("a", j, success=j < 1, reward=1.0 if j < 1 else 0.25) for j in range(3)],
                     "b": [_traj("b", 0), _traj("b", 1, error="EndpointError: HTTP 500"), _traj("b", 2)]}}
    r = summarize_eval(samples, 3)
    a, b = r["envs"]["e"]["per_task"]["a"], r["envs"]["e"]["per_task"]["b"]
    assert (a["n"], a["c"], a["errors"]) == (3, 1, 0)
    assert (b["n"], b["c"], b["errors"]) == (2, 0, 1)
    assert a["pass@1"] == pytest.approx(1 / 3)
    assert a["pass@2"] == pytest.approx(2 / 3)
    assert a["pass@3"] == 1.0
    assert "pass@3" not in b
    assert b["mean_reward"] == 0.0
    assert r["pass@1"] == pytest.approx((1 / 3 + 0) / 2)
    assert r["pass@3"] == 1.0
    assert r["overall"]["tasks_scored@3"] == 1
    assert r["overall"]["errors"] == 1
    assert r["envs"]["e"]["mean_reward"] == pytest.approx(((1 + 0.25 + 0.25) / 3 + 0) / 2)
    json.dumps(r, allow_nan=False)  # strict JSON


async def test_resume_plays_only_what_is_missing(tmp_path):
    from agentfly_gym.eval import EvalConfig, arun_eval
    from agentfly_gym.rollout.policies.factory import make_policy

    policy, chat = make_policy("expert")
    config = EvalConfig(plans=[plan_tasks(evaltools.make_env(), "right,broken")], k=2, model="expert",
                        output_dir=tmp_path)
    evaltools.PLAYS.clear()
    first = await arun_eval(config, policy, chat, progress=False)
    assert first.played == 4
    assert dict(evaltools.PLAYS) == {"right": 2, "broken": 2}
    evaltools.PLAYS.clear()
    again = await arun_eval(config, policy, chat, progress=False)  # the errors only
    assert again.played == 2
    assert dict(evaltools.PLAYS) == {"broken": 2}
    assert again.results["envs"][evaltools.ENV_ID]["per_task"]["right"]["c"] == 2
    from agentfly_gym.rollout.outputs import OutputBusyError, folder_lock

    with folder_lock(tmp_path), pytest.raises(OutputBusyError, match="being written by process"):
        await arun_eval(config, policy, chat, progress=False)  # a second writer of the folder is refused


def test_a_k_past_the_sample_limit_is_refused_before_anything_is_built():
    from agentfly_gym.eval import EvalConfig
    from agentfly_gym.eval.run import MAX_SAMPLES

    plan = plan_tasks(evaltools.make_env(), "all")  # 4 tasks
    with pytest.raises(ConfigError, match=f"k=1000000000 with 4 task\\(s\\).*at most {MAX_SAMPLES}"):
        EvalConfig(plans=[plan], k=10**9)
    assert EvalConfig(plans=[plan], k=MAX_SAMPLES // 4).k == MAX_SAMPLES // 4


async def test_resume_skips_corrupted_progress_lines_and_plays_only_those_samples(tmp_path, caplog):
    from agentfly_gym.eval import EvalConfig, arun_eval
    from agentfly_gym.rollout.policies.factory import make_policy

    policy, chat = make_policy("expert")
    config = EvalConfig(plans=[plan_tasks(evaltools.make_env(), "right")], k=2, model="expert", output_dir=tmp_path)
    await arun_eval(config, policy, chat, progress=False)
    lines = (tmp_path / "progress.jsonl").read_bytes().splitlines(keepends=True)
    good = {json.loads(x)["sample"]: x for x in lines}
    bad_reward = json.loads(good[0])
    bad_reward["trajectory"]["reward"] = "lots"
    # sample 0: its good line, then corrupted ones (which are skipped); sample 1: only corrupted lines
    (tmp_path / "progress.jsonl").write_bytes(
        good[0] + b"\xff\xfe not UTF-8 \x80\n" + (json.dumps(bad_reward) + "\n").encode() + b"[1, 2]\n"
        + b'{"env_id": "x"}\n' + good[1][: len(good[1]) // 2] + b"\n")
    evaltools.PLAYS.clear()
    again = await arun_eval(config, policy, chat, progress=False)
    assert again.played == 1
    assert dict(evaltools.PLAYS) == {"right": 1}
    assert again.results["envs"][evaltools.ENV_ID]["per_task"]["right"]["c"] == 2
    assert "line 2 is not a finished sample" in caplog.text
    assert "reward='lots'" in caplog.text


async def test_a_folder_holding_another_commands_run_is_refused_and_left_alone(tmp_path):
    from agentfly_gym.eval import EvalConfig, arun_eval
    from agentfly_gym.rollout.policies.factory import make_policy

    (tmp_path / "trajectories.parquet").write_bytes(b"a rollout's trajectories")
    (tmp_path / "summary.json").write_text("{}")
    policy, chat = make_policy("expert")
    config = EvalConfig(plans=[plan_tasks(evaltools.make_env(), "right")], k=1, model="expert", output_dir=tmp_path)
    with pytest.raises(ConfigError, match="another command's run"):
        await arun_eval(config, policy, chat, progress=False)
    assert (tmp_path / "trajectories.parquet").read_bytes() == b"a rollout's trajectories"
    assert not (tmp_path / "eval.json").exists()


# ----------------------------------------------------------------------------- the command
def _results(out):
    return json.loads((out / "results.json").read_text())


@pytest.mark.slow
def test_eval_expert_k4_scores_errors_apart_and_resumes(tmp_path, capsys):
    """The command end to end, four runs into one folder (~15 s under load): scores, files, resume after errors,
    a torn last line and a larger k, and a refusal of other settings."""
    out = tmp_path / "ev"
    evaltools.PLAYS.clear()
    argv = ["eval", "--env", ENV, "--model", "expert", "-k", "4", "--output-dir", str(out), "--no-progress",
            "--max-concurrency", "4"]
    assert main(argv) == 0
    r = _results(out)
    per = r["envs"][evaltools.ENV_ID]["per_task"]
    assert {t: (x["n"], x["c"], x["errors"]) for t, x in per.items()} == \
        {"right": (4, 4, 0), "wrong": (4, 0, 0), "half": (4, 2, 0), "broken": (0, 0, 4)}
    assert per["half"]["pass@2"] == pytest.approx(5 / 6)
    assert per["half"]["pass@4"] == 1.0
    assert "pass@1" not in per["broken"]
    assert per["broken"]["mean_reward"] is None
    # each scored task weighs the same: pass@2 = (1 + 0 + 5/6) / 3
    assert r["pass@2"] == pytest.approx((1 + 0 + 5 / 6) / 3)
    assert r["pass@1"] == pytest.approx(0.5)
    env = r["envs"][evaltools.ENV_ID]
    assert env["errors"] == 4
    assert env["scored_samples"] == 12
    assert env["mean_reward"] == pytest.approx(0.5)
    assert env["success_ci"][0] <= 0.5 <= env["success_ci"][1]
    assert dict(evaltools.PLAYS) == {"right": 4, "wrong": 4, "half": 4, "broken": 4}  # each task exactly k times
    for name in ("trajectories.parquet", "trajectories.jsonl", "report.md", "pass_at_k.png", "eval.json"):
        assert (out / name).exists(), name
    assert "pass@4" in (out / "report.md").read_text()
    from agentfly_gym.rollout.trajectory import load_trajectories

    assert len(load_trajectories(out / "trajectories.parquet")) == 16
    assert "pass@4" in capsys.readouterr().out

    # the same command again plays only what is missing: the samples that ended in an error
    evaltools.PLAYS.clear()
    assert main(argv) == 0
    assert dict(evaltools.PLAYS) == {"broken": 4}
    assert _results(out)["played_now"] == 4
    # a torn last line (a crash mid-write) and a bigger k: only the new samples and the torn one are played
    with open(out / "progress.jsonl", "a") as f:
        f.write('{"env_id": "evaltest/Arith-v0", "task": "rig')
    evaltools.PLAYS.clear()
    assert main([*argv[:6], "5", *argv[7:]]) == 0
    assert dict(evaltools.PLAYS) == {"right": 1, "wrong": 1, "half": 1, "broken": 5}
    # other settings into the same folder are refused, naming what differs
    assert main([*argv, "--max-turns", "2"]) == 2
    assert "max_turns" in capsys.readouterr().err


def test_random_policy_on_a_tool_env_makes_valid_calls(tmp_path):
    out = tmp_path / "rnd"
    assert main(["eval", "--env", ENV, "--model", "random", "-k", "2", "--tasks", "right,wrong", "--output-dir",
                 str(out), "--no-progress"]) == 0
    from agentfly_gym.rollout.trajectory import load_trajectories

    trajs = load_trajectories(out / "trajectories.parquet")
    assert len(trajs) == 4
    assert not any(t.error for t in trajs)
    replies = [turn.reply for t in trajs for turn in t.turns]
    assert all(r == "I do not know the answer." or r.startswith("<tool_call>") for r in replies)
    observations = [turn.observation for t in trajs for turn in t.turns if turn.reply.startswith("<tool_call>")]
    assert all(o == "0" for o in observations)  # add(0, 0): a valid call, run by the tool


@pytest.mark.slow
def test_eval_through_an_endpoint_keeps_the_key_out_of_every_file(tmp_path, monkeypatch, caplog):
    """Two eval runs through the stub endpoint (~7 s under load); the key's absence from logs is also checked
    fast in tests/test_endpoint_policy.py."""
    import logging

    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("EVAL_TEST_KEY", SECRET)
    stub = Stub(_tool_answer)
    out = tmp_path / "ep"
    try:
        code = main(["-vv", "eval", "--env", ENV, "--model", "openai:m", "--base-url", stub.base_url, "--api-key-env",
                     "EVAL_TEST_KEY", "-k", "2", "--tasks", "right,wrong", "--output-dir", str(out), "--no-progress"])
        assert code == 0
        r = _results(out)
        assert r["text_only"]
        assert r["envs"][evaltools.ENV_ID]["per_task"]["right"]["c"] == 2
        assert r["envs"][evaltools.ENV_ID]["per_task"]["wrong"]["c"] == 0  # add(2, 3) = 5, not 8
        assert r["settings"]["model"] == "openai:m"
        for path in out.rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), path
        assert SECRET not in caplog.text
        # the endpoint fails: every sample is an infrastructure error, counted apart, and the run says so
        stub.plan = ["500"] * 100
        bad = tmp_path / "bad"
        code = main(["eval", "--env", ENV, "--model", "openai:m", "--base-url", stub.base_url, "--api-key-env",
                     "EVAL_TEST_KEY", "--tasks", "right", "--max-retries", "0", "--output-dir", str(bad),
                     "--no-progress"])
    finally:
        stub.close()
    assert code == 1
    r = _results(bad)
    assert r["overall"]["errors"] == 1
    assert r["overall"]["scored_samples"] == 0
    assert r["pass@1"] is None


@pytest.mark.slow
def test_eval_on_a_real_transformers_serve_endpoint(tmp_path):
    """The bundled SmolLM2 behind a real ``transformers serve`` (started as the library's model-service resource,
    CPU), asked through the official ``openai`` client by ``agentfly-gym eval --model openai:...``: two tasks,
    two samples each, every one scored (no infrastructure error), text-only."""
    from agentfly_gym.resources import ModelServiceSpec, ResourceManager
    from agentfly_gym.rollout.models import smollm2_dir
    from agentfly_gym.utils.aio import run_sync

    model = str(smollm2_dir())
    manager = ResourceManager()
    try:
        svc = run_sync(manager.acquire_global(ModelServiceSpec(engine="transformers", model=model,
                                                               start_timeout=600)))
        out = tmp_path / "real"
        assert main(["eval", "--env", ENV, "--model", f"openai:{model}", "--base-url", svc.base_url, "-k", "2",
                     "--tasks", "right,wrong", "--max-tokens", "24", "--max-turns", "2", "--output-dir", str(out),
                     "--no-progress", "--request-timeout", "300"]) == 0
    finally:
        run_sync(manager.aclose())
    r = _results(out)
    assert r["overall"]["errors"] == 0
    assert r["overall"]["scored_samples"] == 4
    assert r["text_only"]
    assert r["pass@1"] is not None
    assert r["pass@2"] is not None


def test_rollout_shares_tasks_split_and_endpoints(tmp_path, monkeypatch, capsys):
    from agentfly_gym.rollout.trajectory import load_trajectories

    out = tmp_path / "ro"
    # --tasks: group i plays task i; 4 trajectories over 4 tasks play each once (never drawn with replacement)
    assert main(["rollout", "--env", ENV, "--policy", "random", "-n", "4", "--tasks", "all", "--output-dir", str(out),
                 "--no-progress"]) == 0
    assert sorted(t.task_id for t in load_trajectories(out / "trajectories.parquet")) == \
        ["broken", "half", "right", "wrong"]
    # refused at parse time, with the reason
    assert main(["rollout", "--env", ENV, "--policy", "random", "--split", "test", "--no-progress"]) == 2
    assert "no task splits" in capsys.readouterr().err
    assert main(["rollout", "--env", ENV, "--policy", "openai:m", "--mode", "step", "--no-progress"]) == 2
    assert "chain only" in capsys.readouterr().err
    monkeypatch.setenv("EVAL_TEST_KEY", SECRET)
    stub = Stub(_tool_answer)
    try:
        ep = tmp_path / "ep"
        assert main(["rollout", "--env", ENV, "--policy", "openai:m", "--base-url", stub.base_url, "--api-key-env",
                     "EVAL_TEST_KEY", "-n", "2", "--tasks", "right", "--output-dir", str(ep), "--no-progress"]) == 0
    finally:
        stub.close()
    trajs = load_trajectories(ep / "trajectories.parquet")
    assert [t.success for t in trajs] == [True, True]
    assert all(t.text_only for t in trajs)
