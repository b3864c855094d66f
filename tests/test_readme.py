"""The README's code runs as pasted: every ```python block of README.md, each in a fresh interpreter.

Each block is fed on stdin to ``python -`` (as if pasted into an interpreter, so the current folder is on
``sys.path``), in an empty temporary folder, with the suite's cache folder and without a data folder (the blocks
run on the samples shipped in the package, as a newcomer's do), and must exit 0 within its time limit and leave
no process behind.  Real components throughout: the bundled SmolLM2 model, the simulators, Ray, OpenEnv's own
CLI and server, and the Docker engine for the block that builds an image.

What a block needs beyond that is in :data:`NEEDS`, keyed by a text the block contains, and the README must say
it just before the block (a server started first, ``openenv init`` run first, a Docker engine).  A block that
:data:`NEEDS` does not know runs with no help and the default limit, so a new block that does not run as pasted
fails here.  Two liberties, both for a shared machine: the OpenEnv client block's server runs on a free port,
written over the README's ``8000`` in the block, and each block's ``ray.init()`` gets a temp folder of its own
(``RAY_TMPDIR``, no ``RAY_ADDRESS``), so it starts its own Ray instead of joining someone else's.

Measured on the 2-core development machine under load (``pytest tests/test_readme.py -s``): see each test's
printed ``README block N: exit 0 in S s``; blocks over a minute there are marked ``slow``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from proctools import TREE_MARKER, pids_with_env, wait_gone

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
MIN_BLOCKS = 9


@dataclass(frozen=True)
class Needs:
    """What one README block needs to run (and what the README says beside it)."""

    modules: tuple[str, ...] = ()     # optional extras: skipped when not installed
    setup: tuple[tuple[str, ...], ...] = ()   # commands run first in the block's folder ("{python}" = this Python)
    server: tuple[str, ...] = ()      # a server started first and stopped after ("{port}": a free port)
    docker: bool = False              # a Docker engine (the suite's docker_client fixture)
    said: str = ""                    # what the README says just before the block (so a reader knows it too)
    slow: bool = False                # over a few seconds on a 2-core machine (pytest's ``slow`` marker)
    timeout: float = 300.0


NEEDS: dict[str, Needs] = {
    'make_vec("agentfly/ScienceWorld-v0"': Needs(slow=True, timeout=600),  # ~30 s
    "run_rollouts(": Needs(slow=True, timeout=1200),
    "selfplay.env(": Needs(modules=("pettingzoo",)),
    "RayResourceManager(": Needs(modules=("ray",), slow=True, timeout=600),
    "compute_advantage(": Needs(modules=("verl",), slow=True),       # importing verl: ~1 min
    "GenericEnvClient(": Needs(modules=("openenv.core",), slow=True, timeout=600,
                               said="agentfly-gym serve --env WebShop-v0 --openenv --port 8000",
                               server=("{python}", "-m", "agentfly_gym", "serve", "--env", "WebShop-v0", "--openenv",
                                       "--port", "{port}", "--max-sessions", "4")),
    'app="echo_env.server.app:app"': Needs(modules=("openenv.core",), slow=True, said="openenv init echo_env",
                                           setup=(("{python}", "-m", "openenv.cli", "init", "echo_env"),)),
    "GRPOTrainer(": Needs(modules=("trl",), slow=True, timeout=900),
    "TaskRunner(": Needs(slow=True, timeout=600),
    "serve_gateway(": Needs(slow=True, timeout=600),   # the bundled SmolLM2 behind the gateway
    "mcp_server_spec(": Needs(modules=("mcp",), slow=True, timeout=600),     # a stdio MCP server: ~10-14 s
    "build_openenv_image(": Needs(modules=("openenv.core",), docker=True, slow=True, timeout=1800,
                                  said="needs a Docker engine"),
}


def python_blocks(text: str) -> list[str]:
    """The bodies of the ```python fenced blocks of a Markdown text, in order."""
    return [m.group(1) for m in FENCE.finditer(text)]


def text_before_blocks(text: str, chars: int = 800) -> list[str]:
    """For each ```python block, the ``chars`` characters of the text before it, whitespace collapsed."""
    return [" ".join(text[max(0, m.start() - chars):m.start()].split()) for m in FENCE.finditer(text)]


def _needs(code: str) -> Needs:
    found = [n for key, n in NEEDS.items() if key in code]
    assert len(found) <= 1, f"more than one NEEDS entry matches the block:\n{code}"
    return found[0] if found else Needs()


def _params():
    out = []
    for i, code in enumerate(python_blocks(README.read_text(encoding="utf-8"))):
        need = _needs(code)
        marks = [pytest.mark.slow] * need.slow + [pytest.mark.docker] * need.docker
        marks.append(pytest.mark.timeout(need.timeout + 600))  # set-up, a server's start and the leak check
        first = next((ln.strip() for ln in code.splitlines() if ln.strip()), "")
        out.append(pytest.param(i, code, need, marks=marks, id=f"{i}-{re.sub(r'[^A-Za-z0-9_.]+', '_', first)[:40]}"))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_tree(marker: str) -> set[int]:
    """SIGKILL every process that carries ``marker`` (only processes this test started carry it); return them."""
    left = set(pids_with_env(TREE_MARKER, marker))
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def _wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}: {log.read_text()[-4000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"the server did not listen on port {port} within {timeout:.0f} s")


def test_readme_has_python_blocks():
    """Extraction finds the README's blocks (so the test below cannot pass by finding none), and every
    NEEDS entry still matches a block."""
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) >= MIN_BLOCKS, f"found {len(blocks)} ```python blocks in README.md, expected >= {MIN_BLOCKS}"
    for key in NEEDS:
        assert sum(key in b for b in blocks) == 1, f"NEEDS key {key!r} matches {sum(key in b for b in blocks)} blocks"


def test_python_blocks_helper():
    text = "a\n```python\nx = 1\n```\n```bash\nls\n```\n```python\nimport os\nprint(os.sep)\n```\n"
    assert python_blocks(text) == ["x = 1\n", "import os\nprint(os.sep)\n"]
    assert text_before_blocks(text, 7) == ["a", "ls ```"]


def test_readme_says_what_each_block_needs():
    """A block that needs a step first (a server, ``openenv init``, a Docker engine) says so just before it."""
    text = README.read_text(encoding="utf-8")
    for i, (code, before) in enumerate(zip(python_blocks(text), text_before_blocks(text))):
        need = _needs(code)
        assert need.said.replace("`", "") in before.replace("`", ""), \
            f"README block {i} needs {need.said!r} said before it; the text before it:\n{before}"


@pytest.mark.parametrize(("index", "code", "need"), _params())
def test_readme_block_runs_as_pasted(index, code, need, tmp_path, request):
    for module in need.modules:     # looked up, not imported here (verl's import alone takes a minute)
        if importlib.util.find_spec(module.partition(".")[0]) is None:
            pytest.skip(f"README block {index} needs {module} (an optional extra)")
    if need.docker:
        request.getfixturevalue("docker_client")           # skips, or fails under AGENTFLY_REQUIRE_DOCKER
    marker = f"readme-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    # The suite's environment less its data folder (the blocks run on the package's samples) and less any Ray
    # address: a block's ray.init() starts a Ray of its own in its own temp folder, never joining another's.
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTFLY_GYM_DATA", "RAY_ADDRESS")}
    env[TREE_MARKER] = marker
    env.setdefault("AGENTFLY_GYM_CACHE", str(Path.home() / ".cache" / "agentfly-gym"))
    env["PYTHONUNBUFFERED"] = "1"
    ray_tmp = tempfile.mkdtemp(prefix="afg-ray-", dir="/tmp")   # short: Ray's socket paths must fit
    env["RAY_TMPDIR"] = ray_tmp
    work = tmp_path / "cwd"
    work.mkdir()
    fill = {"python": sys.executable}
    server = None
    left: set[int] = set()
    try:
        for cmd in need.setup:
            out = subprocess.run([c.format(**fill) for c in cmd], cwd=work, env=env, capture_output=True,
                                 text=True, timeout=300)
            assert out.returncode == 0, f"set-up {cmd} failed:\n{out.stdout}{out.stderr}"
        if need.server:
            fill["port"] = str(_free_port())
            code = code.replace("8000", fill["port"])
            server_log = tmp_path / "server.log"
            with open(server_log, "w") as log:
                server = subprocess.Popen([c.format(**fill) for c in need.server], cwd=work, env=env, stdout=log,
                                          stderr=subprocess.STDOUT)
            _wait_port(int(fill["port"]), server, server_log, 180)
        start = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-"], cwd=work, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            output, _ = proc.communicate(code, timeout=need.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            pytest.fail(f"README block {index} ran over {need.timeout:.0f} s:\n{code}\n--- output ---\n{output[-4000:]}")
        took = time.monotonic() - start
        print(f"README block {index}: exit {proc.returncode} in {took:.1f} s")
        assert proc.returncode == 0, f"README block {index} failed (exit {proc.returncode}):\n{code}\n--- output ---\n" \
                                     f"{output[-6000:]}"
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        # What the block opened, it closed: no process it started outlives it (a grace for exit handlers).
        # Whatever is left is killed here, pass or fail; a block that passed fails for it below.
        cmds = pids_with_env(TREE_MARKER, marker)
        left = wait_gone(set(cmds), timeout=30)
        if left:
            cmds = {p: c for p, c in pids_with_env(TREE_MARKER, marker).items() if p in left}
            _kill_tree(marker)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert not left, f"README block {index} left processes behind: {sorted(cmds.values())}"
