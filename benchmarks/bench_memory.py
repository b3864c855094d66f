"""Memory per concurrent rollout: ours (one process, one ResourceManager) vs Gymnasium's AsyncVectorEnv.

For every env and every count n of concurrent episodes, a fresh interpreter (``--child``) opens n
episodes at once and holds them:

  ours       one ResourceManager, n envs (``gymnasium.make(..., manager=m).unwrapped``) with pool
             capacity n, all reset concurrently (seeds 0..n-1).
  gym_async  ``gymnasium.vector.AsyncVectorEnv`` with n workers (Gymnasium's default start method),
             each ``gymnasium.make``s the env with its own default manager, ``reset`` with seeds 0..n-1.

Measured with every episode open (after the reset): RSS and PSS (proportional set size: shared pages
split between the processes that map them, so a forked worker is not charged for its parent's pages)
summed over the process tree (the interpreter, its worker processes, JVMs, Stockfish engines; psutil,
from /proc/<pid>/smaps_rollup), and for R2E-Gym the memory of the episodes' Docker containers as
``docker stats`` counts it (usage minus inactive file cache, read from the engine's stats API with
``one_shot``).  The baseline is the same interpreter after its imports, before any env; per episode =
(total - baseline) / n.  Sizes the machine cannot hold are scaled down (see ``SIZES``) and say so.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C

ENVS: dict[str, dict[str, Any]] = {
    "Chess": {"id": "agentfly/Chess-v0", "kwargs": {"mode": "play"}, "cap_key": "max_instances"},
    "WebShop": {"id": "agentfly/WebShop-v0", "kwargs": {}, "cap_key": None},
    "ALFWorld": {"id": "agentfly/ALFWorld-v0", "kwargs": {}, "cap_key": "max_instances"},
    "ScienceWorld": {"id": "agentfly/ScienceWorld-v0", "kwargs": {}, "cap_key": "max_instances"},
    "R2EGym": {"id": "agentfly/R2EGym-v0", "kwargs": {"backend": "docker"}, "cap_key": "max_instances"},
}

# concurrent episodes measured per env on this machine (2 cores, 23 GiB shared by several developers).
# The issue asks for 8/32/128; where fewer are listed the reason is in SCALED_DOWN.
SIZES: dict[str, dict[str, list[int]]] = {
    "Chess": {"ours": [8, 32, 128], "gym_async": [8, 32]},
    "WebShop": {"ours": [8, 32, 128], "gym_async": [8]},
    "ALFWorld": {"ours": [8, 32, 128], "gym_async": [8, 32]},
    "ScienceWorld": {"ours": [8, 32], "gym_async": [8, 32]},
    "R2EGym": {"ours": [8, 32, 128], "gym_async": [8, 32]},
}
# episodes opened at once: 32 Stockfish engines starting together on 2 cores at load ~15 missed the engine's 10 s
# UCI start-up timeout (ResourceStartError), so resets go in waves; the memory held afterwards is the same.
WAVE = 8

SCALED_DOWN = {
    "ScienceWorld": "one JVM per concurrent episode (~117 MiB PSS at reset, its heap growing towards -Xmx400m, "
                    "185-510 MB, mean ~330 MB, as episodes run (bench_memory_growth)): 128 would take ~15 GB at reset and "
                    "~40 GB once the heaps grow, "
                    "more than this shared 23 GiB machine has",
    "gym_async": "one full interpreter per env: 8 and 32 workers show the per-process cost (WebShop: 8 only, each "
                 "worker loads its own catalogue, ~225 MiB: 32 would take ~7 GB and several minutes), larger n "
                 "scales linearly (one process each)",
}


# ----------------------------------------------------------------------------- measurement (child side)
def tree_memory(root: int) -> dict[str, Any]:
    """RSS and PSS (bytes) summed over ``root`` and all its descendants, with the process count."""
    import psutil

    procs = []
    try:
        p = psutil.Process(root)
        procs = [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        pass
    rss = pss = 0
    names: dict[str, int] = {}
    for q in procs:
        try:
            full = q.memory_full_info()
            rss += full.rss
            pss += getattr(full, "pss", full.rss)
            names[q.name()] = names.get(q.name(), 0) + 1
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return {"rss": rss, "pss": pss, "processes": len(procs), "by_name": names}


def container_memory(label_filters: list[str]) -> dict[str, Any]:
    """Memory of the running containers matching any of ``label_filters`` (``key=value``), as ``docker stats``
    counts it: usage minus inactive file cache (cgroup v1 ``total_inactive_file`` / v2 ``inactive_file``)."""
    import docker

    client = docker.from_env()
    seen: dict[str, Any] = {}
    for f in label_filters:
        for c in client.containers.list(filters={"label": f}):
            seen[c.id] = c
    total = 0
    per: list[int] = []
    for c in seen.values():
        s = c.stats(stream=False, one_shot=True)
        m = s.get("memory_stats") or {}
        st = m.get("stats") or {}
        used = int(m.get("usage", 0)) - int(st.get("total_inactive_file", st.get("inactive_file", 0)))
        per.append(used)
        total += used
    client.close()
    return {"containers": len(seen), "bytes": total, "per_container": per}


async def hold_ours(env: str, n: int, manager_id: str | None = None) -> dict[str, Any]:
    import gymnasium

    import agentfly_gym  # noqa: F401
    from agentfly_gym.resources import ResourceManager

    d = ENVS[env]
    kwargs = dict(d["kwargs"])
    if d["cap_key"]:
        kwargs[d["cap_key"]] = n
    base = tree_memory(os.getpid())
    t0 = time.monotonic()
    # the driver names the manager (``--child ... <manager id>``) so it can remove this run's containers if the
    # child is killed (timeout, memory guard) before it could close them
    async with ResourceManager(manager_id=manager_id) as m:
        envs = [gymnasium.make(d["id"], manager=m, **kwargs).unwrapped for _ in range(n)]
        try:
            sem = asyncio.Semaphore(WAVE)

            async def reset(i: int, e: Any) -> None:
                async with sem:
                    await e.areset(seed=i)

            await asyncio.gather(*(reset(i, e) for i, e in enumerate(envs)))
            t_open = time.monotonic() - t0
            await asyncio.sleep(1.0)  # let lazily started workers settle
            mem = tree_memory(os.getpid())
            cont = container_memory([f"agentfly.manager={m.id}"]) if env == "R2EGym" else None
        finally:
            await asyncio.gather(*(e.aclose() for e in envs), return_exceptions=True)
    return {"baseline": base, "open": mem, "containers": cont, "open_s": t_open}


def hold_gym(env: str, n: int) -> dict[str, Any]:
    import gymnasium
    import numpy as np
    from gymnasium.vector import AsyncVectorEnv, AutoresetMode

    import agentfly_gym  # noqa: F401

    d = ENVS[env]
    base = tree_memory(os.getpid())
    t0 = time.monotonic()
    venv = AsyncVectorEnv([lambda: gymnasium.make(d["id"], **d["kwargs"])] * n, shared_memory=False,
                          autoreset_mode=AutoresetMode.DISABLED)
    try:
        for w in range(0, n, WAVE):  # reset in waves of WAVE workers (see WAVE)
            mask = np.zeros(n, dtype=bool)
            mask[w:w + WAVE] = True
            venv.reset(seed=[i if mask[i] else None for i in range(n)], options={"reset_mask": mask})
        t_open = time.monotonic() - t0
        time.sleep(1.0)
        mem = tree_memory(os.getpid())
        cont = None
        import psutil

        pids = [q.pid for q in psutil.Process().children(recursive=True)]
        if env == "R2EGym":
            cont = container_memory([f"agentfly.pid={p}" for p in pids])
    finally:
        venv.close()
    # the workers' own managers label their containers with the worker's pid: any still there once the
    # workers are gone were left behind by ``close``; count them (reported) and remove them
    left = _remove_containers([f"agentfly.pid={p}" for p in pids]) if env == "R2EGym" else 0
    return {"baseline": base, "open": mem, "containers": cont, "open_s": t_open, "worker_containers_left": left}


def child(env: str, n: int, mode: str, manager_id: str | None = None) -> int:
    C.setup_env_vars()
    import gymnasium  # noqa: F401  (imports in the baseline)

    import agentfly_gym  # noqa: F401

    out = asyncio.run(hold_ours(env, n, manager_id)) if mode == "ours" else hold_gym(env, n)
    print("RESULT " + json.dumps(out), flush=True)
    return 0


# ----------------------------------------------------------------------------- driver
class MemoryGuardError(RuntimeError):
    """The machine's available memory fell below ``--min-available-gib`` while a measurement ran."""


