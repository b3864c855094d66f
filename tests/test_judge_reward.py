"""Episode rewards from configuration (agentfly_gym/rewards/configured.py): ``--reward judge:...``.

Real components throughout: the judge is the bundled SmolLM2 behind a real ``transformers serve``
process (started by the resource manager from the spec string), or a real local HTTP server
(Python's http.server on 127.0.0.1) that answers slowly and fails on purpose, to check the
concurrency bound and the retries; rollouts are real Chess episodes driven by the random policy.
"""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest
from verltools import trainer_config

from agentfly_gym.cli import main
from agentfly_gym.errors import ConfigError
from agentfly_gym.resources import ModelAPISpec, ModelServiceSpec, ResourceManager
from agentfly_gym.rewards import parse_score
from agentfly_gym.rewards.configured import FunctionReward, JudgeReward, parse_reward, transcript
from agentfly_gym.rollout.policies.factory import make_policy
from agentfly_gym.rollout.runner import RolloutConfig, run_rollouts

CHESS = ["--env", "Chess-v0", "--policy", "random", "--tokenizer", "smollm2", "--max-turns", "2", "--no-progress"]


def constant_reward(trajectory) -> float:
    """A custom reward for the MODULE:FUNCTION form: 0.25 per turn."""
    return 0.25 * len(trajectory.turns)


def test_parse_specs_and_clear_errors():
    r = parse_reward("judge:base_url=http://127.0.0.1:9/v1,model=m,api_key_env=JUDGE_KEY,concurrency=3,retries=5,"
                     "combine=add,weight=0.5")
    assert isinstance(r, JudgeReward)
    assert r.combine == "add"
    assert r.weight == 0.5
    assert r.api == ModelAPISpec(base_url="http://127.0.0.1:9/v1", model="m", api_key_env="JUDGE_KEY",
                                 max_instances=3, max_retries=5, request_timeout=120.0)
    r = parse_reward('judge:{"serve": "transformers", "model": "/models/x", "concurrency": 2}')
    assert r.service == ModelServiceSpec(engine="transformers", model="/models/x", start_timeout=600.0)
    assert r.api is None
    assert r.concurrency == 2
    f = parse_reward("test_judge_reward:constant_reward")
    assert isinstance(f, FunctionReward)
    assert f.fn is constant_reward
    assert parse_reward(None) is None
    bad = {
        "judge:model=m": "needs base_url",
        "judge:base_url=http://h/v1": "needs model",
        "judge:base_url=http://h/v1,model=m,temperature=1": r"unknown keys \['temperature'\]",
        "judge:base_url=http://h/v1,model=m,concurrency=many": "concurrency='many' is not an integer",
        "judge:base_url=http://h/v1,model=m,concurrency=0": "concurrency=0 must be an integer >= 1",
        "judge:base_url=ftp://h,model=m": "must start with http",
        "judge:serve=transformers,base_url=http://h/v1,model=m": "not both",
        "judge:serve=sglang,model=m": "engine='sglang'",
        "judge:base_url=http://h/v1,model=m,combine=max": "combine='max'",
        "judge:model": "not KEY=VALUE",
        "judge:{not json": "does not parse",
        "no_such_module_xyz:f": "cannot import",
        "just-a-word": "MODULE:FUNCTION",
    }
    for spec, msg in bad.items():
        with pytest.raises(ConfigError, match=msg):
            parse_reward(spec)
    with pytest.raises(ConfigError, match="unknown keys"):  # the CLI checks before any model is loaded
        RolloutConfig(env_ids=["Chess"], reward="judge:base_url=http://h/v1,model=m,colour=red")


class _SlowJudge(http.server.BaseHTTPRequestHandler):
    """A chat-completions endpoint: answers '[[6]]' after 0.3 s; the first ``fail`` requests get 503."""

    lock = threading.Lock()
    in_flight = max_in_flight = requests = 0
    fail = 0
    prompts: list[str] = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        cls = type(self)
        with cls.lock:
            cls.requests += 1
            cls.in_flight += 1
            cls.max_in_flight = max(cls.max_in_flight, cls.in_flight)
            failing = cls.fail > 0
            cls.fail -= 1
            cls.prompts.append(body["messages"][0]["content"])
        time.sleep(0.3)  # a slow judge: the requests in flight at once are what the tests count
        with cls.lock:
            cls.in_flight -= 1
        code = 503 if failing else 200
        out = {"choices": [{"message": {"content": "Reasonable moves. [[6]]"}}]} if code == 200 else {"error": "busy"}
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(out).encode())

    def log_message(self, *a):
        pass


