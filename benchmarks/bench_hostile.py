"""Hostile-model campaign: the attacks (stalls, crashes and host reach from model output), run as a
model would run them, on both container backends, with counts.

Each attack runs ``--repeats`` times (default 3 x scale, at least 1) per backend where it applies and counts
``contained`` (the attack had no effect beyond its sandbox: no stalled or crashed step, nothing on the host
past the cap) against ``escaped``; ``errors`` counts runs that failed for another reason (setup).

Attacks (R2E-Gym ones go through ``R2EGym-v0`` tool actions; the others through ``ContainerResource.exec``):

* ``fifo``: FIFOs at ``/tmp/.afg_r2e/payload.json`` and ``run_tests.sh``, then a large file_editor call and
  ``finish``: every step answers within ``--guard`` seconds; afterwards the default thread pool still answers.
* ``symlink``: a symlink at ``payload.json`` to ``/etc/passwd`` through the vector env: the batch step
  returns (reward 0, ``info["error"]`` for that sub-env) and ``/etc/passwd`` is unchanged.
* ``log``: ``head -c 20M /dev/zero > /proc/1/fd/1`` (Docker): the container's log holds at most 2.5 MB.
* ``disk``: 2 GB written at full speed against ``disk=256m``: the host holds at most the limit (+1 MB).
* ``inodes``: 300,000 symlinks against ``disk=256m``: refused before the end.
* ``loopback``: with ``network=True``, a server on the host's 127.0.0.1 does not answer (at 127.0.0.1,
  10.0.2.2 or 172.17.0.1).
* ``pid1``: ``/proc/1/environ`` and ``/proc/*/cmdline`` hold no host path of the project or the sandbox folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import _common as C

REPO = Path(__file__).resolve().parents[1]
R2E_TASKS = REPO / "tests" / "fixtures" / "r2e" / "tasks.jsonl"
sys.path.insert(0, str(REPO / "tests"))
from proctools import host_usage  # noqa: E402  (the test suite's measure of host usage, shared)
LIMIT = 256 * 1024 * 1024


def _xml(tool: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>{v}</parameter>\n" for k, v in params.items())
    return f"<function={tool}>\n{body}</function>"


BIG_EDIT = _xml("file_editor", command="create", path="/testbed/big.txt", file_text="é" * 20_000)




def _spec(backend: str, **kw: Any):
    from agentfly_gym.resources import ContainerSpec
    from agentfly_gym.images.base import build_base_image

    image = build_base_image() if backend == "docker" else "host"
    return ContainerSpec(image=image, backend=backend, workdir="/testbed", memory="512m", **kw)


async def attack_fifo(backend: str, args) -> tuple[bool, str]:
    from agentfly_gym.envs.r2egym import R2EGymEnv
    from agentfly_gym.resources import ResourceManager

    m = ResourceManager()
    kw = {"image": "host"} if backend == "sandbox" else {}
    env = R2EGymEnv(tasks=R2E_TASKS, manager=m, backend=backend, max_instances=1, **kw)
    plant = _xml("execute_bash", cmd="mkdir -p /tmp/.afg_r2e && mkfifo /tmp/.afg_r2e/payload.json "
                                     "/tmp/.afg_r2e/run_tests.sh; echo planted")
    try:
        await asyncio.wait_for(env.areset(options={"task_id": "minicalc-bug1"}), args.guard)
        await asyncio.wait_for(env.astep(plant), args.guard)
        obs, *_ = await asyncio.wait_for(env.astep(BIG_EDIT), args.guard)
        _, reward, term, trunc, _ = await asyncio.wait_for(env.astep(_xml("finish")), args.guard)
        pool_ok = await asyncio.wait_for(asyncio.to_thread(lambda: True), 5)
        return bool(pool_ok and (term or trunc) and reward == 0.0), obs[:120]
    except TimeoutError:
        return False, "a step hung"
    finally:
        await env.aclose()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(m.aclose(), 60)


async def attack_symlink(backend: str, args) -> tuple[bool, str]:
    from agentfly_gym.envs.r2egym import R2EGymEnv
    from agentfly_gym.resources import ResourceManager
    from agentfly_gym.vector import AsyncTextVectorEnv

    before = Path("/etc/passwd").read_bytes()
    m = ResourceManager()
    kw = {"image": "host"} if backend == "sandbox" else {}
    venv = AsyncTextVectorEnv([lambda: R2EGymEnv(tasks=R2E_TASKS, manager=m, backend=backend, **kw)] * 2)
    try:
        await venv.areset(options={"task_id": "minicalc-bug1"})
        link = _xml("execute_bash", cmd="mkdir -p /tmp/.afg_r2e && ln -sf /etc/passwd /tmp/.afg_r2e/payload.json")
        await venv.astep([link, _xml("execute_bash", cmd="true")])
        obs, rew, term, trunc, infos = await asyncio.wait_for(venv.astep([BIG_EDIT, _xml("execute_bash", cmd="true")]),
                                                               args.guard)
        ok = Path("/etc/passwd").read_bytes() == before and rew[0] == 0.0
        return ok, str(infos["error"][0])[:120]
    except Exception as e:  # the batch step raised: one model's action crashed the batch
        return False, f"{type(e).__name__}: {e}"[:200]
    finally:
        await venv.aclose()
        await m.aclose()


async def _with_box(spec, fn):
    from agentfly_gym.resources import ResourceManager

    m = ResourceManager()
    try:
        async with m.scope("hostile") as scope:
            box = await scope.acquire(spec)
            return await fn(box)
    finally:
        await m.aclose()


def _docker_paths(box) -> tuple[str, str]:
    info = box.engine.client().api.inspect_container(box.container_id)
    return info["GraphDriver"]["Data"].get("UpperDir", ""), info["LogPath"]


async def attack_log(backend: str, args) -> tuple[bool, str]:
    async def run(box):
        await box.exec("head -c 20M /dev/zero > /proc/1/fd/1", user="root", timeout=60)
        await asyncio.sleep(1.0)
        _, log_path = _docker_paths(box)
        size = sum(p.stat().st_size for p in Path(log_path).parent.glob(Path(log_path).name + "*"))
        return size <= 2.5 * 1024 * 1024, f"log {size} bytes"
    return await _with_box(_spec(backend, disk=LIMIT), run)


async def attack_disk(backend: str, args) -> tuple[bool, str]:
    async def run(box):
        t0 = time.monotonic()
        try:
            await box.exec("dd if=/dev/zero of=/tmp/big bs=4M count=512 2>&1", user="root", timeout=120)
        except Exception as e:  # the watchdog's ResourceDied: contained only if the host stayed under the cap
            note = f"{type(e).__name__}"
        else:
            note = "exec returned"
        took = time.monotonic() - t0
        where = _docker_paths(box)[0] if backend == "docker" else str(box.state_dir)
        used, _ = host_usage(where)
        mode = box.describe()["limits_enforced"]["disk"]
        return used <= LIMIT + 1024 * 1024, f"{used} bytes on the host in {took:.1f} s ({note}; disk mode {mode})"
    return await _with_box(_spec(backend, disk=LIMIT), run)


async def attack_inodes(backend: str, args) -> tuple[bool, str]:
    prog = ("import os\nos.makedirs('/tmp/l', exist_ok=True)\nn = 0\ntry:\n    while n < 300000: "
            "os.symlink('/tmp', f'/tmp/l/{n}'); n += 1\nexcept OSError as e: print(e.strerror)\nprint('made', n)")

    async def run(box):
        r = await box.exec(["python3", "-c", prog], user="root", timeout=300)
        made = int(r.output.rsplit("made", 1)[1]) if "made" in r.output else -1
        return 0 <= made < 300_000, f"{made} symlinks made"
    return await _with_box(_spec(backend, disk=LIMIT), run)


async def attack_loopback(backend: str, args) -> tuple[bool, str]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]
    probe = ("import socket\nfor h in ('127.0.0.1', '10.0.2.2', '172.17.0.1'):\n    s = socket.socket(); "
             f"s.settimeout(3)\n    try: s.connect((h, {port})); print(h, 'CONNECTED')\n    except OSError: pass")

    async def run(box):
        r = await box.exec(["python3", "-c", probe], user="root", timeout=60)
        return "CONNECTED" not in r.output, r.output.strip()[:120] or "no host loopback port answered"
    try:
        return await _with_box(_spec(backend, network=True), run)
    finally:
        srv.close()


async def attack_pid1(backend: str, args) -> tuple[bool, str]:
    from agentfly_gym.resources.containers.sandbox.container import sandbox_root

    secrets = [str(REPO), str(sandbox_root())]
    show = "tr '\\0' '\\n' < /proc/1/environ; for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done"

    async def run(box):
        r = await box.exec(["/bin/sh", "-c", show], user="root")
        found = [s for s in secrets if s in r.output]
        return not found, f"host paths seen: {found}" if found else "no host path"
    return await _with_box(_spec(backend), run)


# fifo and symlink are the sandbox's: Docker writes and reads files through the engine's archive API,
# which never opens a path of the container on the host
ATTACKS = {"fifo": (attack_fifo, ("sandbox",)), "symlink": (attack_symlink, ("sandbox",)),
           "log": (attack_log, ("docker",)), "disk": (attack_disk, ("sandbox", "docker")),
           "inodes": (attack_inodes, ("sandbox", "docker")), "loopback": (attack_loopback, ("sandbox", "docker")),
           "pid1": (attack_pid1, ("sandbox", "docker"))}


def backend_available(backend: str) -> str | None:
    if backend == "sandbox":
        return None if shutil.which("bwrap") else "no bubblewrap"
    from agentfly_gym.resources.containers.docker import docker_available

    return None if docker_available() else "no Docker engine answers"


async def campaign(args, res: C.Result) -> dict[str, Any]:
    counts: dict[str, dict[str, dict[str, int]]] = defaultdict(dict)
    notes: dict[str, list[str]] = defaultdict(list)
    backends = [b for b in args.backends.split(",") if b]
    for b in backends:
        why = backend_available(b)
        if why:
            res.skip(b, why)
    for name in [a for a in args.attacks.split(",") if a]:
        fn, where = ATTACKS[name]
        for backend in backends:
            if backend not in where or backend in res.data["skipped"]:
                continue
            c = {"attempts": 0, "contained": 0, "escaped": 0, "errors": 0}
            for _ in range(args.repeats):
                c["attempts"] += 1
                try:
                    ok, note = await asyncio.wait_for(fn(backend, args), args.guard * 4)
                except Exception as e:
                    c["errors"] += 1
                    notes[f"{name}/{backend}"].append(f"error {type(e).__name__}: {e}"[:200])
                    continue
                c["contained" if ok else "escaped"] += 1
                notes[f"{name}/{backend}"].append(note)
            counts[name][backend] = c
            print(f"[bench_hostile] {name:9s} {backend:8s} {c}", flush=True)
    total = {k: sum(c[k] for per in counts.values() for c in per.values())
             for k in ("attempts", "contained", "escaped", "errors")}
    return {"counts": counts, "total": total, "notes": notes}


def plot(res: C.Result) -> None:
    counts = (res.data.get("results") or {}).get("counts") or {}
    labels = [f"{a}\n{b}" for a, per in counts.items() for b in per]
    fig, ax = C.subplots(1, 1, figsize=(max(6, len(labels) * 0.8), 4))
    for j, (k, color) in enumerate((("contained", "tab:green"), ("escaped", "tab:red"), ("errors", "tab:gray"))):
        vals = [c[k] for per in counts.values() for c in per.values()]
        ax.bar([i + j * 0.27 for i in range(len(labels))], vals, 0.27, label=k, color=color)
    ax.set_xticks([i + 0.27 for i in range(len(labels))])
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_title("hostile-model attacks per backend (goal: 0 escaped)")
    ax.legend(fontsize=7)
    C.save_figure(res, fig)


def main() -> int:
    C.setup_env_vars()
    p = C.base_parser(__doc__.splitlines()[0])
    p.add_argument("--attacks", default=",".join(ATTACKS))
    p.add_argument("--backends", default="sandbox,docker")
    p.add_argument("--guard", type=float, default=60.0, help="seconds after which a step counts as hung")
    args = p.parse_args()
    for a in args.attacks.split(","):
        if a and a not in ATTACKS:
            p.error(f"unknown attack {a!r}; valid: {', '.join(ATTACKS)}")
    args.repeats = args.repeats or C.scaled(3, args.scale, 1)
    res = C.Result("bench_hostile", args)
    own = None
    if "AGENTFLY_GYM_SANDBOX_DIR" not in os.environ:
        own = os.environ["AGENTFLY_GYM_SANDBOX_DIR"] = tempfile.mkdtemp(prefix="agentfly-hostile-")
    res.data["config"] = {k: v for k, v in vars(args).items() if k != "out"}
    try:
        res.data["results"] = asyncio.run(campaign(args, res))
    finally:
        if own:
            shutil.rmtree(own, ignore_errors=True)
    print(res.data["results"]["total"], flush=True)
    return C.finish(res, plot)


if __name__ == "__main__":
    sys.exit(main())
