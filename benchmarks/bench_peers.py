"""Side by side with peer systems, in one run: the same model, the same work, each system through its own rollout API.

One model for all: ``peers/replay_server.py`` (an OpenAI-compatible server that replays the trace benchmark's
profiles: heavy-tailed turn counts, reply lengths and generation times, deterministic and seeded, and returns the
token ids it sampled).  Two workloads (``peers/workload.py``): ``container`` (R2E profile: a multi-turn tool loop
whose tool runs commands in the rollout's own Docker container, created at its first call and reused on its later
turns, heavy-tailed tool times) and ``light`` (ALFWorld profile: a lookup tool, no container).

Each system runs in its own virtual environment (uv; peers at pinned versions, created under
``$AGENTFLY_GYM_CACHE/peers``) through a driver script (``peers/drive_<system>.py``) that uses its own rollout API:

- ``ours``: agentfly-gym's ``ToolEnv`` + ``run_chain_episode`` + ``OpenAITokenPolicy`` on one ``ResourceManager``.
- ``verifiers`` 0.4.0: a v1 taskset package run by ``vf-eval`` (subprocess runtime, the null chat harness, the
  tool as a task-scoped ``vf.Toolset`` MCP server) at ``-c n``.
- ``gem`` (gem-llm 0.1.0): ``gem.Env`` in ``gem.vector.AsyncVectorEnv`` (batch step, autoreset).
- ``skyrl-gym`` 0.4.0: ``BaseTextEnv`` per trajectory, stepped in a thread pool from asyncio tasks.

Every run plays ``2 n`` trajectories with ``n`` in flight (two rollout batches, as two training steps).  Measured:
trajectories/s, schedule efficiency (ideal / wall, ideal = max(longest trajectory, work / n) from the replayed
nominal times), env-side time per tool call (p50, p99; minus the nominal tool time for ``container``), containers
created (Docker events on the benchmark's image) and per trajectory, peak memory of the driver's process tree per
rollout in flight, and whether the ids a trainer gets equal the sampled ids (ours: the trajectory's sampled ids;
text-only peers: the reply re-tokenized).  A separate run per system kills the run's containers mid-episode and
counts what is left running afterwards.

``--time-scale`` multiplies every replayed duration (recorded in the JSON); turn counts are divided by
``--turn-div``.  NeMo Gym is not run: it needs Python >= 3.12 and this machine has 3.11.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent / "peers"))
sys.path.insert(2, str(Path(__file__).resolve().parents[1]))

import _common as C

HERE = Path(__file__).resolve().parent / "peers"
REPO = Path(__file__).resolve().parents[1]
PEERS: dict[str, dict[str, Any]] = {
    "verifiers": {"requires": ["verifiers==0.4.0", "docker"], "dist": "verifiers",
                  "api": "vf-eval (verifiers.v1), subprocess runtime, null harness, task-scoped vf.Toolset (MCP)"},
    "gem": {"requires": ["gem-llm==0.1.0", "docker", "openai"], "dist": "gem-llm",
            "api": "gem.vector.AsyncVectorEnv (thread pool, autoreset SAME_STEP), batch generate then step"},
    "skyrl-gym": {"requires": ["skyrl-gym==0.4.0", "docker", "openai"], "dist": "skyrl-gym",
                  "api": "skyrl_gym BaseTextEnv per trajectory, asyncio tasks, env.step in a thread pool"},
}
PROFILES = {"container": "r2e", "light": "alfworld"}
MODEL_BATCH = 16  # the SmolLM2 run's most requests decoded together
#: agentfly-gym's systems (one driver, drive_ours.py): the driver's variant and how it runs the work. "ours" as the
#: library ships, on Docker like the peers (the summary's ratio is of it), "ours-nolimits" without the disk volume,
#: to measure what the limit costs, "ours-sandbox" on the library's daemon-less sandbox backend instead of Docker
OURS: dict[str, dict[str, Any]] = {
    "ours": {"variant": None,
             "api": "ToolEnv + run_chain_episode + OpenAITokenPolicy, one ResourceManager, Docker container pool "
                    "max_instances = n (the library's default limits: 1 CPU, 1 GiB, 256 pids, a disk volume)"},
    "ours-nolimits": {"variant": "nolimits",
                      "api": "as ours, its containers without the disk limit's volume (the peers' containers have "
                             "none): what the limit costs"},
    "ours-sandbox": {"variant": "sandbox",
                     "api": "as ours, the container on the library's daemon-less sandbox backend (bubblewrap over "
                            "the same image's file system, a process tree per exec, the same limits) instead of "
                            "Docker: what a user without a Docker engine (or choosing backend='sandbox') gets; the "
                            "peers ship no container backend of their own"},
}
MAX_N_WHY = {"verifiers": "each rollout prepares its chat program (a uv script) and starts its MCP tool server in its "
                          "own processes: ~1-3 min per rollout measured at n = 4 on this shared 2-core machine, so "
                          "n = 64 / 256 (128 / 512 rollouts) would take hours and starve the other systems' runs"}


def peer_venv(name: str) -> Path:
    """The peer's uv virtual environment (created on first use under the cache; its python path)."""
    from agentfly_gym.data.paths import cache_dir

    spec = PEERS[name]
    tag = "-".join(r.replace("==", "") for r in spec["requires"] if "==" in r)
    root = Path(cache_dir("peers")) / tag
    py = root / "bin" / "python"
    if py.exists() and (root / ".complete").exists():
        return py
    uv = Path(sys.executable).parent / "uv"
    env = dict(os.environ)
    env.update(_uv_env())
    subprocess.run([str(uv), "venv", "-q", "--clear", "--python", "3.11", str(root)], check=True, env=env)
    subprocess.run([str(uv), "pip", "install", "-q", "--python", str(py), *spec["requires"]], check=True, env=env)
    (root / ".complete").write_text("ok")
    return py


