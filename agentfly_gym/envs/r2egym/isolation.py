"""Isolated grading of R2E-Gym episodes: the model's work leaves as a filtered diff, the verdict comes
from a structured report.

As the SWE-bench harness does, the episode's container is not trusted at grading: the model ran code
there (background processes, wrappers around the interpreter, start-up hooks).  Instead:

1. the model's work leaves the episode as a ``git diff --binary`` of ``/testbed`` against the task's
   base snapshot (new untracked files included), produced in the episode's container and sent out as
   base64 text on the command's standard output (no host read of a path the model controls);
2. :func:`filter_diff` parses that diff on the host with a strict grammar and keeps only changes a fix
   may make: files that steer test collection or the interpreter (``conftest.py`` anywhere, pytest's
   configuration files, ``sitecustomize``/``usercustomize``, ``.pth`` files, compiled modules, package
   metadata with entry points, modules that shadow the test runner, the standard library or an installed
   package, the modules ``PYTEST_PLUGINS`` or ``-p`` names, the hidden tests' files and folders; a start-up hook or a
   plugin as a file or as a package alike), symbolic links and submodules are dropped and listed;
3. the hidden tests run in a fresh container (a separate grading pool of the same image and limits) on
   a clean copy of the task with the kept diff applied, and the statuses are read from pytest's JUnit
   XML report, written outside ``/testbed`` (:func:`junit_test_map`), not from the text summary;
4. the tests run through the grading launcher (:mod:`.grading_guard`, in place of ``python -m pytest``; see
   :func:`guard_command`), because the package code the hidden tests import runs inside the pytest process and
   can rewrite pytest's in-memory state before the report is written (a 9-line edit of the package's
   ``__init__.py`` wrapping ``_pytest.reports.TestReport.__init__`` scored 1.0 on an unfixed task before it).
   Before any task code runs, the launcher installs PEP 578 audit hooks, snapshots pytest's and pluggy's
   namespaces and hook implementations, checks them at every test report, and after pytest returns writes a
   seal signed with a key only it and the host know.  The host keeps the verdict only when the seal is there
   and authentic, reports nothing tampered with, and agrees with the JUnit report (:func:`seal_problems`); a
   wrapped ``TestReport.__init__``, a swapped ``_pytest.runner`` function, a patched pluggy class, a pass-all
   plugin registered at run time, a JUnit report rewritten (at unconfigure, at exit) or a run that ends early
   (``os._exit``) score 0.  Its tamper probes (:mod:`.guard_probes`), tests that must fail when pytest, the standard
   library and builtins are honest, run in each hidden test file under names drawn from the key: generic tampering
   (``unittest``'s assertions, a builtin or ``math.isclose`` patched, the items' functions or the hook relay swapped)
   makes one pass, and the run scores 0 with ``info["grading"]["tampered"]``.

What remains open: this raises the bar, it is not a proof.  On CPython (3.11, 3.12) assigning a class
attribute raises no audit event, so such edits are caught when the snapshot is checked (at each test report
and at the end), not refused; code that edits and restores pytest's state between two checks, reaches a frame
of the launcher through a traceback, or works from a C extension can still forge what it sees.  The hidden
tests' own code also runs in the same process as the code under test, so substituting the test functions
(``item.obj``) or returning objects that compare equal to everything is outside what the launcher checks.  A
script that does not run pytest as ``python -m pytest`` exactly once runs unguarded (recorded in
``info["grading"]["guard"]["applied"]``), and an interpreter older than 3.8 (no audit hooks) is only sealed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable

__all__ = [
    "CONFIG_FILES",
    "RUNNER_MODULES",
    "DiffRules",
    "FilteredDiff",
    "filter_diff",
    "guard_command",
    "plugin_modules",
    "junit_test_map",
    "seal_problems",
    "shadow_candidates",
    "without_probes",
    "xpass_names",
]

#: Files whose content steers pytest's collection or options, wherever they are (pytest looks for them
#: in the common ancestor of the test paths and above).  Their changes are dropped entirely.
CONFIG_FILES = frozenset({"conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini",
                          "setup.cfg", "pyproject.toml"})
#: Modules the interpreter runs at start-up when found on ``sys.path``, as a file or a package.
STARTUP_MODULES = frozenset({"sitecustomize", "usercustomize"})
#: Top-level module names of the test runner and its dependencies: a file or package with one of these
#: names at the repository root (or under ``src/``) would run instead of the real one.
RUNNER_MODULES = frozenset({"pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging", "exceptiongroup",
                            "tomli", "colorama", "pygments", "xdist", "execnet"})
_COMPILED_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd")
_MODES_OK = {b"100644", b"100755"}
_MAX_REASON_PATHS = 200

_HUNK = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@.*\n\Z", re.S)
_BASE85_LINE = re.compile(rb"^[A-Za-z][0-9A-Za-z!#$%&()*+\-;<=>?@^_`{|}~]+\n\Z")
_BINARY_HEAD = re.compile(rb"^(literal|delta) \d+\n\Z")
_INDEX = re.compile(rb"^index [0-9a-f]+\.\.[0-9a-f]+(?: (\d+))?\n\Z")
_MODE_LINE = re.compile(rb"^(old mode|new mode|deleted file mode|new file mode) (\d+)\n\Z")
_C_ESCAPES = {ord("a"): 7, ord("b"): 8, ord("t"): 9, ord("n"): 10, ord("v"): 11, ord("f"): 12, ord("r"): 13,
              ord('"'): 34, ord("\\"): 92}


@dataclasses.dataclass(frozen=True)
class DiffRules:
    """What of a diff comes from the task rather than from the episode.

    Attributes:
        protected_files: repository-relative paths taken from the task (the hidden test files).
        protected_dirs: repository-relative folders taken from the task (the hidden tests' folders),
            without a trailing slash.
        shadowing: top-level module names (``"numpy"``, or ``"src/numpy"`` under ``src/``) that a NEW file
            may not define because the grading interpreter imports them from elsewhere (the standard
            library, an installed package); see :func:`shadow_candidates`.
        plugins: top-level module names that ``PYTEST_PLUGINS`` names where the hidden tests run: no change to
            such a module, file or package, is kept.
    """

    protected_files: frozenset[str] = frozenset()
    protected_dirs: tuple[str, ...] = ()
    shadowing: frozenset[str] = frozenset()
    plugins: frozenset[str] = frozenset()


@dataclasses.dataclass
class FilteredDiff:
    """The result of :func:`filter_diff`.

    Attributes:
        diff: the kept file sections, verbatim (bytes of a ``git diff --binary``; empty when nothing is kept).
        kept: repository-relative paths whose changes are kept.
        dropped: ``{"path": ..., "reason": ...}`` for every change left out (at most 200 listed, then one
            entry counting the rest).
    """

    diff: bytes
    kept: list[str]
    dropped: list[dict[str, str]]


def _unquote(raw: bytes) -> bytes | None:
    """A git path as written in a diff header: plain, or C-quoted (``"a/\\303\\244"``); None if malformed."""
    if not raw.startswith(b'"'):
        return raw
    if len(raw) < 2 or not raw.endswith(b'"'):
        return None
    body, out, i = raw[1:-1], bytearray(), 0
    while i < len(body):
        c = body[i]
        if c == 0x5C:  # backslash
            if i + 1 >= len(body):
                return None
            n = body[i + 1]
            if n in _C_ESCAPES:
                out.append(_C_ESCAPES[n])
                i += 2
            elif 0x30 <= n <= 0x37 and re.fullmatch(rb"[0-7]{3}", body[i + 1:i + 4]):
                out.append(int(body[i + 1:i + 4], 8) & 0xFF)
                i += 4
            else:
                return None
        elif c == 0x22:
            return None
        else:
            out.append(c)
            i += 1
    return bytes(out)


def _header_path(line: bytes) -> bytes | None:
    """The path of a ``diff --git a/P b/P`` line (no renames: both sides name the same path)."""
    rest = line[len(b"diff --git "):].rstrip(b"\n")
    if rest.startswith(b'"'):
        m = re.fullmatch(rb'("(?:[^"\\]|\\.)*") ("(?:[^"\\]|\\.)*")', rest)
        if not m:
            return None
        a, b = _unquote(m.group(1)), _unquote(m.group(2))
    else:
        if (len(rest) - 5) % 2 or len(rest) < 7:
            return None
        n = (len(rest) - 5) // 2
        a, b = rest[:n + 2], rest[n + 3:]
        if rest[n + 2:n + 3] != b" ":
            return None
    if a is None or b is None or not a.startswith(b"a/") or not b.startswith(b"b/") or a[2:] != b[2:]:
        return None
    return a[2:]


def _side_path(line: bytes, prefix: bytes, side: bytes) -> bytes | None:
    raw = line[len(prefix):].rstrip(b"\n")
    if raw.endswith(b"\t"):
        raw = raw[:-1]
    if raw == b"/dev/null":
        return b"/dev/null"
    p = _unquote(raw)
    if p is None or not p.startswith(side):
        return None
    return p[len(side):]


def _check_section(lines: list[bytes]) -> tuple[bytes | None, bool, str | None]:
    """``(path, added, problem)`` of one file section; ``problem`` is None when it is well formed."""
    path = _header_path(lines[0])
    if path is None:
        return None, False, "malformed diff header"
    added, i, n = False, 1, len(lines)
    while i < n and (m := _MODE_LINE.match(lines[i]) or _INDEX.match(lines[i])):
        mode = m.group(2) if m.re is _MODE_LINE else m.group(1)
        if m.re is _MODE_LINE and m.group(1) == b"new file mode":
            added = True
        if mode is not None and mode not in _MODES_OK:
            kind = {b"120000": "symbolic link", b"160000": "submodule"}.get(mode, f"file mode {mode.decode()}")
            return path, added, f"a {kind} (only regular files are applied)"
        i += 1
    if i == n:
        return path, added, None  # a mode change, or an empty file added or deleted
    if lines[i] == b"GIT binary patch\n":
        i += 1
        for block in range(2):
            if i == n and block == 1:
                break
            if i >= n or not _BINARY_HEAD.match(lines[i]):
                return path, added, "malformed binary patch"
            i += 1
            while i < n and _BASE85_LINE.match(lines[i]):
                i += 1
            if i >= n or lines[i] != b"\n":
                return path, added, "malformed binary patch"
            i += 1
        return (path, added, None) if i == n else (path, added, "text after a binary patch")
    if lines[i].startswith(b"Binary files "):
        return path, added, "a binary change without its data"
    if i + 1 >= n or not lines[i].startswith(b"--- ") or not lines[i + 1].startswith(b"+++ "):
        return path, added, "malformed diff (no ---/+++ lines)"
    old, new = _side_path(lines[i], b"--- ", b"a/"), _side_path(lines[i + 1], b"+++ ", b"b/")
    if old not in (path, b"/dev/null") or new not in (path, b"/dev/null") or old == new == b"/dev/null":
        return path, added, "---/+++ paths differ from the header"
    added = added or old == b"/dev/null"
    i += 2
    if i == n:
        return path, added, "no hunks"
    while i < n:
        m = _HUNK.match(lines[i])
        if not m:
            return path, added, "text outside a hunk"
        n_old = int(m.group(2)) if m.group(2) is not None else 1
        n_new = int(m.group(4)) if m.group(4) is not None else 1
        i += 1
        while i < n and (n_old > 0 or n_new > 0):
            c = lines[i][:1]
            if c in (b" ", b"\n"):
                n_old, n_new = n_old - 1, n_new - 1
            elif c == b"-":
                n_old -= 1
            elif c == b"+":
                n_new -= 1
            elif c != b"\\":
                return path, added, "malformed hunk"
            i += 1
        if n_old != 0 or n_new != 0:
            return path, added, "hunk line counts do not match"
        while i < n and lines[i].startswith(b"\\"):
            i += 1
    return path, added, None


def _path_problem(path: str, added: bool, rules: DiffRules) -> str | None:
    """Why a change to ``path`` is taken from the task instead of the episode, or None to keep it."""
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..", ".git") for p in parts) or "\x00" in path:
        return "invalid path"
    name = parts[-1]
    if name == "conftest.py":
        return "conftest.py steers test collection"
    if name in CONFIG_FILES:
        return "test configuration file"
    if any(p.split(".")[0] in STARTUP_MODULES for p in parts) or any(p.endswith(".pth") for p in parts):
        return "interpreter start-up hook"  # sitecustomize.py, sitecustomize/__init__.py, a .pth (file or folder)
    if name.endswith(_COMPILED_SUFFIXES) or "__pycache__" in parts:
        return "compiled module (may run instead of its source)"
    if any(p.endswith((".egg-info", ".dist-info")) for p in parts) or any(p.endswith(".egg-link") for p in parts):
        return "package metadata (entry points load pytest plugins)"
    if ".pytest_cache" in parts:
        return "pytest cache"
    if "site-packages" in parts or "dist-packages" in parts:
        return "installed packages (a virtual environment inside the repository holds the test runner)"
    if path in rules.protected_files:
        return "hidden test file (comes from the task)"
    if any(path == d or path.startswith(d + "/") for d in rules.protected_dirs):
        return "hidden tests' folder (comes from the task)"
    for root in ((), ("src",)):
        if len(parts) > len(root) and tuple(parts[:len(root)]) == root:
            top = parts[len(root)]
            mod = top[:-3] if top.endswith(".py") and len(parts) == len(root) + 1 else top
            if mod in RUNNER_MODULES or mod.startswith(("pytest", "_pytest")):
                return f"shadows the test runner's module {mod!r}"
            key = "/".join((*root, mod))
            if added and key in rules.shadowing:
                return f"a new module that shadows the installed module {mod!r}"
            if mod.split(".")[0] in rules.plugins:
                return f"a pytest plugin that PYTEST_PLUGINS names ({mod!r})"
    return None


def _sections(diff: bytes) -> tuple[bytes, list[list[bytes]]]:
    lines = diff.splitlines(keepends=True)
    pre: list[bytes] = []
    out: list[list[bytes]] = []
    for line in lines:
        if line.startswith(b"diff --git "):
            out.append([line])
        elif out:
            out[-1].append(line)
        else:
            pre.append(line)
    return b"".join(pre), out


def shadow_candidates(diff: bytes) -> list[str]:
    """Top-level module names that NEW files of ``diff`` would define at the repository root or under
    ``src/`` (``"numpy"``, ``"src/numpy"``): the names to check against the grading interpreter."""
    names: set[str] = set()
    for sec in _sections(diff)[1]:
        path, added, problem = _check_section(sec)
        if path is None or problem is not None or not added:
            continue
        parts = path.decode("utf-8", "surrogateescape").split("/")
        for root in ((), ("src",)):
            if len(parts) > len(root) and tuple(parts[:len(root)]) == root:
                top = parts[len(root)]
                mod = top[:-3] if top.endswith(".py") and len(parts) == len(root) + 1 else top
                if mod.isidentifier():
                    names.add("/".join((*root, mod)))
    return sorted(names)


def filter_diff(diff: bytes, rules: DiffRules = DiffRules()) -> FilteredDiff:
    """Split a ``git diff --binary --no-renames`` into the changes a fix may make and those it may not.

    Args:
        diff: the diff's bytes (paths relative to the repository root, ``a/``/``b/`` prefixes).
        rules: what comes from the task (hidden tests, shadowed module names).

    Returns:
        A :class:`FilteredDiff`; its ``diff`` holds only well-formed sections of regular files that pass
        the rules, verbatim, so ``git apply`` on it touches exactly ``kept``.
    """
    pre, sections = _sections(diff)
    kept_bytes: list[bytes] = []
    kept: list[str] = []
    dropped: list[dict[str, str]] = []
    if pre.strip():
        dropped.append({"path": "", "reason": "text before the first file diff"})
    for sec in sections:
        raw, added, problem = _check_section(sec)
        path = raw.decode("utf-8", "surrogateescape") if raw is not None else ""
        reason = problem or _path_problem(path, added, rules)
        if reason is None:
            kept_bytes.append(b"".join(sec))
            kept.append(path)
        else:
            dropped.append({"path": path.encode("utf-8", "surrogateescape").decode("utf-8", "replace"),
                            "reason": reason})
    if len(dropped) > _MAX_REASON_PATHS:
        more = len(dropped) - _MAX_REASON_PATHS
        dropped = dropped[:_MAX_REASON_PATHS] + [{"path": "", "reason": f"... and {more} more dropped changes"}]
    return FilteredDiff(b"".join(kept_bytes), kept, dropped)


# ------------------------------------------------------------------------------------------ JUnit report
_RANK = {"PASSED": 0, "ERROR": 1, "FAILED": 2}


def _dotted(path: str) -> str:
    return re.sub(r"\.py$", "", path.replace("/", "."))


def junit_test_map(xml: bytes | str, *, test_files: Iterable[str] = ()) -> dict[str, str]:
    """The ``{test name: "PASSED"|"FAILED"|"ERROR"}`` map of a pytest JUnit XML report (``junit_family=xunit1``).

    Names as R2E-Gym's log parser makes them (the node id after its file, ``::`` turned into ``.``:
    ``tests/test_x.py::TestA::test_b[1]`` -> ``TestA.test_b[1]``; a collection error of a file -> ``""``).
    Statuses as the order of pytest's ``-rA`` summary decides them: a test with a ``<failure>`` is
    FAILED, else one with an ``<error>`` (setup or teardown) is ERROR, else a test that ran is PASSED;
    skipped and xfailed tests are left out.

    Args:
        xml: the report's bytes.
        test_files: repository-relative test files, used to find where a test's module ends in its JUnit
            ``classname`` when the ``file`` attribute names another file (inherited tests).

    Raises:
        ValueError: the report is not well-formed XML.
    """
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as e:
        raise ValueError(f"the JUnit report is not well-formed XML: {e}") from None
    cases = list(root.iter("testcase"))
    modules = {_dotted(f) for f in test_files}
    modules |= {_dotted(c.get("file", "")) for c in cases if c.get("file")}
    modules.discard("")
    out: dict[str, str] = {}
    for c in cases:
        classname, name = c.get("classname", ""), c.get("name", "")
        tags = {child.tag for child in c}
        if "failure" in tags:
            status = "FAILED"
        elif "error" in tags:
            status = "ERROR"
        elif "skipped" in tags:
            continue
        else:
            status = "PASSED"
        if not classname:
            key = ""  # a collection error: upstream's parser names it by the part after '::', i.e. nothing
        else:
            mod = _dotted(c.get("file", ""))
            if not (classname == mod or classname.startswith(mod + ".")) or not mod:
                mod = max((m for m in modules if classname == m or classname.startswith(m + ".")), key=len,
                          default=classname)
            rest = classname[len(mod) + 1:]
            key = ".".join([*([rest] if rest else []), name.replace("::", ".")])
        if key not in out or _RANK[status] > _RANK[out[key]]:
            out[key] = status
    return out


def xpass_names(log: str) -> set[str]:
    """Names (as in :func:`junit_test_map`) of the tests a ``pytest -rA`` log lists as ``XPASS``.

    JUnit XML records a non-strict unexpected pass as a pass, while R2E-Gym's parser of the summary leaves
    it out; only these names are taken from the log, and only to leave PASSED entries out (which can never
    turn a failing test into a passing one).
    """
    from .grading import decolor

    text = decolor(log)
    if "short test summary info" not in text:
        return set()
    out = set()
    for line in text.split("short test summary info", 1)[1].split("\n"):
        if line.startswith("XPASS "):
            nodeid = line[len("XPASS "):].split(" ", 1)[0]
            if "::" in nodeid:
                out.add(".".join(nodeid.split("::")[1:]))
    return out


def isolated_test_map(xml: bytes | None, log: str, *, test_files: Iterable[str] = ()) -> dict[str, str]:
    """:func:`junit_test_map` of ``xml`` without the tests the log calls XPASS (``{}`` without a report)."""
    if not xml:
        return {}
    m = junit_test_map(xml, test_files=test_files)
    for k in xpass_names(log):
        if m.get(k) == "PASSED":
            del m[k]
    return m


_PLUGIN_NAMES = re.compile(r"PYTEST_PLUGINS=[\"']?([\w.,]+)|(?<![\w-])-p\s*[\"']?([\w.]+)")


def plugin_modules(script: str | None, environ_value: str = "") -> frozenset[str]:
    """Top-level module names of the pytest plugins a task's test run loads by name: ``PYTEST_PLUGINS`` in the
    grading container's environment (``environ_value``) or in its ``run_tests.sh``, and ``-p NAME`` there (not
    ``-p no:NAME``)."""
    names = set(environ_value.split(","))
    for a, b in _PLUGIN_NAMES.findall(script or ""):
        names.update(a.split(",") if a else [] if b.startswith("no:") else [b])
    return frozenset(n.strip().split(".")[0] for n in names if n.strip() and n.strip() != "no")


def as_rules(protected_files: Iterable[str], protected_dirs: Iterable[str], shadowing: Iterable[str]) -> DiffRules:
    """A :class:`DiffRules` from plain iterables (folders without trailing slashes)."""
    return DiffRules(frozenset(protected_files), tuple(d.rstrip("/") for d in protected_dirs if d.strip("/")),
                     frozenset(shadowing))


def hidden_test_rules(hidden_tests: Iterable[str]) -> tuple[frozenset[str], tuple[str, ...]]:
    """``(files, folders)`` of a task's hidden tests: the files, and each file's folder when its name says it
    holds tests (``tests/``, ``test/``, ``pkg/tests/``; not a package folder that merely holds a test module),
    plus R2E-Gym's ``r2e_tests``."""
    files = frozenset(hidden_tests)
    dirs = {"r2e_tests"}
    for f in files:
        parent = f.rsplit("/", 1)[0] if "/" in f else ""
        if parent and parent.rsplit("/", 1)[-1].lower().startswith("test"):
            dirs.add(parent)
    return files, tuple(sorted(dirs))


