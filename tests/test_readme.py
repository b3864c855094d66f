"""The README's and the documentation site's code runs as pasted: every ```python block of README.md and of
docs/**/*.md, each in a fresh interpreter.

Each block is fed on stdin to ``python -`` (as if pasted into an interpreter, so the current folder is on
``sys.path``), in an empty temporary folder, with the suite's cache folder and without a data folder (the blocks
run on the samples shipped in the package, as a newcomer's do), and must exit 0 within its time limit and leave
no process behind.  Real components throughout: the bundled SmolLM2 model, the simulators, Ray, OpenEnv's own
CLI and server, and the Docker engine for the block that builds an image.  A block that appears word for word on
two pages (the README repeats a few of the site's) runs once.

What a block needs beyond that is in :data:`NEEDS`, keyed by a text the block contains, and the page must say
it just before the block (a server started first, ``openenv init`` run first, a Docker engine).  A block that
:data:`NEEDS` does not know runs with no help and the default limit, so a new block that does not run as pasted
fails here.  Two liberties, both for a shared machine: the OpenEnv client block's server runs on a free port,
written over the page's ``8000`` in the block, and each block's ``ray.init()`` gets a temp folder of its own
(``RAY_TMPDIR``, no ``RAY_ADDRESS``), so it starts its own Ray instead of joining someone else's.

Measured on the 2-core development machine under load (``pytest tests/test_readme.py -s``): see each test's
printed ``block PAGE N: exit 0 in S s``; blocks over about ten seconds there are marked ``slow``.
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

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
MIN_README_BLOCKS = 3     # the README's three examples
MIN_DOCS_BLOCKS = 25


@dataclass(frozen=True)
class Needs:
    """What one block needs to run (and what its page says beside it)."""

    modules: tuple[str, ...] = ()     # optional extras: skipped when not installed
    setup: tuple[tuple[str, ...], ...] = ()   # commands run first in the block's folder ("{python}" = this Python)
    server: tuple[str, ...] = ()      # a server started first and stopped after ("{port}": a free port)
    docker: bool = False              # a Docker engine (the suite's docker_client fixture)
    said: str = ""                    # what the README says just before the block (so a reader knows it too)
    slow: bool = False                # over a few seconds on a 2-core machine (pytest's ``slow`` marker)
    timeout: float = 300.0


NEEDS: dict[str, Needs] = {
    'make_vec("agentfly/ScienceWorld-v0"': Needs(slow=True, timeout=600),  # ~30 s
    'env_ids=["Chess-v0", "ScienceWorld-v0"]': Needs(slow=True, timeout=1200),   # the bundled model, two envs
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
    "TaskRunner(": Needs(slow=True, timeout=1200),   # the plain loop trains SmolLM2 on the CPU: over 600 s at load 16
    "serve_gateway(": Needs(slow=True, timeout=600),   # the bundled SmolLM2 behind the gateway
    "mcp_server_spec(": Needs(modules=("mcp",), slow=True, timeout=600),     # a stdio MCP server: ~10-14 s
    'task_name="boil", split="validation"': Needs(slow=True, timeout=600),       # a ScienceWorld JVM
    '"agentfly/ALFWorld-v0", split="validation"': Needs(slow=True, timeout=600),  # TextWorld's first load
    'gymnasium.make("agentfly/WebShop-v0")': Needs(slow=True, timeout=600),      # spaCy and the catalog
    '"agentfly/CodeInterpreter-v0"': Needs(slow=True, timeout=600),            # a sandbox container
    '"agentfly/Retrieval-v0"': Needs(slow=True, timeout=600),                  # the BM25 index
    "pass_at_k(": Needs(slow=True, timeout=600),
    'make_tool_env("my/Add-v0", tasks=[{"prompt"': Needs(slow=True),      # transformers' schema: 23-30 s loaded
    'backend="sandbox", memory="512m"': Needs(slow=True),
    "def make_env() -> str:": Needs(slow=True),
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


def pages() -> list[Path]:
    """README.md, then every page of the documentation site, in path order."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def _page_name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def all_blocks() -> list[tuple[str, int, str, str]]:
    """``(page, index in the page, code, the text just before it)`` of every ```python block of every page."""
    out = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        out += [(_page_name(page), i, code, before)
                for i, (code, before) in enumerate(zip(python_blocks(text), text_before_blocks(text)))]
    return out


def _params():
    out, seen = [], set()
    for page, i, code, _ in all_blocks():
        if code in seen:          # the same block on another page: it ran already
            continue
        seen.add(code)
        need = _needs(code)
        marks = [pytest.mark.slow] * need.slow + [pytest.mark.docker] * need.docker
        marks.append(pytest.mark.timeout(need.timeout + 600))  # set-up, a server's start and the leak check
        first = next((ln.strip() for ln in code.splitlines() if ln.strip()), "")
        name = re.sub(r"[^A-Za-z0-9_.]+", "_", page.removesuffix(".md"))
        out.append(pytest.param(f"{page} {i}", code, need, marks=marks,
                                id=f"{name}-{i}-{re.sub(r'[^A-Za-z0-9_.]+', '_', first)[:40]}"))
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


def test_readme_and_docs_have_python_blocks():
    """Extraction finds the blocks (so the test below cannot pass by finding none), and every NEEDS entry still
    matches a block."""
    blocks = all_blocks()
    in_readme = sum(page == "README.md" for page, *_ in blocks)
    assert in_readme >= MIN_README_BLOCKS, f"found {in_readme} ```python blocks in README.md, expected >= {MIN_README_BLOCKS}"
    assert len(blocks) - in_readme >= MIN_DOCS_BLOCKS, f"found {len(blocks) - in_readme} ```python blocks in docs/"
    for key in NEEDS:
        assert any(key in code for _, _, code, _ in blocks), f"NEEDS key {key!r} matches no block"


def test_python_blocks_helper():
    text = "a\n```python\nx = 1\n```\n```bash\nls\n```\n```python\nimport os\nprint(os.sep)\n```\n"
    assert python_blocks(text) == ["x = 1\n", "import os\nprint(os.sep)\n"]
    assert text_before_blocks(text, 7) == ["a", "ls ```"]


def test_each_page_says_what_each_block_needs():
    """A block that needs a step first (a server, ``openenv init``, a Docker engine) says so just before it."""
    for page, i, code, before in all_blocks():
        need = _needs(code)
        assert need.said.replace("`", "") in before.replace("`", ""), \
            f"{page} block {i} needs {need.said!r} said before it; the text before it:\n{before}"


@pytest.mark.parametrize(("index", "code", "need"), _params())
def test_block_runs_as_pasted(index, code, need, tmp_path, request):
    for module in need.modules:     # looked up, not imported here (verl's import alone takes a minute)
        if importlib.util.find_spec(module.partition(".")[0]) is None:
            pytest.skip(f"block {index} needs {module} (an optional extra)")
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
            pytest.fail(f"block {index} ran over {need.timeout:.0f} s:\n{code}\n--- output ---\n{output[-4000:]}")
        took = time.monotonic() - start
        print(f"block {index}: exit {proc.returncode} in {took:.1f} s")
        assert proc.returncode == 0, f"block {index} failed (exit {proc.returncode}):\n{code}\n--- output ---\n" \
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
    assert not left, f"block {index} left processes behind: {sorted(cmds.values())}"