def _uv_env() -> dict[str, str]:
    """The UV_* variables scripts/uv-env.sh exports (the local package indexes pip is configured with)."""
    out = subprocess.run(["bash", "-c", f"source {REPO / 'scripts' / 'uv-env.sh'} >/dev/null 2>&1; env -0"],
                         capture_output=True, check=False).stdout.decode()
    return {k: v for k, v in (e.split("=", 1) for e in out.split("\0") if "=" in e) if k.startswith("UV_")}


def version_of(py: Path, dist: str) -> str | None:
    r = subprocess.run([str(py), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
                       capture_output=True, text=True, check=False)
    return r.stdout.strip() or None


def bench_image() -> str:
    """The benchmark's own image: the project's Debian base image (built offline if missing) plus a label, so that
    its image id is the benchmark's alone: containers are counted, killed and removed by ``ancestor=`` this image,
    which never matches another user's containers on a shared engine (they derive from the base, not from it)."""
    import io

    import docker
    import workload as W

    from agentfly_gym.images.base import build_base_image

    client = docker.from_env(timeout=300)
    try:
        img = client.images.get(W.IMAGE)
        if img.labels.get(W.LABEL) == "1":
            return W.IMAGE
    except docker.errors.ImageNotFound:
        pass
    base = build_base_image()
    recipe = f"FROM {base}\nLABEL {W.LABEL}=1\n".encode()
    client.images.build(fileobj=io.BytesIO(recipe), tag=W.IMAGE, rm=True)
    return W.IMAGE


# ----------------------------------------------------------------------------- measuring one driver run
def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants (/proc)."""
    kids: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            kids.setdefault(int(parts[1]), []).append(int(d))
            rss[int(d)] = int(parts[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        total += rss.get(p, 0)
        stack.extend(kids.get(p, []))
    return total


def _containers(run_id: str, all_states: bool = True) -> int:
    import workload as W

    r = subprocess.run(["docker", "ps", "-q", *(["-a"] if all_states else []), "--filter", f"ancestor={W.IMAGE}"],
                       capture_output=True, text=True, check=False)
    return len(r.stdout.split())


class ContainerEvents:
    """Counts the engine's ``create`` and ``start`` events of the benchmark's image while it runs (a ``docker events``
    stream: the engine keeps only its last 256 events for a later ``--since`` query, and every exec makes three)."""

    def __init__(self) -> None:
        import workload as W

        self.proc = subprocess.Popen(["docker", "events", "--filter", "type=container", "--filter", "event=create",
                                      "--filter", "event=start", "--filter", f"image={W.IMAGE}", "--format",
                                      "{{.Action}}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        time.sleep(0.3)  # subscribed before the driver starts

    def stop(self) -> dict[str, int]:
        time.sleep(0.5)  # the last events reach the stream
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=30)
        words = out.split()
        return {"containers_created": words.count("create"), "containers_started": words.count("start")}


def run_driver(system: str, py: Path, args: dict[str, Any], timeout: float,
               kill_after_s: float | None = None) -> dict[str, Any]:
    """Run one driver; its RESULT plus peak tree RSS, containers created, and (``kill_after_s``) what is left
    after the run's containers were killed mid-episode."""
    driver = "ours" if system in OURS else system.replace("-", "_")
    if system in OURS:
        args = {**args, "variant": OURS[system]["variant"]}
    cmd = [str(py), str(HERE / f"drive_{driver}.py"), json.dumps(args)]
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    if system not in OURS:
        env["PYTHONPATH"] = ""
    env.update(_uv_env())
    events = ContainerEvents()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, cwd=args.get("cwd", str(REPO)))
    peak = [0]
    stop = threading.Event()
    killed = {"containers_killed": 0}

    def sample() -> None:
        t0 = time.monotonic()
        while not stop.wait(0.25):
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            if kill_after_s is not None and not killed["containers_killed"]:
                import workload as W

                ids = subprocess.run(["docker", "ps", "-q", "--filter", f"ancestor={W.IMAGE}"], capture_output=True,
                                     text=True, check=False).stdout.split()
                # mid-episode: once half the rollouts in flight hold a container (or past kill_after_s with any)
                if ids and (len(ids) >= max(1, args["n"] // 2) or time.monotonic() - t0 > kill_after_s):
                    subprocess.run(["docker", "kill", *ids], capture_output=True, check=False)
                    killed["containers_killed"] = len(ids)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        out, err = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc = "timeout"
    stop.set()
    th.join()
    counted = events.stop()
    line = [x for x in out.splitlines() if x.startswith("RESULT ")]
    res: dict[str, Any] = json.loads(line[-1][7:]) if line else {"failed": f"rc={rc}: {err[-1500:]}"}
    res["rc"] = rc
    res["peak_tree_rss_bytes"] = peak[0]
    res.update(counted)
    if kill_after_s is not None:
        res.update(killed)
        time.sleep(0)  # the driver has exited: what it left is what is left
        res["containers_left"] = _containers(args["run_id"])
        res["processes_left"] = len(subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True,
                                                   check=False).stdout.split())
        _cleanup_containers()
    if rc != 0:
        res["stderr_tail"] = err[-1500:]
    return res


def _cleanup_containers() -> None:
    import workload as W

    ids = subprocess.run(["docker", "ps", "-aq", "--filter", f"ancestor={W.IMAGE}"], capture_output=True, text=True,
                         check=False).stdout.split()
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, check=False)


