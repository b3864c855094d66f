"""verifiers' driver: ``vf-eval vf-bench-peers`` (the taskset package in ``vf_bench_peers/``), verifiers' own
concurrent evaluation loop at ``-c n`` over ``2 n`` tasks, the ``subprocess`` runtime (the documented local
runtime; its ``docker`` runtime installs uv into the container from the network, which containers here do not
have), the ``null`` harness (verifiers' plain chat program; the model's tool calls go to the task's MCP tool
server, one launched per rollout), the eval client (OpenAI-compatible, pointed at the replay server).

Figures from the run's ``traces.jsonl``: wall = first rollout's start to the last one's end (the CLI's own start-up
excluded, in verifiers' favour); a trajectory counts when its ``answered`` reward is 1.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workload as W

SETTINGS = ["--env.agent.runtime.type", "subprocess", "--env.agent.harness.id", "null", "--no-push", "--no-rich"]


def main(a: dict[str, Any]) -> dict[str, Any]:
    n, total = a["n"], a["total"]
    out = tempfile.mkdtemp(prefix="vf-bench-")
    vf_eval = str(Path(sys.executable).parent / "vf-eval")
    env = dict(os.environ, BENCH_PEERS_TOTAL=str(total), BENCH_PEERS_WORKLOAD=a["workload"], OPENAI_API_KEY="none")
    cmd = [vf_eval, "vf-bench-peers", "-m", "replay", "--client.base-url", a["url"], "--client.api-key-var",
           "OPENAI_API_KEY", "-n", str(total), "-c", str(n), "-o", out, *SETTINGS]
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True, check=False)
    cli_wall = time.monotonic() - t0
    episodes = []
    for f in glob.glob(f"{out}/*/traces.jsonl"):
        with open(f) as fh:
            episodes.extend(json.loads(x) for x in fh if x.strip())
    starts, ends, done, errors = [], [], 0, []
    for ep in episodes:
        for tr in ep.get("traces", []):
            tm = tr.get("timing") or {}
            starts.append(tm.get("start") or 0.0)
            ends.append(max((tm.get(s) or {}).get("end") or 0.0 for s in ("agent", "finalize", "scoring")))
            if ((tr.get("rewards") or {}).get("answered") or {}).get("score") == 1.0:
                done += 1
            errors.extend(str(e)[:200] for e in tr.get("errors") or [])
    wall = (max(ends) - min(starts)) if starts else None
    return {"wall_s": wall, "cli_wall_s": cli_wall, "trajectories": done, "steps": [], "errors": errors[:5],
            "command": " ".join(cmd[1:]), "rc_vf_eval": p.returncode,
            "stderr_tail": None if p.returncode == 0 else p.stderr[-1500:],
            "ids_note": "not recorded: the eval client keeps messages, no token ids (a trainer re-renders them)",
            "notes": "wall from traces.jsonl timing (CLI start-up excluded); env time per tool call not exposed"}


if __name__ == "__main__":
    W.emit(main(W.parse_args()))