def _remove_containers(label_filters: list[str]) -> int:
    """Remove the containers matching any of ``label_filters`` (``key=value``, naming only this run's); how many
    there were."""
    try:
        import docker

        client = docker.from_env()
        left = {c.id: c for f in label_filters for c in client.containers.list(all=True, filters={"label": f})}
        for c in left.values():
            c.remove(force=True)
        client.close()
        return len(left)
    except Exception:  # noqa: BLE001  (no Docker engine: nothing of ours can be left there)
        return 0


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def run_child(env: str, n: int, mode: str, timeout: float, min_available: float = 0.0) -> dict[str, Any]:
    """Measure one (env, n, mode) in a fresh interpreter in its own process group.

    The group (the child, its workers, JVMs and engines) is killed when ``timeout`` seconds pass or the
    machine's available memory falls below ``min_available`` bytes (:class:`MemoryGuardError`); the
    containers labelled with this measurement's manager id are removed in every case.
    """
    import signal
    import uuid

    import psutil

    manager_id = f"benchmem-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", env, str(n), mode, manager_id]
    t0 = time.monotonic()
    measured = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.gmtime()), "loadavg_at_start": list(os.getloadavg())}
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
                         start_new_session=True)
    low = psutil.virtual_memory().available
    stopped = None
    try:
        while True:
            try:
                out, err = p.communicate(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                low = min(low, psutil.virtual_memory().available)
                if time.monotonic() - t0 > timeout:
                    stopped = f"timed out after {timeout:.0f} s"
                elif low < min_available:
                    stopped = (f"available memory fell to {low / 2**30:.1f} GiB "
                               f"(< --min-available-gib {min_available / 2**30:g})")
                if stopped:
                    os.killpg(p.pid, signal.SIGKILL)
                    out, err = p.communicate()
                    break
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        stray: list[int] = []
        for _ in range(20):  # an engine or JVM may need a moment to see its pipe close: left = still there after 10 s
            stray = [q.pid for q in psutil.process_iter() if _pgid(q.pid) == p.pid]
            if not stray:
                break
            time.sleep(0.5)
        if stray:  # a worker, JVM or engine that outlived the child (it kept the group): none may stay behind
            os.killpg(p.pid, signal.SIGKILL)
        left = _remove_containers([f"agentfly.manager={manager_id}"])
    if stopped:
        err_cls = MemoryGuardError if "memory" in stopped else TimeoutError
        raise err_cls(f"child {env} n={n} {mode} {stopped}; {left} of its containers removed")
    lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        errs = [x.strip() for x in (err or out).splitlines() if "Error" in x and not x.startswith(" ")]
        raise RuntimeError(f"child {env} n={n} {mode} exited {p.returncode}: {errs[-1] if errs else 'no error line'}")
    r = json.loads(lines[-1][7:])
    r["wall_s"] = time.monotonic() - t0
    r["min_available_bytes"] = low
    r["containers_left_after_close"] = left + r.pop("worker_containers_left", 0)
    r["processes_left_after_close"] = len(stray)
    r["measured"] = measured
    proc = r["open"]["pss"] - r["baseline"]["pss"]
    cont = (r["containers"] or {}).get("bytes", 0)
    r["per_episode_pss_bytes"] = proc / n
    r["per_episode_rss_bytes"] = (r["open"]["rss"] - r["baseline"]["rss"]) / n
    r["per_episode_container_bytes"] = cont / n
    r["per_episode_total_bytes"] = (proc + cont) / n
    return r


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else None)
    p = C.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--envs", default=",".join(ENVS), help="comma-separated env names")
    p.add_argument("--modes", default="ours,gym_async")
    p.add_argument("--sizes", default=None, help="override the concurrent episode counts, e.g. 8,32")
    p.add_argument("--timeout", type=float, default=420.0, help="seconds one measurement may take")
    p.add_argument("--merge", action="store_true",
                   help="keep the numbers of an existing result file that this run does not re-measure "
                        "(per env, mode and count)")
    p.add_argument("--min-available-gib", type=float, default=2.0,
                   help="stop a measurement (and the larger counts of that env and mode) when the machine's "
                        "available memory falls below this many GiB (default 2; 0 turns the guard off)")
    args = p.parse_args()
    C.setup_env_vars()
    res = C.Result("bench_memory", args)
    tiny = args.scale == 0
    res.data["scaled_down"] = SCALED_DOWN
    res.data["envs"] = {}
    for env in [e.strip() for e in args.envs.split(",") if e.strip()]:
        if env not in ENVS:
            res.skip(env, f"unknown env; known: {sorted(ENVS)}")
            continue
        why = _r2e_available() if env == "R2EGym" else _available(env)
        if why:
            res.skip(env, why)
            continue
        res.data["envs"][env] = {}
        for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
            sizes = [2] if tiny else ([int(x) for x in args.sizes.split(",")] if args.sizes else SIZES[env][mode])
            rows = []
            for n in sizes:
                with C.skip_on_error(res, f"{env}/{mode}/{n}", trace=False, prefix="") as guard:
                    r = run_child(env, n, mode, args.timeout, args.min_available_gib * 2**30)
                if guard.failed:
                    if "available memory" in res.data["skipped"].get(f"{env}/{mode}/{n}", ""):
                        break  # a larger count would need more memory still
                    continue
                r["n"] = n
                rows.append(r)
                print(f"[{env}] {mode:9s} n={n:3d}: per episode {r['per_episode_total_bytes'] / 2**20:8.1f} MiB "
                      f"(processes PSS {r['per_episode_pss_bytes'] / 2**20:.1f}, containers "
                      f"{r['per_episode_container_bytes'] / 2**20:.1f}), {r['open']['processes']} processes, "
                      f"opened in {r['open_s']:.1f} s", flush=True)
            res.data["envs"][env][mode] = rows
    old = Path(args.out) / "bench_memory.json"
    if args.merge and old.is_file():
        _merge(res, json.loads(old.read_text()))
    for modes in res.data["envs"].values():
        for rows in modes.values():
            for r in rows:
                r.pop("marginal_bytes_per_episode_from_previous", None)
            for a, b in zip(rows, rows[1:]):  # the cost of one more episode, fixed costs cancelled
                tot = {r["n"]: r["per_episode_total_bytes"] * r["n"] for r in (a, b)}
                b["marginal_bytes_per_episode_from_previous"] = (tot[b["n"]] - tot[a["n"]]) / (b["n"] - a["n"])
    return C.finish(res, plot)