def _warm_engine(n: int = 32) -> dict[str, Any]:
    """``n`` throw-away containers of the benchmark's image run at once before any measured run: the first burst of
    starts after the engine itself started took twice as long in one measured case (322 s against 166-175 s for 256
    rollouts), a cost that would fall on whichever system runs first."""
    import workload as W

    t0 = time.monotonic()
    procs = [subprocess.Popen(["docker", "run", "--rm", "--network", "none", W.IMAGE, "true"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n)]
    rcs = [p.wait() for p in procs]
    _cleanup_containers()
    return {"containers": n, "failed": sum(1 for rc in rcs if rc != 0), "seconds": round(time.monotonic() - t0, 2)}


# ----------------------------------------------------------------------------- figures of one run
def figures(res: dict[str, Any], replay: Any, workload: str, n: int, total: int, tok: Any) -> dict[str, Any]:
    nominal = []
    for k in range(total):
        tr = replay.trace(k)
        nominal.append(sum(tr["gen_s"]) * replay.time_scale +
                       (sum(tr["tool_s"][:-1]) * replay.time_scale if workload == "container" else 0.0))
    ideal = max(max(nominal), sum(nominal) / n)
    expected = sum(replay.trace(k)["turns"] - 1 for k in range(total))
    wall = res.get("wall_s")
    over = []
    for k, t, secs in res.get("steps", []):
        nom = replay.trace(int(k))["tool_s"][int(t)] * replay.time_scale if workload == "container" else 0.0
        over.append(secs - nom)
    # ids a trainer gets vs the sampled ones
    match = turns = 0
    if "ids" in res:
        for k, per in res["ids"].items():
            for t, ids in enumerate(per):
                want = replay.log.get(f"{k}/{t}")
                turns += 1
                match += want is not None and ids[:len(want)] == want and len(ids) - len(want) <= 1
        how = "the trajectory's own sampled ids"
    elif "texts" in res:
        for k, per in res["texts"].items():
            for t, text in enumerate(per):
                want = replay.log.get(f"{k}/{t}")
                turns += 1
                match += want is not None and tok.encode(text, add_special_tokens=False) == want
        how = "the reply text re-tokenized (the system keeps no ids)"
    else:
        how = res.get("ids_note", "not recorded by the system")
    out = {"n": n, "trajectories_total": total, "trajectories_done": res.get("trajectories"), "wall_s": wall,
           "trajectories_per_s": (res.get("trajectories") or 0) / wall if wall else None,
           "ideal_s": ideal, "schedule_efficiency": ideal / wall if wall else None,
           "env_overhead_per_step_s": {"p50": C.pct(over, 0.5), "p99": C.pct(over, 0.99), "steps": len(over)}
           if over else None,
           "containers_created": res.get("containers_created"),
           "containers_started": res.get("containers_started"),
           "containers_per_trajectory": (res.get("containers_created") or 0) / total,
           "starts_per_trajectory": (res.get("containers_started") or 0) / total,
           "peak_tree_rss_bytes": res.get("peak_tree_rss_bytes"),
           "peak_rss_per_rollout_bytes": (res.get("peak_tree_rss_bytes") or 0) / n,
           "ids_equal_sampled": {"turns": turns, "equal": match, "share": match / turns if turns else None,
                                 "how": how, "turns_asked_twice": sum(1 for v in replay.served.values() if v > 1)},
           "tool_results_seen": {"expected": expected, "seen": len(replay.tool_seen),
                                 "how": "the request for turn t carries the output of tool call t - 1"},
           "errors": res.get("errors"), "rc": res.get("rc")}
    for key in ("command", "cli_wall_s", "rc_vf_eval", "notes", "pool"):
        if key in res:
            out[key] = res[key]
    if res.get("failed") or res.get("stderr_tail"):
        out["failure"] = res.get("failed") or res.get("stderr_tail")
    return out


# ----------------------------------------------------------------------------- the campaign
def main() -> int:
    p = C.base_parser(__doc__.split("\n")[0])
    p.add_argument("--systems", default="ours,gem,skyrl-gym,verifiers")
    p.add_argument("--workloads", default="container,light")
    p.add_argument("--ns", default="16,64,256", help="rollouts in flight (each run plays 2 n trajectories)")
    p.add_argument("--time-scale", type=float, default=0.05, help="multiplies every replayed duration")
    p.add_argument("--turn-div", type=float, default=8.0, help="traced turn counts are divided by this (>= 2 turns)")
    p.add_argument("--kill-n", type=int, default=16, help="n of the containers-killed-mid-episode run (0: none)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per driver run")
    p.add_argument("--model", choices=["replay", "smollm2"], default="replay",
                   help="smollm2: the replies' text sampled by the bundled SmolLM2 on this CPU (rows '<workload>-smollm2')")
    p.add_argument("--max-n", default="verifiers=16",
                   help="SYSTEM=N,...: largest n a system is run at (the reason is recorded in the JSON)")
    p.add_argument("--once", default="",
                   help="SYSTEM,...: run once at each n even with --repeats (verifiers: 3-4 min a run at n = 16 here)")
    p.add_argument("--kill-systems", default="ours,gem,skyrl-gym",
                   help="systems that get the containers-killed-mid-episode run")
    p.add_argument("--merge", default="",
                   help="FILE,...: no run; merge these result files (e.g. two workloads run as two processes, "
                        "their .partial.json) into one JSON and PNG")
    a = p.parse_args()
    if a.merge:
        return merge(a, _result_files(p, a.merge))
    _check_args(p, a)
    a.kill_systems = [x for x in a.kill_systems.split(",") if x]
    once = {x for x in a.once.split(",") if x}
    a.max_n = {k: int(v) for k, v in (x.split("=") for x in a.max_n.split(",") if x)}
    if a.scale == 0:
        a.ns = "4"
    C.setup_env_vars()
    res = C.Result("bench_peers", a)
    import bench_trace_rollout as T
    from replay_server import Replay, ReplayServer
    from transformers import AutoTokenizer

    from agentfly_gym.rollout.models import smollm2_dir

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir()))
    systems = [s for s in a.systems.split(",") if s]
    ns = [int(x) for x in a.ns.split(",") if x]
    res.data.update({"time_scale": a.time_scale, "turn_div": a.turn_div, "ns": ns,
                     "trajectories_per_run": "2 n (two batches of n in flight)",
                     "nemo_gym": "not run: NeMo Gym needs Python >= 3.12; this machine has Python 3.11",
                     "systems": {}, "runs": {}, "summary": {}, "kill_mid_episode": {}})
    pys: dict[str, Path] = {s: Path(sys.executable) for s in OURS}
    for s in systems:
        if s in OURS:
            res.data["systems"][s] = {"version": version_of(pys[s], "agentfly-gym"), "api": OURS[s]["api"]}
            continue
        with C.skip_on_error(res, f"{s}/venv") as g:
            pys[s] = peer_venv(s)
            if s == "verifiers":
                import peers_verifiers

                peers_verifiers.install_taskset(pys[s])
        if g.failed:
            continue
        res.data["systems"][s] = {"version": version_of(pys[s], PEERS[s]["dist"]), "requires": PEERS[s]["requires"],
                                  "api": PEERS[s]["api"], "venv": "uv, Python 3.11, under the cache"}
    systems = [s for s in systems if s in pys]
    if "container" in a.workloads:
        bench_image()
        res.data["engine_warmup"] = _warm_engine(4 if a.scale == 0 else 32)
    model = None
    if a.model == "smollm2":
        from agentfly_gym.rollout.policies.transformers_policy import TransformersPolicy

        model = TransformersPolicy(smollm2_dir(), max_batch_size=MODEL_BATCH, torch_threads=None, seed=a.seed)
        res.data["model"] = {"name": "SmolLM2-135M-Instruct (bundled)", "server": "the replay server, its reply "
                             "fillers sampled by the model (TransformersPolicy, continuous batching, max batch "
                             f"{MODEL_BATCH}, CPU, all cores), the script (turns, tool calls) replayed"}
    for wl_name in [w for w in a.workloads.split(",") if w]:
        wl = wl_name
        prof = T.make_profiles()[PROFILES[wl]]
        replay = Replay(profile=prof, workload=wl, seed=a.seed, time_scale=a.time_scale, turn_div=a.turn_div,
                        tokenizer=tok, model=model)
        if model is not None:
            wl_name = f"{wl}-smollm2"  # its own rows: the replayed runs' are not replaced on a merge
        res.data["runs"][wl_name] = {"profile": prof.name, "profile_source": prof.source}
        with ReplayServer(replay) as url:
            for n in ns:
                total = 2 * n
                tries: dict[str, list[dict[str, Any]]] = {}
                here = [s for s in systems if n <= a.max_n.get(s, n)]
                for s in systems:
                    if s not in here:
                        res.skip(f"{wl}/{n}/{s}", f"n > {a.max_n[s]} (--max-n): {MAX_N_WHY.get(s, '')}")
                for rep in range(a.repeats or 1):  # --repeats (default 1); the order rotates, so that no system always runs first or last
                    for s in here[rep % len(here):] + here[:rep % len(here)] if here else []:
                        if rep and s in once:
                            continue
                        args = {"url": url, "workload": wl, "n": n, "total": total, "run_id": f"{s}-{wl}-{n}",
                                "config": res.data["systems"][s]}
                        print(f"[bench_peers] {wl} n={n} {s} ...", flush=True)
                        if wl == "container":  # never while another run's containers may be up (light: none)
                            _cleanup_containers()
                        replay.reset_logs()
                        r = run_driver(s, pys[s], args, a.timeout)
                        f = figures(r, replay, wl, n, total, tok)
                        tries.setdefault(s, []).append(f)
                        print(f"[bench_peers] {wl} n={n} {s}: {f['trajectories_per_s']} traj/s, "
                              f"efficiency {f['schedule_efficiency']}, done {f['trajectories_done']}/{total}"
                              + (f" FAILED {f.get('failure', '')[-400:]}" if f.get("failure") else ""), flush=True)
                row = {s: median_run(fs) for s, fs in tries.items()}
                res.data["runs"][wl_name][str(n)] = row
                res.data["summary"].setdefault(wl_name, {})[str(n)] = summarize(row)
                _save_partial(res)
            if wl == "container" and a.kill_n:
                for s in systems:
                    if s not in a.kill_systems:
                        res.skip(f"kill_mid_episode/{s}", "not in --kill-systems (time budget of the run)")
                        continue
                    args = {"url": url, "workload": wl, "n": a.kill_n, "total": a.kill_n, "run_id": f"{s}-kill"}
                    _cleanup_containers()
                    r = run_driver(s, pys[s], args, a.timeout, kill_after_s=30.0)
                    res.data["kill_mid_episode"][s] = {k: r.get(k) for k in (
                        "containers_killed", "containers_left", "processes_left", "trajectories", "rc")}
                    res.data["kill_mid_episode"][s]["errors"] = (r.get("errors") or [])[:3]
                    print(f"[bench_peers] kill mid-episode {s}: {res.data['kill_mid_episode'][s]}", flush=True)
                    _save_partial(res)
    if model is not None:
        model.close()
    return C.finish(res, plot)