# ------------------------------------------------------------------------------------- grading launcher
_PYTEST_MODULE = re.compile(r"(?<![\w.-])-m\s+pytest(?=\s|$)")


def guard_command(script: str, launcher: str) -> str | None:
    """``script`` (a ``run_tests.sh``) running the hidden tests through the grading launcher ``launcher`` (the
    path of ``grading_guard.py`` in the grading container) instead of ``python -m pytest``; None when the script
    does not run pytest exactly once as ``python -m pytest`` (it then runs as it is, unguarded)."""
    if len(_PYTEST_MODULE.findall(script)) != 1:
        return None
    return _PYTEST_MODULE.sub(lambda _m: launcher, script)


def _guard_names(statuses: dict[str, str]) -> dict[str, str]:
    rank = {"SKIPPED": 0, "XPASS": 1, "PASSED": 2, "ERROR": 3, "FAILED": 4}
    out: dict[str, str] = {}
    for nodeid, st in statuses.items():
        if "::" not in nodeid or st not in rank:
            continue
        name = ".".join(nodeid.split("::")[1:])
        if rank[st] > rank.get(out.get(name, ""), -1):
            out[name] = st
    return out


def without_probes(test_map: dict[str, str], body: dict) -> dict[str, str]:
    """``test_map`` without the launcher's tamper probes (named by node id in the seal's ``body["probes"]``; the
    names as :func:`junit_test_map` makes them)."""
    probes = set(_guard_names({p: "FAILED" for p in body.get("probes") or [] if isinstance(p, str)}))
    return {k: v for k, v in test_map.items() if k not in probes}