def _merge(res: C.Result, prev: dict[str, Any]) -> None:
    """Keep ``prev``'s rows (and skips) for every (env, mode, count) this run did not measure; each kept row
    is listed under ``from_earlier_run`` ("env/mode/n" -> the command that measured it)."""
    earlier = prev.get("from_earlier_run", {})
    ran = set()
    for env, modes in res.data["envs"].items():
        for mode, rows in modes.items():
            ran |= {f"{env}/{mode}/{r['n']}" for r in rows}
    ran |= set(res.data["skipped"])
    for env, modes in prev.get("envs", {}).items():
        for mode, rows in modes.items():
            mine = res.data["envs"].setdefault(env, {}).setdefault(mode, [])
            for r in rows:
                key = f"{env}/{mode}/{r['n']}"
                if key in ran:
                    continue
                mine.append(r)
                # older files name the command per env; newer ones per env/mode/n
                res.data.setdefault("from_earlier_run", {})[key] = earlier.get(key, earlier.get(env, prev.get("command")))
            mine.sort(key=lambda r: r["n"])
    for k, v in prev.get("skipped", {}).items():
        if k not in ran and not any(k == f"{e}/{m}/{r['n']}" for e, ms in res.data["envs"].items()
                                    for m, rs in ms.items() for r in rs):
            res.data["skipped"].setdefault(k, v)