def _check_args(p: Any, a: Any) -> None:
    """Refuse, with argparse's usage line and exit status 2, what cannot make a run: unknown systems or workloads,
    an n below 1, a --max-n that is not SYSTEM=N, durations that are not > 0."""
    known = [*OURS, *PEERS]

    def systems(option: str, value: str, *, empty: bool = True) -> None:
        names = [x for x in value.split(",") if x]
        bad = [x for x in names if x not in known]
        if bad or (not names and not empty):
            p.error(f"{option}: unknown system(s) {', '.join(bad) or '(none given)'}; known: {', '.join(known)}")

    systems("--systems", a.systems, empty=False)
    systems("--kill-systems", a.kill_systems)
    systems("--once", a.once)
    wls = [x for x in a.workloads.split(",") if x]
    if not wls or any(w not in PROFILES for w in wls):
        p.error(f"--workloads {a.workloads!r}: each must be one of {', '.join(PROFILES)}")
    if not re.fullmatch(r"\d+(,\d+)*", a.ns) or any(int(x) < 1 for x in a.ns.split(",")):
        p.error(f"--ns {a.ns!r}: rollouts in flight, whole numbers >= 1 separated by commas (e.g. 16,64,256)")
    for item in (x for x in a.max_n.split(",") if x):
        name, _, n = item.partition("=")
        if name not in known or not n.isdigit() or int(n) < 1:
            p.error(f"--max-n {item!r}: SYSTEM=N with a known system and N >= 1")
    for option, v in (("--time-scale", a.time_scale), ("--turn-div", a.turn_div), ("--timeout", a.timeout)):
        if not (v > 0 and math.isfinite(v)):
            p.error(f"{option} {v}: must be > 0")