@pytest.fixture()
def slow_judge():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowJudge)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    _SlowJudge.in_flight = _SlowJudge.max_in_flight = _SlowJudge.requests = 0
    _SlowJudge.prompts = []
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


@pytest.mark.slow
async def test_judge_api_concurrency_bound_retries_and_failure_isolation(slow_judge, tmp_path):
    """8 trajectories at once through a judge with concurrency=2: never more than 2 requests in flight, the
    first request's 503 retried, every trajectory judged 0.6 (env return kept in info); a judge that keeps
    failing marks its trajectories' error and the run still finishes."""
    policy, chat = make_policy("random", tokenizer="smollm2", seed=0)
    _SlowJudge.fail = 1
    config = RolloutConfig(env_ids=["Chess"], num_trajectories=8, concurrency=8, max_turns=2,
                           reward=f"judge:base_url={slow_judge},model=judge-model,concurrency=2,retries=2",
                           output_dir=None)
    async with ResourceManager() as m:
        result = await run_rollouts(config, policy, chat, manager=m, progress=False)
        api = await m.acquire_global(config.reward.api)
        assert api.retries == 1
        assert api.requests == 9
    assert _SlowJudge.max_in_flight == 2
    assert _SlowJudge.requests == 9
    for t in result.trajectories:
        assert not t.error
        assert t.reward == pytest.approx(0.6)
        info = t.turns[-1].info
        assert info["reward_score"] == pytest.approx(0.6)
        assert info["judge_reply"].endswith("[[6]]")
        assert info["env_return"] == sum(turn.reward for turn in t.turns)   # the env's own return, kept
    task, text, outcome = transcript(result.trajectories[0])
    assert task
    assert result.trajectories[0].turns[0].action in text
    assert "success False, episode terminated" in outcome
    assert any(task in p and text in p for p in _SlowJudge.prompts)      # the judge saw this episode
    assert result.summary["config"]["reward"] == config.reward.spec

    _SlowJudge.fail = 100                                  # every attempt fails: 1 + retries per trajectory
    config = RolloutConfig(env_ids=["Chess"], num_trajectories=2, max_turns=1, output_dir=None,
                           reward=f"judge:base_url={slow_judge},model=m,retries=1,combine=add")
    result = await run_rollouts(config, policy, chat, progress=False)
    assert len(result.trajectories) == 2
    for t in result.trajectories:
        assert "503" in t.error
        assert "failed after 2 attempts" in t.error
        assert t.reward == 0.0


def test_cli_custom_function_reward(tmp_path):
    out = tmp_path / "run"
    assert main(["rollout", *CHESS, "-n", "2", "--mode", "step", "--reward", "test_judge_reward:constant_reward",
                 "--output-dir", str(out)]) == 0
    from agentfly_gym.rollout.trajectory import read_jsonl_records

    _version, rows = read_jsonl_records(out / "trajectories.jsonl")   # the header line is the schema's
    assert [r["reward"] for r in rows] == [0.25 * r["num_turns"] for r in rows]
    assert rows[0]["num_turns"] >= 1
    import pyarrow.parquet as pq

    steps = pq.read_table(out / "steps.parquet").to_pylist()   # step rows carry the configured return
    assert {s["episode_return"] for s in steps} == {r["reward"] for r in rows}
    assert main(["rollout", *CHESS, "-n", "1", "--reward", "judge:model=m", "--output-dir", str(out)]) == 2