def _available(env: str) -> str | None:
    """None when ``env`` can be made here, else the reason."""
    import gymnasium

    import agentfly_gym  # noqa: F401

    try:
        gymnasium.make(ENVS[env]["id"], **ENVS[env]["kwargs"]).close()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return None


def _r2e_available() -> str | None:
    try:
        import docker

        docker.from_env().ping()
    except Exception as e:  # noqa: BLE001
        return f"no Docker engine: {type(e).__name__}: {e}"
    from bench_async_rollout import env_available

    return env_available("R2EGym", "agentfly/R2EGym-v0")


def plot(res: C.Result) -> None:
    envs = res.data["envs"]
    if not envs:
        return
    fig, ax = C.subplots(figsize=(10, 4.4))
    colors = {"ours": "#1b9e77", "gym_async": "#7570b3"}
    marks = {"ours": "o-", "gym_async": "s--"}
    cmap = C.plt().get_cmap("tab10")
    for i, (env, modes) in enumerate(envs.items()):
        for mode, rows in modes.items():
            if not rows:
                continue
            xs = [r["n"] for r in rows]
            ys = [r["per_episode_total_bytes"] / 2**20 for r in rows]
            ax.plot(xs, ys, marks[mode], color=cmap(i), label=f"{env} {mode}", mfc="white" if mode != "ours" else None)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent episodes")
    ax.set_ylabel("MiB per episode (PSS of the process tree + containers)")
    ax.set_title("Memory per concurrent rollout: ours (one process, shared manager) vs gymnasium AsyncVectorEnv",
                 fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(True, which="both", alpha=0.3)
    C.save_figure(res, fig)
    _ = colors


if __name__ == "__main__":
    sys.exit(main())