def _result_files(p: Any, value: str) -> list[Path]:
    """The --merge files: each must be a JSON object written by this benchmark (argparse's error otherwise)."""
    files = [Path(x) for x in value.split(",") if x]
    if not files:
        p.error("--merge: give FILE,... (results of earlier runs, e.g. their bench_peers.json)")
    for f in files:
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            p.error(f"--merge {f}: {e}")
        if not isinstance(d, dict) or d.get("benchmark") != "bench_peers" or "time_scale" not in d:
            p.error(f"--merge {f}: not a bench_peers result (its JSON has no benchmark 'bench_peers' and time_scale)")
    return files


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A system's row from its repeats: the run of median trajectories/s (its figures as measured), with every
    repeat's trajectories/s under ``repeats`` when there was more than one."""
    ranked = sorted(runs, key=lambda r: r.get("trajectories_per_s") or 0.0)
    row = dict(ranked[(len(ranked) - 1) // 2])
    if len(runs) > 1:
        row["repeats"] = [r.get("trajectories_per_s") for r in runs]
    return row


def summarize(row: dict[str, Any]) -> dict[str, Any]:
    """One (workload, n)'s summary: each system's trajectories/s and ours over the best peer's."""
    tps = {s: r.get("trajectories_per_s") for s, r in row.items()}
    best_peer = max((v or 0.0 for s, v in tps.items() if s not in OURS), default=0.0)
    out = {"trajectories_per_s": tps,
           "ours_over_best_peer": (tps.get("ours") or 0.0) / best_peer if best_peer else None}
    if tps.get("ours-sandbox") and best_peer:
        out["ours_sandbox_over_best_peer"] = tps["ours-sandbox"] / best_peer
    return out


def merge(a: Any, files: list[Path]) -> int:
    """One result from several runs' files: runs, summary, kill runs, systems and skips are joined (a later file's
    (workload, n) replaces an earlier one's); each file's command and machine load are kept under ``merged_from``."""
    res = C.Result("bench_peers", a)
    parts = [json.loads(f.read_text()) for f in files]
    res.data.update({k: parts[0][k] for k in ("time_scale", "turn_div", "ns", "trajectories_per_run", "nemo_gym")})
    res.data.update({"systems": {}, "runs": {}, "summary": {}, "kill_mid_episode": {}, "merged_from": []})
    for d in parts:
        for key in ("systems", "kill_mid_episode", "skipped"):
            res.data[key].update(d.get(key) or {})
        for key in ("runs", "summary"):  # per workload, per n: a later file's n replaces an earlier one's
            for wl, byn in (d.get(key) or {}).items():
                res.data[key].setdefault(wl, {}).update(byn)
        for wl, byn in (d.get("runs") or {}).items():
            for n, row in byn.items():
                if n.isdigit():
                    res.data["summary"].setdefault(wl, {})[n] = summarize(row)
        if d.get("model"):
            res.data["model"] = d["model"]
        res.data["merged_from"].append({"command": d["command"], "started": d["started"],
                                        "machine": d["machine"], "workloads": list(d.get("runs") or {}),
                                        **({"engine_warmup": d["engine_warmup"]} if d.get("engine_warmup") else {})})
    return C.finish(res, plot)


def _save_partial(res: C.Result) -> None:
    """Write the JSON as it stands (a long campaign keeps what it measured if it is stopped)."""
    import json as _json

    res.out.mkdir(parents=True, exist_ok=True)
    (res.out / f"{res.name}.partial.json").write_text(_json.dumps(C.clean(res.data), indent=2, default=str))


def plot(res: C.Result) -> None:
    d = res.data
    wls = list(d["summary"])
    fig, axes = C.subplots(1, max(1, len(wls)), figsize=(6 * max(1, len(wls)), 4), squeeze=False)
    everyone = sorted({s for wl in wls for byn in d["summary"][wl].values() for s in byn["trajectories_per_s"]})
    color = {s: f"C{i}" for i, s in enumerate(everyone)}  # one color per system in every panel
    for ax, wl in zip(axes[0], wls):
        ns = list(d["summary"][wl])
        systems = sorted({s for n in ns for s in d["summary"][wl][n]["trajectories_per_s"]})
        width = 0.8 / max(1, len(systems))
        for j, s in enumerate(systems):
            ys = [d["summary"][wl][n]["trajectories_per_s"].get(s) or 0.0 for n in ns]
            ax.bar([i + j * width for i in range(len(ns))], ys, width, label=s, color=color[s])
        ax.set_xticks([i + width * (len(systems) - 1) / 2 for i in range(len(ns))])
        ax.set_xticklabels([f"n={n}" for n in ns])
        ax.set_ylabel("trajectories / s")
        ax.set_title(f"{wl} workload" + ("" if wl.endswith("-smollm2") else f" (time scale {d['time_scale']:g})"))
        ax.legend(fontsize=8)
    C.save_figure(res, fig)


if __name__ == "__main__":
    sys.exit(main())
