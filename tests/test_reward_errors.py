"""A judge that cannot read its rating is recorded per trajectory and counted in the run summary; a run where
most judgements fail says so.

Real components: a real local HTTP server (Python's http.server on 127.0.0.1) answering chat completions
with replies that hold no ``[[N]]`` rating (as the bundled judge does with ``max_tokens=16``), real Chess
episodes driven by the random policy, the real CLI.
"""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from agentfly_gym.cli import main
from agentfly_gym.rollout.policies.factory import make_policy
from agentfly_gym.rollout.runner import RolloutConfig, run_rollouts


class _Judge(http.server.BaseHTTPRequestHandler):
    """Answers every request with ``reply``."""

    reply = "The agent made some moves and"

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length", 0)))
        out = {"choices": [{"message": {"content": type(self).reply}}]}
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(out).encode())

    def log_message(self, *a):
        pass


@pytest.fixture()
def judge_url():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Judge)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


async def test_unrated_judgements_are_recorded_counted_and_warned(judge_url, caplog):
    policy, chat = make_policy("random", tokenizer="smollm2", seed=0)
    _Judge.reply = "The agent made some moves and"  # cut before its rating
    config = RolloutConfig(env_ids=["Chess"], num_trajectories=3, max_turns=1, seed=0, output_dir=None,
                           reward=f"judge:base_url={judge_url},model=m,default=0.25")
    result = await run_rollouts(config, policy, chat, progress=False)
    for t in result.trajectories:
        assert t.reward == 0.25
        assert not t.error
        assert "holds no rating" in t.reward_error
        assert "default 0.25" in t.reward_error
    s = result.summary
    assert s["reward_errors"] == 3
    assert s["errors"] == 0
    assert len(s["warnings"]) == 1
    assert "no score for 3 of 3 trajectories" in s["warnings"][0]
    assert "no score for 3 of 3" in caplog.text

    _Judge.reply = "Fine. [[8]]"
    result = await run_rollouts(config, policy, chat, progress=False)
    assert [t.reward_error for t in result.trajectories] == [None] * 3
    assert result.summary["warnings"] == []
    assert result.summary["reward_errors"] == 0
    assert all(t.reward == 0.8 for t in result.trajectories)


def test_cli_warns_when_most_judgements_fail(judge_url, tmp_path, capsys):
    _Judge.reply = "The agent made some moves and"
    rc = main(["rollout", "--env", "Chess-v0", "--policy", "random", "--tokenizer", "smollm2", "--max-turns", "1",
               "--no-progress", "-n", "2", "--output-dir", str(tmp_path / "run"),
               "--reward", f"judge:base_url={judge_url},model=m"])
    err = capsys.readouterr().err
    assert rc == 0
    assert "WARNING: the reward function gave no score for 2 of 2 trajectories" in err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["reward_errors"] == 2
    assert summary["warnings"]