@pytest.mark.slow
def test_cli_rollout_with_a_local_transformers_serve_judge(tmp_path):
    """``--reward judge:serve=transformers,model=smollm2``: the bundled model served by a real
    ``transformers serve`` started as a global resource, asked once per trajectory, stopped at the end."""
    out = tmp_path / "run"
    spec = "judge:serve=transformers,model=smollm2,max_tokens=8,max_chars=400,timeout=300,default=0.05"
    assert main(["rollout", *CHESS[:-3], "--max-turns", "1", "--no-progress", "-n", "2", "--reward", spec,
                 "--output-dir", str(out)]) == 0
    from agentfly_gym.rollout.trajectory import read_jsonl_records

    _version, rows = read_jsonl_records(out / "trajectories.jsonl")   # the header line is the schema's
    assert len(rows) == 2
    for r in rows:
        info = r["turns"][-1]["info"]
        assert not r["error"]
        assert isinstance(info["judge_reply"], str)
        rating = parse_score(info["judge_reply"])
        assert r["reward"] == info["reward_score"] == (0.05 if rating is None else rating)
    summary = json.loads((out / "summary.json").read_text())
    pools = summary["resources"]["pools"]
    svc = [p for k, p in pools.items() if "model_service" in k]
    assert len(svc) == 1
    assert svc[0]["started"] == 1
    assert summary["config"]["reward"] == spec
    from agentfly_gym.data.paths import cache_dir

    logs = sorted((cache_dir("logs")).glob("transformers-*.log"), key=lambda p: p.stat().st_mtime)
    assert logs
    assert not _server_alive(logs[-1])


def _server_alive(log) -> bool:
    """Whether the server whose log is ``log`` (name ``transformers-<id>-<port>.log``) still answers."""
    import socket

    port = int(log.stem.rsplit("-", 1)[1])
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0




@pytest.mark.slow
async def test_verl_agent_loop_yaml_reward_key(tmp_path, tiny_qwen, slow_judge):
    """The plugin's YAML key ``reward:``: a custom function sets ``reward_score`` of every step row; a judge that
    keeps failing fails only that trajectory: under V1 it leaves no row and is counted in failure_metrics()."""
    hydra = pytest.importorskip("hydra")
    pytest.importorskip("verl.experimental.agent_loop.agent_loop")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins" / "verl"))
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.workers.rollout.replica import TokenOutput

    import agentfly_gym_verl
    from agentfly_gym_verl.dataset import build_dataset
    from agentfly_gym_verl.runtime import aclose

    tok = AutoTokenizer.from_pretrained(tiny_qwen)
    cfg = trainer_config(4096, 64)
    path = build_dataset("Chess", ["tewjc"], None, tmp_path / "d.parquet", mode="step", max_turns=2,
                         env_kwargs={"mode": "puzzle"})
    row = dict(RLHFDataset(data_files=[str(path)], tokenizer=tok, config=cfg.data, processor=None)[0])
    row.pop("dummy_tensor", None)
    row["uid"] = "uid-0"
    reply = tok.encode("Action: e5e3", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]

    class Server:
        async def generate(self, request_id, *, prompt_ids, sampling_params, **kw):
            return TokenOutput(token_ids=reply, log_probs=[-0.5] * len(reply), stop_reason="completed")

    entry = {e.name: e for e in OmegaConf.load(agentfly_gym_verl.config_path())}["agentfly_step"]

    def loop(reward):
        return hydra.utils.instantiate(config=OmegaConf.merge(entry, {"reward": reward}),
                                       trainer_config=DictConfigWrap(config=cfg), server_manager=Server(),
                                       tokenizer=tok, processor=None, hf_model_type="qwen2", dataset_cls=RLHFDataset,
                                       data_config=DictConfigWrap(cfg.data), tools=ToolListWrap([]))

    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
    try:
        outs = await loop("test_judge_reward:constant_reward").run(dict(sampling), **row)
        assert len(outs) == 2
        assert [o.reward_score for o in outs] == [0.5, 0.5]
        assert not outs[0].extra_fields["error"]
        assert outs[0].extra_fields["env_return"] == 0.5
        _SlowJudge.fail = 100
        before = agentfly_gym_verl.failure_metrics()["by_error"].get("ResourceError", 0)
        outs = await loop(f"judge:base_url={slow_judge},model=m,retries=0").run(dict(sampling), **row)
        assert outs == []            # V1: a failed session leaves no row (verl's convention), it is counted instead
        assert agentfly_gym_verl.failure_metrics()["by_error"]["ResourceError"] == before + 1
    finally:
        await aclose()
    with pytest.raises(Exception, match="unknown keys") as ei:          # hydra wraps the ConfigError
        loop("judge:model=m,base_url=http://h/v1,colour=red")
    assert isinstance(ei.value.__cause__ or ei.value, ConfigError) or "ConfigError" in str(ei.value)