def seal_problems(seal: bytes | None, key: bytes, xml: bytes | None, test_map: dict[str, str], *,
                  probes: bool = False) -> tuple[list[str], dict]:
    """Why a guarded run's verdict cannot be trusted (``[]`` when it can), and the seal's body.

    The grading launcher (``grading_guard.py``) writes one seal line after pytest returns: a JSON body (the
    statuses pytest's reports gave, by node id; the SHA-256 of the JUnit report; what was tampered with) and its
    HMAC-SHA256 under ``key``.  The verdict is kept when the seal is there, authentic and alone, reports no
    tampering, the JUnit report is the one sealed, and every test the report calls PASSED was seen passing by the
    launcher while no test it saw failing is missing from the report or passing there.  With ``probes`` (the host
    asked for tamper probes), a guarded seal must also name the probes it ran or say why there were none; the probes'
    own verdicts are in ``tampered`` (a probe that passed, or was reported twice or never).

    Args:
        seal: the seal file's bytes (None when there is none: the run ended before pytest returned).
        key: the key the host gave the launcher.
        xml: the JUnit report's bytes (None when there is none).
        test_map: :func:`isolated_test_map` of that report, probes included (:func:`without_probes` removes them).
        probes: whether the host asked the launcher for tamper probes.
    """
    if not seal or not seal.strip():
        return ["the test run ended without the grading launcher's seal (the process exited early)"], {}
    lines = seal.strip().splitlines()
    if len(lines) != 1:
        return ["the seal file holds more than the launcher's seal"], {}
    try:
        outer = json.loads(lines[0])
        body_text, tag = outer["body"], outer["hmac"]
        body = json.loads(body_text)
    except (ValueError, KeyError, TypeError):
        return ["the seal is not the launcher's"], {}
    want = hmac.new(key, body_text.encode(), hashlib.sha256).hexdigest()
    if not isinstance(tag, str) or not hmac.compare_digest(tag, want) or not isinstance(body, dict):
        return ["the seal's signature does not match"], {}
    problems = [f"tampered: {t}" for t in body.get("tampered") or []]
    if body.get("junit_sha256") != (hashlib.sha256(xml).hexdigest() if xml is not None else None):
        problems.append("the JUnit report changed after the seal")
    if not body.get("audit", False):
        return problems, body  # an interpreter without audit hooks (before Python 3.8): the report is taken as is
    if probes and not body.get("probes") and not body.get("probe_notes"):
        problems.append("the launcher ran no tamper probe and said not why")
    seen = _guard_names(body.get("statuses") or {})
    for name, st in sorted(test_map.items()):
        if name and st == "PASSED" and seen.get(name) not in ("PASSED", "XPASS"):
            problems.append(f"{name}: PASSED in the JUnit report, {seen.get(name, 'never run')} in pytest's reports")
    for name, st in sorted(seen.items()):
        if st in ("FAILED", "ERROR") and test_map.get(name, "PASSED") == "PASSED":
            problems.append(f"{name}: {st} in pytest's reports, {test_map.get(name, 'missing')} in the JUnit report")
    return problems[:50], body
