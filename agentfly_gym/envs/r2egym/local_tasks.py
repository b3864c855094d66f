"""The local R2E-Gym task set: real PyPI packages with an injected bug, built reproducibly.

Each task takes the source distribution of a small pure-Python package that ships its own
tests (exact version pinned, fetched with ``pip download --no-deps --no-binary :all:``),
injects one deterministic bug (an exact ``old -> new`` replacement in one source file),
hides the package test file(s) that the bug breaks, and records:

* the problem statement (what a user sees: symptoms, not the fix);
* the gold patch (unified diff undoing the bug, ``a/``/``b/`` prefixes);
* the expected map ``{test name: status}`` from running the hidden tests on the FIXED
  repository during the build (so it is exact for this interpreter and pytest);
* a ``run_tests.sh`` that runs the hidden tests with ``pytest -rA`` from ``/testbed``.

The build checks that the hidden tests do not match the expected map on the buggy
repository (reward 0) and match it after the gold patch (reward 1), on the host's
``python3 -m pytest``.  Output layout (``out_dir``)::

    tasks.jsonl            one R2E-Gym row per task, plus our fields
    repos/<task_id>/       the buggy repository, hidden test files removed
    hidden/<task_id>/...   the hidden test files at their repository paths
    rows/<task_id>.json    per-task marker: a task with a row is skipped on rebuild
    sdists/                the downloaded source distributions

Needs network access to the package index (pip's own configuration) the first time.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ...data.paths import cache_dir
from ...errors import AgentFlyError, ConfigError
from ...utils.files import file_lock
from .grading import compare_test_maps, parse_log_pytest

__all__ = [
    "LOCAL_BUGS",
    "TESTBED",
    "BugSpec",
    "TaskBuildError",
    "build_local_tasks",
    "default_tasks_dir",
    "run_tests_script",
]

TESTBED = "/testbed"


class TaskBuildError(AgentFlyError):
    """A local task could not be built or failed its reward-0/reward-1 verification."""


@dataclasses.dataclass(frozen=True)
class BugSpec:
    """One injected bug.

    Attributes:
        package: the PyPI distribution name.
        version: its exact version.
        file: the source file (relative to the sdist root) the bug edits.
        old: text that occurs exactly once in ``file``.
        new: its buggy replacement.
        hidden_tests: the package test files hidden from the agent and run for grading.
        problem_statement: the issue text the agent sees.
        pythonpath: folders (relative to the repo root) put on ``PYTHONPATH`` for the tests.
        name: short bug name, part of the task id.
        deselect: node-id prefixes of hidden tests left out (``pytest --deselect``), e.g. tests
            that need an optional module the generic image lacks.
    """

    package: str
    version: str
    file: str
    old: str
    new: str
    hidden_tests: tuple[str, ...]
    problem_statement: str
    pythonpath: tuple[str, ...] = (".",)
    name: str = "bug1"
    deselect: tuple[str, ...] = ()

    @property
    def task_id(self) -> str:
        return f"{self.package.lower()}-{self.version}-{self.name}"

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


def _b(package, version, file, old, new, tests, statement, pythonpath=(".",), name="bug1", deselect=()) -> BugSpec:
    return BugSpec(package, version, file, old, new, tuple(tests), statement.strip(), tuple(pythonpath), name,
                   tuple(deselect))


#: The bugs of the local task set, one task each.  Versions pinned; edits exact.
LOCAL_BUGS: tuple[BugSpec, ...] = (
    _b("inflection", "0.5.1", "inflection/__init__.py",
       "    if number % 100 in (11, 12, 13):\n", "    if number % 100 in (11, 12):\n",
       ["test_inflection.py"],
       "`inflection.ordinalize(13)` returns '13rd' and `ordinal(113)` returns 'rd'. Numbers ending in 13 "
       "should get the suffix 'th' (13th, 113th), like 11th and 12th."),
    _b("appdirs", "1.4.4", "appdirs.py",
       "            path = pathlist[0]\n        return path\n",
       "            path = pathlist[:1]\n        return path\n",
       ["test/test_api.py"],
       "On Linux, `appdirs.site_data_dir('MyApp', 'MyCompany')` and `AppDirs(...).site_data_dir` return a list "
       "like ['/usr/local/share/MyApp'] instead of a path string, which breaks code that joins paths onto it."),
    _b("cachetools", "5.3.3", "src/cachetools/__init__.py",
       "            key = next(iter(self.__order))\n        except StopIteration:\n            raise KeyError(\"%s is empty\" % type(self).__name__) from None\n        else:\n            return (key, self.pop(key))\n\n    def __update(self, key):\n        try:\n            self.__order.move_to_end(key)",
       "            key = next(reversed(self.__order))\n        except StopIteration:\n            raise KeyError(\"%s is empty\" % type(self).__name__) from None\n        else:\n            return (key, self.pop(key))\n\n    def __update(self, key):\n        try:\n            self.__order.move_to_end(key)",
       ["tests/test_lru.py"],
       "`cachetools.LRUCache` evicts the wrong entry when it is full: after `c[1]=1; c[2]=2; c[1]; c[3]=3` "
       "with maxsize=2, key 1 (just used) is gone and key 2 is still cached. The least recently used item "
       "should be evicted.", pythonpath=("src",)),
    _b("idna", "3.4", "idna/core.py",
       "    if label[0] == '-' or label[-1] == '-':\n", "    if label[0] == '-':\n",
       ["tests/test_idna.py"],
       "`idna.encode('abc-.com')` succeeds, but a label that ends with a hyphen is invalid (RFC 5891 4.2.3.1) and "
       "should raise `idna.IDNAError`, as a leading hyphen already does."),
    _b("jmespath", "1.0.1", "jmespath/parser.py",
       "        'or': 2,\n", "        'or': 45,\n",
       ["tests/test_parser.py"],
       "`jmespath.search('foo.foo || foo.bar', {'foo': {'bar': 'bar'}})` returns None instead of 'bar': the `||` "
       "operator seems to bind tighter than the `.` sub-expression, while it should have the lowest precedence "
       "after `|`."),
    _b("jsonpointer", "2.4", "jsonpointer.py",
       "    return s.replace('~1', '/').replace('~0', '~')\n",
       "    return s.replace('~1', '/')\n",
       ["tests.py"],
       "`resolve_pointer({'m~n': 8}, '/m~0n')` raises JsonPointerException: the escape '~0' is not decoded to '~' "
       "(RFC 6901 section 4), while '~1' is decoded to '/' correctly."),
    _b("munch", "4.0.0", "munch/__init__.py",
       "            try:\n                return self[k]\n            except KeyError:\n                raise AttributeError(k)\n",
       "            try:\n                return self[k]\n            except KeyError:\n                raise KeyError(k)\n",
       ["tests/test_munch.py"],
       "Accessing a missing attribute on a `Munch` raises KeyError instead of AttributeError, so "
       "`hasattr(m, 'missing')` and `getattr(m, 'missing', default)` raise instead of returning False/default.",
       # these need PyYAML, which the generic image lacks (and their parameters depend on it)
       deselect=["tests/test_munch.py::test_get_default_value", "tests/test_munch.py::test_reserved_attributes[fromYAML]",
                 "tests/test_munch.py::test_reserved_attributes[toYAML]"]),
    _b("parse", "1.20.1", "parse.py",
       '                elif string[number_start + 1] in "xX":\n',
       '                elif string[number_start + 1] in "X":\n',
       ["tests/test_parse.py"],
       "Integers with a lowercase hexadecimal prefix are parsed wrongly: `parse.parse('{:d}', '0xff')[0]` "
       "gives 0 instead of 255 (an uppercase '0XFF' works)."),
    _b("rfc3986", "2.0.0", "src/rfc3986/normalizers.py",
       "    return scheme.lower()\n", "    return scheme\n",
       ["tests/test_normalizers.py"],
       "URI normalization keeps an upper-case scheme: `rfc3986.normalizers.normalize_scheme('HTTP')` returns 'HTTP', "
       "so 'HTTP://example.com' and 'http://example.com' do not compare equal after normalization (RFC 3986 6.2.2.1 "
       "says schemes are case-insensitive and normalize to lower case).", pythonpath=("src",)),
    _b("semver", "3.0.2", "src/semver/version.py",
       "        return cls(self._major, self._minor + 1)\n",
       "        return cls(self._major, self._minor + 1, self._patch)\n",
       ["tests/test_bump.py"],
       "`Version.parse('3.4.5').bump_minor()` returns 3.5.5; bumping the minor part should reset the patch "
       "part: 3.5.0 (and `semver.bump_minor('3.4.5')` likewise).", pythonpath=("src",)),
    _b("simpleeval", "0.9.13", "simpleeval.py",
       "    ast.Mod: op.mod,\n", "    ast.Mod: op.floordiv,\n",
       ["test_simpleeval.py"],
       "`simple_eval('100 % 9')` returns 11 instead of 1: the modulo operator behaves like floor division."),
    _b("toolz", "0.12.1", "toolz/itertoolz.py",
       "    return zip(*(collections.deque(itertools.islice(it, i), 0) or it\n",
       "    return zip(*(collections.deque(itertools.islice(it, i + 1), 0) or it\n",
       ["toolz/tests/test_itertoolz.py"],
       "`list(toolz.sliding_window(2, [1, 2, 3, 4]))` returns [(2, 3), (3, 4)]: the first window (1, 2) is missing."),
    _b("uritemplate", "4.1.1", "uritemplate/variable.py",
       '            self.start = "?"\n            self.join_str = "&"\n',
       '            self.start = "?"\n            self.join_str = ";"\n',
       ["tests/test_uritemplate.py"],
       "Form-style query expansion joins variables with ';': `URITemplate('/s{?x,y}').expand(x=1, y=2)` gives "
       "'/s?x=1;y=2' but RFC 6570 requires '/s?x=1&y=2'."),
    _b("wcwidth", "0.2.13", "wcwidth/wcwidth.py",
       "            last_measured_char = char\n        width += wcw\n",
       "            last_measured_char = char\n        width += min(wcw, 1)\n",
       ["tests/test_core.py"],
       "`wcwidth.wcswidth('コンニチハ')` returns 5 instead of 10: East Asian wide characters are counted as one "
       "cell each in strings (while `wcwidth('コ')` correctly returns 2)."),
    _b("webencodings", "0.5.1", "webencodings/__init__.py",
       "    label = ascii_lower(label.strip('\\t\\n\\f\\r '))\n",
       "    label = ascii_lower(label.strip('\\t\\n\\f\\r'))\n",
       ["webencodings/tests.py"],
       "`webencodings.lookup(' utf-8 ')` returns None; encoding labels with surrounding spaces should be "
       "recognised (the WHATWG Encoding standard strips ASCII whitespace)."),
    _b("xmltodict", "0.13.0", "xmltodict.py",
       "                data = data.strip() or None\n", "                data = data.strip()\n",
       ["tests/test_xmltodict.py"],
       "`xmltodict.parse('<a>  </a>')` returns {'a': ''} instead of {'a': None}: whitespace-only text "
       "should be treated as no text when strip_whitespace is on (the default)."),
    _b("ordered-set", "4.1.0", "ordered_set/__init__.py",
       "            for k, v in self.map.items():\n                if v >= i:\n",
       "            for k, v in self.map.items():\n                if v > i + 1:\n",
       ["test/test_ordered_set.py"],
       "After `discard()`, `OrderedSet.index()` returns stale positions: with `s = OrderedSet('abc'); "
       "s.discard('a')`, `s.index('b')` is 1 (should be 0), and later lookups by index go wrong."),
    _b("pathspec", "0.12.1", "pathspec/patterns/gitwildmatch.py",
       "\t\t\tif pattern.startswith('!'):\n", "\t\t\tif pattern.startswith('!!'):\n",
       ["tests/test_04_gitignore.py"],
       "Negated gitignore patterns have no effect: with `GitIgnoreSpec.from_lines(['*.txt', '!keep.txt'])`, "
       "`match_file('keep.txt')` is True although '!keep.txt' should re-include the file."),
    _b("semantic_version", "2.10.0", "semantic_version/base.py",
       "        if _has_leading_zero(minor):\n", "        if _has_leading_zero(major):\n",
       ["tests/test_spec.py"],
       "`Version('1.02.3')` is accepted, but SemVer 2.0.0 (item 2) forbids leading zeros in the minor number; "
       "it should raise ValueError like `Version('01.2.3')` and `Version('1.2.03')` do."),
    _b("Unidecode", "1.3.8", "unidecode/__init__.py",
       "    position = codepoint % 256", "    position = codepoint % 255",
       ["tests/test_unidecode.py"],
       "`unidecode('Ü')`, `unidecode('北京')` and many other characters transliterate to the wrong ASCII text "
       "(e.g. 'ü' does not become 'u')."),
    _b("addict", "2.4.0", "addict/addict.py",
       "            else:\n                self[k].update(v)\n",
       "            else:\n                self[k] = v\n",
       ["test_addict.py"],
       "`Dict.update()` with nested dicts replaces the nested Dict instead of merging it: "
       "`d = Dict(a={'x': 1}); d.update({'a': {'y': 2}})` leaves d.a == {'y': 2}, expected {'x': 1, 'y': 2}."),
)


def default_tasks_dir() -> Path:
    """``cache_dir("r2egym", "local-v1")``: where the local task set is built by default."""
    return cache_dir("r2egym", "local-v1")


def run_tests_script(spec_or_paths: BugSpec | Iterable[str], pythonpath: Iterable[str] = (".",), *,
                     testbed: str = TESTBED, deselect: Iterable[str] = ()) -> str:
    """The ``run_tests.sh`` of a local task: ``pytest -rA`` on the hidden tests from ``testbed``.

    ``-o addopts=`` drops the package's own pytest options (coverage plugins and the like),
    ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1`` keeps third-party pytest plugins of the image out (the
    same run on every image), ``-p no:cacheprovider`` keeps the repository clean.
    """
    if isinstance(spec_or_paths, BugSpec):
        paths, pythonpath, deselect = spec_or_paths.hidden_tests, spec_or_paths.pythonpath, spec_or_paths.deselect
    else:
        paths = tuple(spec_or_paths)
    pp = ":".join(f"{testbed}/{p}".rstrip("/.") if p != "." else testbed for p in pythonpath)
    tests = " ".join([*(f"--deselect {shlex.quote(d)}" for d in deselect), *map(shlex.quote, paths)])
    return ("#!/bin/sh\n"
            f"cd {testbed} || exit 2\n"
            f"PYTHONPATH={pp} PYTHONDONTWRITEBYTECODE=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 exec python3 -m pytest -rA -p no:cacheprovider "
            f"-o addopts= {tests}\n")


def _sdist_dir(out: Path) -> Path:
    return out / "sdists"


def _valid_archive(path: Path) -> bool:
    """True when ``path`` is a whole ``.tar.gz`` or ``.zip`` archive (every member readable)."""
    import zipfile

    try:
        if path.stat().st_size == 0:
            return False
        if path.name.lower().endswith(".zip"):
            with zipfile.ZipFile(path) as zf:
                return zf.testzip() is None
        with tarfile.open(path) as tf:
            tf.getmembers()  # reads the whole compressed stream: a cut-off file fails here
        return True
    except (OSError, tarfile.TarError, zipfile.BadZipFile, EOFError):
        return False


def _find_archive(spec: BugSpec, folder: Path) -> Path | None:
    """The archive of ``spec`` in ``folder``; one that is not whole (a 0-byte or cut-off file, left by a full
    disk before archives were written under a temporary name) is removed and not returned."""
    names = {spec.package.lower().replace("-", "_"), spec.package.lower().replace("_", "-"), spec.package.lower()}
    for f in folder.iterdir():
        low = f.name.lower()
        if f.is_file() and any(low.startswith(f"{n}-{spec.version}.") for n in names) and low.endswith((".tar.gz", ".zip")):
            if _valid_archive(f):
                return f
            f.unlink(missing_ok=True)
    return None


def _download(spec: BugSpec, dest: Path, log: Callable[[str], None]) -> Path:
    """The sdist archive of ``spec`` in ``dest`` (downloaded with pip if absent).

    pip downloads into a temporary folder beside ``dest``; the archive is moved into ``dest`` only when it is
    whole, so a full disk or a killed download never leaves a file that a later build would reuse.

    Raises:
        TaskBuildError: the download failed (pip's message, e.g. "No space left on device", is included).
    """
    dest.mkdir(parents=True, exist_ok=True)
    found = _find_archive(spec, dest)
    if found:
        return found
    log(f"  downloading {spec.requirement}")
    with tempfile.TemporaryDirectory(prefix=".download-", dir=dest) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
               "-q", "-d", tmp, spec.requirement]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        found = _find_archive(spec, Path(tmp))
        if found is None:
            # some sdists need their own build backend to prepare metadata: retry with build isolation
            cmd.remove("--no-build-isolation")
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
            found = _find_archive(spec, Path(tmp))
        if found is None:
            raise TaskBuildError(f"pip download {spec.requirement} failed (exit {r.returncode}): {r.stderr[-2000:]}")
        final = dest / found.name
        os.replace(found, final)
    return final


def _extract(archive: Path, dest: Path) -> Path:
    with tarfile.open(archive) as tf:
        tf.extractall(dest, filter="data")
    roots = [p for p in dest.iterdir() if p.is_dir()]
    if len(roots) != 1:
        raise TaskBuildError(f"{archive.name}: expected one top-level folder, found {[p.name for p in roots]}")
    return roots[0]


def _run_hidden(repo: Path, spec: BugSpec, timeout: float) -> tuple[dict[str, str], str]:
    pp = ":".join(str((repo / p).resolve()) for p in spec.pythonpath)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": pp, "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "HOME": str(repo),
           "LANG": "C.UTF-8"}
    import os

    env["PATH"] = os.environ.get("PATH", env["PATH"])
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "-o", "addopts=",
                            *(a for d in spec.deselect for a in ("--deselect", d)), *spec.hidden_tests], cwd=repo, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        out = r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        out = f"timed out after {timeout}s\n{e.stdout or ''}"
    return parse_log_pytest(out), out


def unified_diff(path: str, before: str, after: str) -> str:
    """A ``git``-style unified diff of one file (``a/path`` -> ``b/path``), applicable with ``patch -p1``."""
    lines = list(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                      fromfile=f"a/{path}", tofile=f"b/{path}", n=3))
    out = []
    for ln in lines:
        if not ln.endswith("\n"):
            ln += "\n\\ No newline at end of file\n"
        out.append(ln)
    return f"diff --git a/{path} b/{path}\n" + "".join(out)


def _apply_patch(repo: Path, patch: str) -> None:
    r = subprocess.run(["patch", "-p1", "--forward", "--batch", "--quiet"], cwd=repo, input=patch, text=True,
                       capture_output=True, timeout=60, check=False)
    if r.returncode != 0:
        raise TaskBuildError(f"the gold patch does not apply: {r.stdout}{r.stderr}")


def _build_one(spec: BugSpec, archive: Path, out: Path, *, timeout: float, log: Callable[[str], None]) -> dict:
    with tempfile.TemporaryDirectory(prefix="afg-r2e-") as tmp:
        tmp_p = Path(tmp)
        fixed = _extract(archive, tmp_p / "fixed")
        target = fixed / spec.file
        if not target.is_file():
            raise TaskBuildError(f"{spec.task_id}: {spec.file} not in the sdist")
        for t in spec.hidden_tests:
            if not (fixed / t).is_file():
                raise TaskBuildError(f"{spec.task_id}: hidden test {t} not in the sdist")
        source = target.read_text(encoding="utf-8")
        n = source.count(spec.old)
        if n != 1:
            raise TaskBuildError(f"{spec.task_id}: the bug's old text occurs {n} times in {spec.file} (must be once)")
        expected, log_fixed = _run_hidden(fixed, spec, timeout)
        if not expected or "PASSED" not in expected.values():
            raise TaskBuildError(f"{spec.task_id}: the hidden tests do not pass on the fixed repository:\n{log_fixed[-3000:]}")
        buggy_src = source.replace(spec.old, spec.new)
        buggy = tmp_p / "buggy"
        shutil.copytree(fixed, buggy, symlinks=True)
        (buggy / spec.file).write_text(buggy_src, encoding="utf-8")
        parsed_bug, _log_bug = _run_hidden(buggy, spec, timeout)
        if compare_test_maps(parsed_bug, expected) != 0.0:
            raise TaskBuildError(f"{spec.task_id}: the injected bug breaks no hidden test")
        patch = unified_diff(spec.file, buggy_src, source)
        check = tmp_p / "check"
        shutil.copytree(buggy, check, symlinks=True)
        _apply_patch(check, patch)
        parsed_gold, log_gold = _run_hidden(check, spec, timeout)
        if compare_test_maps(parsed_gold, expected) != 1.0:
            raise TaskBuildError(f"{spec.task_id}: the gold patch does not restore the expected map:\n{log_gold[-3000:]}")
        failing = sorted(k for k, v in expected.items() if parsed_bug.get(k) != v)

        # write the task: buggy repo without hidden tests, hidden tests apart
        repo_dst, hidden_dst = out / "repos" / spec.task_id, out / "hidden" / spec.task_id
        for d in (repo_dst, hidden_dst):
            if d.exists():
                shutil.rmtree(d)
        for t in spec.hidden_tests:
            (hidden_dst / t).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(buggy / t, hidden_dst / t)
            (buggy / t).unlink()
        shutil.copytree(buggy, repo_dst, symlinks=True)

    commit = hashlib.sha1(f"{spec.requirement}\0{spec.file}\0{spec.old}\0{spec.new}".encode()).hexdigest()
    parsed_commit = {
        "old_commit_hash": commit, "new_commit_hash": commit, "commit_message": f"Fix: {spec.problem_statement[:200]}",
        "commit_date": "", "metadata": {},
        "file_diffs": [{"header": {"file": {"path": spec.file}}, "minus_file": {"path": f"a/{spec.file}"},
                        "plus_file": {"path": f"b/{spec.file}"}, "unified_diff": patch}],
    }
    return {
        # R2E-Gym columns
        "repo_name": spec.package, "docker_image": "", "commit_hash": commit,
        "parsed_commit_content": json.dumps(parsed_commit), "execution_result_content": "",
        "modified_files": [spec.file], "modified_entity_summaries": [], "relevant_files": [spec.file],
        "num_non_test_files": 1, "num_non_test_func_methods": 1,
        "num_non_test_lines": spec.old.count("\n") + spec.new.count("\n"),
        "prompt": "", "problem_statement": f"[ISSUE]\n{spec.problem_statement}\n[/ISSUE]",
        "expected_output_json": json.dumps(expected, sort_keys=True),
        # our fields
        "task_id": spec.task_id, "patch": patch, "hidden_tests": list(spec.hidden_tests),
        "run_tests": run_tests_script(spec), "repo_dir": f"repos/{spec.task_id}", "hidden_dir": f"hidden/{spec.task_id}",
        "source": f"pypi:{spec.requirement}", "sdist": archive.name, "fail_to_pass": failing,
    }


def build_local_tasks(out_dir: str | Path | None = None, *, bugs: Iterable[BugSpec] | None = None,
                      force: bool = False, test_timeout: float = 300.0, jobs: int = 4,
                      log: Callable[[str], None] | None = print) -> Path:
    """Build the local task set (idempotent) and return the path of its ``tasks.jsonl``.

    ``tasks.jsonl`` then lists every task built in ``out_dir`` so far (in :data:`LOCAL_BUGS`
    order), so building a subset never drops the others.

    Args:
        out_dir: output folder; default :func:`default_tasks_dir`.
        bugs: the bugs to build; default :data:`LOCAL_BUGS` (21 tasks).
        force: rebuild tasks that already have a row.
        test_timeout: seconds each hidden-test run may take during verification.
        jobs: parallel downloads.
        log: progress printer (``None`` for silence).

    Raises:
        TaskBuildError: a download, extraction or verification failed (the message names the task).
    """
    say = log or (lambda _m: None)
    out = Path(out_dir) if out_dir is not None else default_tasks_dir()
    specs = list(LOCAL_BUGS if bugs is None else bugs)
    ids = [s.task_id for s in specs]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"duplicate task ids in bugs: {ids}")
    (out / "rows").mkdir(parents=True, exist_ok=True)
    # one build of a folder at a time, across processes (two test workers, two shells): they would write the same
    # temporary files; the second finds the first's rows and builds only what is still missing
    with file_lock(out / ".build.lock"):
        return _build_locked(out, specs, ids, force, test_timeout, jobs, say)


def _build_locked(out: Path, specs: list[BugSpec], ids: list[str], force: bool, test_timeout: float, jobs: int,
                  say: Callable[[str], None]) -> Path:
    """:func:`build_local_tasks`'s work, with the folder's build lock held."""
    todo = [s for s in specs if force or not (out / "rows" / f"{s.task_id}.json").is_file()]
    say(f"R2E local tasks in {out}: {len(specs) - len(todo)} built, {len(todo)} to build")
    t0 = time.monotonic()
    if todo:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
            archives = list(ex.map(lambda s: _download(s, _sdist_dir(out), say), todo))
        for i, (spec, archive) in enumerate(zip(todo, archives), 1):
            t = time.monotonic()
            row = _build_one(spec, archive, out, timeout=test_timeout, log=say)
            tmp = out / "rows" / f"{spec.task_id}.json.tmp"
            tmp.write_text(json.dumps(row), encoding="utf-8")
            tmp.replace(out / "rows" / f"{spec.task_id}.json")
            say(f"  [{i}/{len(todo)}] {spec.task_id}: {len(json.loads(row['expected_output_json']))} hidden tests, "
                f"{len(row['fail_to_pass'])} broken by the bug ({time.monotonic() - t:.1f}s)")
    # tasks.jsonl lists every built task of the set (not only those asked for this time)
    order = [b.task_id for b in LOCAL_BUGS] + [i for i in ids if i not in {b.task_id for b in LOCAL_BUGS}]
    rows = [json.loads((out / "rows" / f"{i}.json").read_text(encoding="utf-8")) for i in order
            if (out / "rows" / f"{i}.json").is_file()]
    tmp = out / "tasks.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(out / "tasks.jsonl")
    say(f"R2E local tasks ready: {len(rows)} tasks in {out / 'tasks.jsonl'} ({time.monotonic() - t0:.1f}s)")
    return out / "tasks.jsonl"


