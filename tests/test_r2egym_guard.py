"""The grading launcher of isolated R2E-Gym grading (``agentfly_gym/envs/r2egym/grading_guard.py``), run here by
the host's interpreter on real pytest runs (no container: the container tests are in test_security.py and
test_r2egym_tasks.py).

* an honest suite that uses what honest tests use (monkeypatch, mock, logging, caplog, tracebacks,
  ``sys._getframe``, fixtures that fail in setup and teardown, xfail, xpass, skip, parametrized ids with ``::``,
  inherited tests, a conftest.py with hooks) gets a sound seal whose statuses agree with the JUnit report;
* each in-process hack of ``r2e_hacks`` fools plain ``python -m pytest``'s JUnit report (all PASSED: the test has
  teeth) and is caught by the launcher (a problem found by :func:`seal_problems`);
* a forged, doubled or missing seal is a problem.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import r2e_hacks

from agentfly_gym.envs.r2egym.isolation import guard_command, isolated_test_map, seal_problems, without_probes
from r2e_hacks import NO_BYTECODE

REPO = Path(__file__).resolve().parents[1]
GUARD = REPO / "agentfly_gym" / "envs" / "r2egym" / "grading_guard.py"
FIXTURES = REPO / "tests" / "fixtures" / "r2e"
KEY = b"0123456789abcdef" * 4

HONEST_SUITE = '''import functools, logging, sys, traceback, unittest
from unittest import mock
import pytest
from tests.base import Base
log = logging.getLogger("honest")
def test_a(): pass
def test_fooled(): raise RuntimeError("PASSED")
class TestC:
    def test_d(self): pass
    @pytest.mark.parametrize("x", ["a::b", "c - d", 3])
    def test_p(self, x): assert x != 3
class TestInh(Base): pass
@pytest.fixture
def bad():
    yield
    raise ValueError("teardown")
def test_teardown_error(bad): pass
@pytest.fixture
def broken(): raise ValueError("setup")
def test_setup_error(broken): pass
@pytest.mark.xfail
def test_xpass(): pass
@pytest.mark.xfail
def test_xfail(): assert 0
@pytest.mark.xfail(strict=True)
def test_xpass_strict(): pass
@pytest.mark.skip
def test_skip(): pass
def test_monkeypatch_and_mock(monkeypatch, tmp_path):
    monkeypatch.setattr(logging, "raiseExceptions", False)
    monkeypatch.setenv("HONEST", "1")
    with mock.patch("os.getcwd", return_value="/x"):
        import os
        assert os.getcwd() == "/x"
    (tmp_path / "f.txt").write_text("x")
def test_logging_and_frames(caplog):
    log.warning("w")
    assert caplog.records and sys._getframe().f_code.co_name == "test_logging_and_frames"
    try:
        raise KeyError(1)
    except KeyError as e:
        tb = e.__traceback__
        assert tb.tb_frame.f_locals is not None and traceback.format_exc()
def _deco(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)
    return wrapper
@_deco
def test_decorated_here(): pass
@mock.patch("os.getcwd", return_value="/y")
def test_decorated_by_mock(getcwd):
    import os
    assert os.getcwd() == "/y"
class TestUnittest(unittest.TestCase):
    def setUp(self): self.x = 1
    def test_u(self): self.assertEqual(self.x, 1)
def test_raises():
    with pytest.raises(ZeroDivisionError):
        1 / 0
    with pytest.warns(UserWarning):
        import warnings
        warnings.warn("u", UserWarning)
def helper(): return "first"
def helper(): return "real"  # the file rebinds its own name while it loads: what it ends with is its own
CACHE, TABLE, COUNT = [], {}, 0
def test_own_helper_monkeypatched(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "helper", lambda: "patched")
    monkeypatch.setattr(sys.modules[__name__], "COUNT", 5)
    assert helper() == "patched" and COUNT == 5
def test_own_helper_restored():  # monkeypatch undid it in the teardown of the test before
    assert helper() == "real" and COUNT == 0
@pytest.fixture
def filled():
    CACHE.append(1)
    TABLE["k"] = 1
    yield CACHE
def test_own_list_filled_by_fixture(filled): assert filled == [1] and TABLE == {"k": 1}
def test_own_zcounter_a():
    global COUNT
    COUNT += 1
def test_own_zcounter_b(): assert COUNT == 1
MODULE_DATA = None
def setup_module(module): module.MODULE_DATA = [1]
def test_own_module_data(): assert MODULE_DATA == [1]
class TestOwnClass:
    fmt = staticmethod(repr)
    def helper(self): return "real"
    @classmethod
    def setup_class(cls): cls.fmt = staticmethod(str)  # the file's own class member, set by its own code
    def test_own_class_a(self):
        with mock.patch.object(TestOwnClass, "helper", lambda self: "patched"):
            assert self.helper() == "patched"
        assert self.fmt(1) == "1"
    def test_own_class_b(self): assert self.helper() == "real"
# honest patterns that rebind the file's own names by string (each once marked tampered)
LIMIT, LABEL = 1, "a"
def scale(x): return x
def test_own_globals_written():
    globals()["LIMIT"] = 2
    assert LIMIT == 2
def test_own_setattr_module():
    setattr(sys.modules[__name__], "LABEL", "b")
    assert LABEL == "b"
@pytest.fixture
def patched_scale():
    with mock.patch(__name__ + ".scale", return_value=7):
        yield
def test_own_fixture_mock_patch(patched_scale): assert scale(1) == 7
class TestOwnSetupClass:
    def probe(self): return 1
    @classmethod
    def setup_class(cls): setattr(cls, "probe", lambda self: 2)
    def test_own_setattr_in_setup_class(self): assert self.probe() == 2
'''
CONFTEST = '''import pytest
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    yield
def pytest_collection_modifyitems(items):
    items.sort(key=lambda i: i.nodeid)
'''


def _run(cwd: Path, test: str, *, guarded: bool, probes: bool = True, key: bytes = KEY,
         args: tuple[str, ...] = ()) -> tuple[str, bytes | None, bytes | None]:
    """Run pytest on ``test`` from ``cwd``, through the launcher (a copy in ``cwd/grade`` with its key; tamper probes
    unless ``probes`` is false) or plainly; ``(log, JUnit report, seal)``."""
    grade = cwd / "grade"
    grade.mkdir(exist_ok=True)
    for f in ("report.xml", "seal.json"):
        (grade / f).unlink(missing_ok=True)
    shutil.copy(GUARD, grade / "guard.py")
    for helper in ("guard_namespaces.py", "guard_probes.py"):
        shutil.copy(GUARD.with_name(helper), grade / helper)
    (grade / "key").write_bytes(key + (b"" if probes else b"\nprobes=0\n"))
    runner = [str(grade / "guard.py")] if guarded else ["-m", "pytest"]
    env = {"PATH": "/usr/bin:/bin", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONPATH": str(cwd),
           "PYTHONDONTWRITEBYTECODE": "1",
           "PYTEST_ADDOPTS": f"--junitxml={grade / 'report.xml'} -o junit_family=xunit1"}
    r = subprocess.run([sys.executable, *runner, "-rA", "-p", "no:cacheprovider", "-o", "addopts=", *args, test], cwd=cwd,
                       capture_output=True, text=True, env=env, timeout=120)
    read = lambda p: p.read_bytes() if p.exists() else None  # noqa: E731
    if guarded:
        assert not (grade / "key").exists(), "the launcher leaves its key behind"
    return r.stdout + r.stderr, read(grade / "report.xml"), read(grade / "seal.json")


def test_honest_suite_gets_a_sound_seal_that_agrees_with_junit(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "__init__.py").write_text("")
    (tests / "base.py").write_text("class Base:\n    def test_inherited(self):\n        pass\n")
    (tests / "test_x.py").write_text(HONEST_SUITE)
    (tests / "conftest.py").write_text(CONFTEST)
    plain_log, plain_xml, _ = _run(tmp_path, "tests/test_x.py", guarded=False)
    log, xml, seal = _run(tmp_path, "tests/test_x.py", guarded=True)
    with_probes = isolated_test_map(xml, log, test_files=["tests/test_x.py"])
    problems, body = seal_problems(seal, KEY, xml, with_probes, probes=True)
    m = without_probes(with_probes, body)
    assert len(with_probes) - len(m) == len(body["probes"]) == 6, (body["probes"], body["probe_notes"])
    assert m == isolated_test_map(plain_xml, plain_log, test_files=["tests/test_x.py"])  # same verdict as plain pytest
    assert m["test_monkeypatch_and_mock"] == m["test_logging_and_frames"] == m["test_raises"] == "PASSED", log
    assert m["test_decorated_here"] == m["test_decorated_by_mock"] == m["TestUnittest.test_u"] == "PASSED", m
    assert m["test_setup_error"] == m["test_teardown_error"] == "ERROR"
    assert m["test_xpass_strict"] == "FAILED"
    assert all(m[t] == "PASSED" for t in m if "_own_" in t) and len([t for t in m if "_own_" in t]) == 12, m
    assert problems == [] and body["audit"] is True and body["tampered"] == [], (problems, log[-3000:])


STILL_OPEN = r2e_hacks.STILL_OPEN  # in-process hacks the launcher does not catch (both aimed)
#: The in-process hacks the fast suite (``-m "not slow"``) checks, one of each kind (a pytest internal wrapped, a test's
#: code swapped, a helper rebound in the test file's globals, a closure cell changed, unittest patched, pytest's hook
#: relay swapped); the others (two pytest runs each, seconds) are slow.
CORE = {"testreport_wrap", "test_code_swap", "helper_globals_swap", "closure_cell_swap", "unittest_assert_patch",
        "hook_proxy_swap"}
TASKS = {json.loads(line)["task_id"]: json.loads(line) for line in r2e_hacks.HACK_TASKS.read_text().splitlines()}


def _hack_params():
    for name, h in r2e_hacks.HACKS.items():
        if not h.in_process:
            continue
        marks = [pytest.mark.xfail(strict=True, reason=STILL_OPEN[name])] if name in STILL_OPEN else []
        yield pytest.param(name, marks=marks if name in CORE else [*marks, pytest.mark.slow], id=name)


def _package_init(hack: r2e_hacks.Hack) -> str:
    return hack.actions[0].split("<<'AFG_EOF' && echo replaced\n", 1)[1].rsplit("AFG_EOF", 1)[0]


@pytest.mark.parametrize("hack", list(_hack_params()))
def test_in_process_hacks_fool_plain_pytest_and_not_the_launcher(hack, tmp_path):
    h = r2e_hacks.HACKS[hack]
    problems, log = _fools_pytest_then_guarded(tmp_path, _package_init(h), task=h.task_id, refused=h.refused)
    assert problems or h.refused, log[-3000:]  # refused: the hack's write failed, and so does the test (checked)


@pytest.mark.parametrize("hack", ["unittest_assert_patch", "builtins_patch"])
def test_tamper_probes_catch_what_only_they_see(hack, tmp_path):
    """A patched ``unittest.TestCase.assertEqual`` or builtin buys a sound seal without probes (the test has teeth)
    and is betrayed by a probe that passed with them."""
    h = r2e_hacks.HACKS[hack]
    problems, log = _fools_pytest_then_guarded(tmp_path / "off", _package_init(h), task=h.task_id, probes=False)
    assert problems == [], problems
    problems, log = _fools_pytest_then_guarded(tmp_path / "on", _package_init(h), task=h.task_id)
    assert any("a tamper probe passed" in p for p in problems), (problems, log[-3000:])


def _fools_pytest_then_guarded(tmp_path, package_init: str, conftest: str | None = None,
                               test_file: str | None = None, task: str = r2e_hacks.TASK_ID,
                               probes: bool = True, refused: bool = False) -> tuple[list[str], str]:
    """The minicalc task (or another ``task`` of ``r2e_hacks.HACK_TASKS``) with the package's ``__init__.py`` (and a
    root ``conftest.py``, and another hidden ``tests/test_calc.py``) given: asserts that plain pytest is fooled into
    passing every test (the task's expected map, or ``test_file``'s tests), then runs the launcher (with tamper probes
    unless ``probes`` is false); returns its seal's problems and its log.  A run the launcher finds sound must give
    the verdict plain pytest gave, or, where the launcher ``refused`` what the hack did, a failing test."""
    row = TASKS[task]
    shutil.copytree(FIXTURES / "repos" / "minicalc", tmp_path, dirs_exist_ok=True, ignore=NO_BYTECODE)
    test = next(t for t in row["hidden_tests"] if t.split("/")[-1].startswith("test_"))

    def hidden_tests():  # afresh for each run: a hack may have rewritten them in the run before
        shutil.rmtree(tmp_path / "tests", ignore_errors=True)
        shutil.copytree(FIXTURES / row["hidden_dir"] / "tests", tmp_path / "tests", ignore=NO_BYTECODE)
        if test_file is not None:
            (tmp_path / "tests" / "test_calc.py").write_text(test_file)

    hidden_tests()
    if conftest is not None:
        (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "minicalc" / "__init__.py").write_text(package_init)
    log, xml, _ = _run(tmp_path, test, guarded=False)
    fooled = isolated_test_map(xml, log, test_files=[test])
    assert set(fooled.values()) == {"PASSED"} and (test_file is not None or fooled == json.loads(
        row["expected_output_json"])), (fooled, log[-2000:])
    hidden_tests()
    log, xml, seal = _run(tmp_path, test, guarded=True, probes=probes)
    problems, body = seal_problems(seal, KEY, xml, isolated_test_map(xml, log, test_files=[test]), probes=probes)
    graded = without_probes(isolated_test_map(xml, log, test_files=[test]), body)
    assert problems or (graded == fooled if not refused else "FAILED" in graded.values()), log[-2000:]
    return problems, log


def _seal(body: dict, key: bytes = KEY) -> bytes:
    text = json.dumps(body, sort_keys=True)
    return (json.dumps({"body": text, "hmac": hmac.new(key, text.encode(), hashlib.sha256).hexdigest()}) + "\n").encode()


def test_seal_problems():
    xml = b"<testsuites/>"
    good = {"statuses": {"t.py::test_a": "PASSED", "t.py::test_b": "FAILED"}, "tampered": [], "audit": True,
            "junit_sha256": hashlib.sha256(xml).hexdigest(), "rc": 1}
    m = {"test_a": "PASSED", "test_b": "FAILED"}
    assert seal_problems(_seal(good), KEY, xml, m)[0] == []
    assert "without" in seal_problems(None, KEY, xml, m)[0][0]
    assert seal_problems(b"", KEY, xml, m)[0]
    assert "signature" in seal_problems(_seal(good, b"other"), KEY, xml, m)[0][0]
    assert "more than" in seal_problems(_seal(good) * 2, KEY, xml, m)[0][0]
    assert "changed" in seal_problems(_seal(good), KEY, xml + b" ", m)[0][0]
    assert seal_problems(_seal(good), KEY, xml, {**m, "test_b": "PASSED"})[0]  # a failure the report calls a pass
    assert seal_problems(_seal(good), KEY, xml, {"test_a": "PASSED"})[0]  # a failure missing from the report
    assert seal_problems(_seal(good), KEY, xml, {**m, "test_c": "PASSED"})[0]  # a pass pytest never reported
    assert seal_problems(_seal({**good, "tampered": ["x"]}), KEY, xml, m)[0] == ["tampered: x"]
    assert seal_problems(_seal({**good, "audit": False, "statuses": {}}), KEY, xml, m)[0] == []


def test_guard_command_replaces_exactly_one_python_m_pytest():
    script = "#!/bin/sh\ncd /testbed || exit 2\nPYTHONPATH=/testbed exec python3 -m pytest -rA tests/t.py\n"
    assert guard_command(script, "/g/guard.py") == script.replace("-m pytest", "/g/guard.py")
    assert guard_command(".venv/bin/python -W ignore -m pytest -rA r2e_tests", "/g") == \
        ".venv/bin/python -W ignore /g -rA r2e_tests"
    assert guard_command("pytest -rA tests", "/g") is None  # not through python -m: run unguarded
    assert guard_command("python -m pytest a; python -m pytest b", "/g") is None
    assert guard_command("python -m pytest_cov x", "/g") is None


VETOED = '''import gc, sys, pytest
import _pytest.runner as runner
def test_vetoes():
    with pytest.raises(PermissionError):
        runner.call_and_report.__code__ = (lambda item, when, log=True, **kw: None).__code__
    with pytest.raises(PermissionError):
        gc.get_referents(runner.CallInfo.__dict__)
    with pytest.raises(PermissionError):
        open("/proc/self/mem", "rb")
    with pytest.raises(PermissionError):
        sys.settrace(lambda *a: None)
    with pytest.raises(PermissionError):
        open(sys.argv[0].rsplit("/", 1)[0] + "/../grade/seal.json", "w")
    with pytest.raises(PermissionError):  # a hidden test file, and a compiled file that would load in its place
        open(__file__, "a")
    with pytest.raises(PermissionError):
        open(__file__[:-3] + ".cpython-311-pytest-9.2.0.pyc", "wb")
    with pytest.raises(PermissionError):  # the files of the hidden tests' folder, and new code there
        open(__file__.rsplit("/", 1)[0] + "/data.json", "w")
    with pytest.raises(PermissionError):
        open(__file__.rsplit("/", 1)[0] + "/helpers.py", "x")
    open(__file__.rsplit("/", 1)[0] + "/output.txt", "w").close()  # a new data file is fine
'''


def test_audit_hooks_refuse_what_reaches_past_pytest(tmp_path):
    """What the audit hooks refuse raises PermissionError in the test (the same test fails under plain pytest)."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "data.json").write_text("{}")
    (tmp_path / "tests" / "test_v.py").write_text(VETOED.replace(
        'sys.argv[0].rsplit("/", 1)[0] + "/../grade/seal.json"', repr(str(tmp_path / "grade" / "seal.json"))))
    log, xml, _ = _run(tmp_path, "tests/test_v.py", guarded=False)
    assert isolated_test_map(xml, log) == {"test_vetoes": "FAILED"}, log[-2000:]
    log, xml, seal = _run(tmp_path, "tests/test_v.py", guarded=True)
    m = isolated_test_map(xml, log)
    problems, body = seal_problems(seal, KEY, xml, m, probes=True)
    assert without_probes(m, body) == {"test_vetoes": "PASSED"}, log[-3000:]
    assert problems == [], problems


# the package, imported by the repository's conftest.py before any test module runs, runs a module of passing tests
# compiled under the test file's name (through importlib's own helper) and puts it in sys.modules under the test
# module's names: pytest imports it from there, the test file itself never runs
EARLY_SWAP = '''import importlib._bootstrap, os, sys, types
from .ops import add, sub, mul
_path = os.path.join(os.getcwd(), "tests", "test_calc.py")
for _name in ("test_calc", "tests.test_calc"):
    _m = sys.modules[_name] = types.ModuleType(_name)
    _m.__file__ = _path
    importlib._bootstrap._call_with_frames_removed(exec, compile(%r, _path, "exec"), vars(_m))
''' % r2e_hacks._PASSING_TESTS


def test_a_test_module_swapped_before_it_runs_is_caught(tmp_path):
    problems, log = _fools_pytest_then_guarded(tmp_path, EARLY_SWAP, conftest="import minicalc\n")
    assert problems and all("never run by the import system" in p for p in problems), (problems, log[-3000:])


# the test file's own helper kept but given a passing function's code, once the module has run
HELPER_CODE_SWAP = r2e_hacks._HELPER_SWAP.replace('''        _g["check"] = lambda got, want: None
''', '''        _g["check"].__code__ = (lambda got, want: None).__code__
''')
# the launcher's profile function (reachable through sys.getprofile) called by the package while the test module loads,
# reporting the module's return before it bound its helper, then the helper rebound once the module has run
FORGED_RETURN = r2e_hacks._HELPER_SWAP.replace('''    _g = _f.f_globals
''', '''    _g = _f.f_globals
    if sys.getprofile() is not None:
        sys.getprofile()(_f, "return", None)
''')


@pytest.mark.parametrize(("package_init", "why"), [(HELPER_CODE_SWAP, "given another __code__"),
                                                   (FORGED_RETURN, "reported by other code")],
                         ids=["helper_code_swap", "forged_module_return"])
def test_a_helper_of_the_test_file_changed_is_caught(tmp_path, package_init, why):
    problems, log = _fools_pytest_then_guarded(tmp_path, package_init)
    assert any(why in p for p in problems), (problems, log[-3000:])


# a hidden test class whose test compares through a helper method of its class, and the package replacing that method
# once the module has run
CLASS_HELPER_TESTS = '''from minicalc import add


class TestAdd:
    def check(self, got, want):
        assert got == want

    def test_add(self):
        self.check(add(2, 3), 5)
'''
CLASS_HELPER_SWAP = r2e_hacks._HELPER_SWAP.replace('''_g["check"] = lambda got, want: None''',
                                                   '''_g["TestAdd"].check = lambda self, got, want: None''')


def test_a_helper_method_of_a_hidden_test_class_replaced_is_caught(tmp_path):
    problems, log = _fools_pytest_then_guarded(tmp_path, CLASS_HELPER_SWAP, test_file=CLASS_HELPER_TESTS)
    assert any("TestAdd.check rebound" in p for p in problems), (problems, log[-3000:])


def test_a_probes_verdict_from_its_reports():
    """A probe must fail (or be skipped by a mark of its place); a pass, a second report or none is tampering."""
    from agentfly_gym.envs.r2egym.guard_probes import verdict

    ok = [("setup", "passed"), ("call", "failed"), ("teardown", "passed")]
    assert verdict(ok, True) is None
    assert verdict([("setup", "failed"), ("teardown", "passed")], True) is None  # its place's fixture failed
    assert verdict([("setup", "skipped"), ("teardown", "passed")], True) is None
    assert verdict([("setup", "passed"), ("call", "passed"), ("teardown", "passed")], True) == "passed"
    assert verdict(ok + ok, True) == "reported twice"
    assert verdict([("setup", "passed"), ("call", "rerun"), *ok[1:]], True) is None  # pytest-rerunfailures' attempt
    assert verdict([], True) == "never reported"
    assert verdict([], False) is None
    assert verdict([("setup", "passed"), ("teardown", "passed")], True) == "its call was never reported"


def _gold_minicalc(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "repos" / "minicalc", tmp_path, dirs_exist_ok=True, ignore=NO_BYTECODE)
    shutil.copytree(FIXTURES / "hidden" / "minicalc" / "tests", tmp_path / "tests", ignore=NO_BYTECODE)
    ops = tmp_path / "minicalc" / "ops.py"
    ops.write_text(ops.read_text().replace("return a - b", "return a + b", 1))


def test_probes_are_drawn_from_the_key_named_like_the_files_tests_and_all_fail(tmp_path):
    _gold_minicalc(tmp_path)
    seen = []
    for key in (KEY, KEY[::-1]):
        log, xml, seal = _run(tmp_path, "tests/test_calc.py", guarded=True, key=key)
        with_probes = isolated_test_map(xml, log, test_files=["tests/test_calc.py"])
        problems, body = seal_problems(seal, key, xml, with_probes, probes=True)
        probes = body["probes"]
        assert problems == [] and len(probes) == 6 and body["probe_notes"] == [], (problems, body)
        assert without_probes(with_probes, body) == {"test_add": "PASSED", "test_sub": "PASSED",
                                                     "TestMul.test_mul": "PASSED"}
        assert all(p.split("::")[-1].startswith(("test_add_", "test_sub_", "test_mul_")) for p in probes), probes
        assert {with_probes[".".join(p.split("::")[1:])] for p in probes} == {"FAILED"}
        seen.append(set(probes))
    assert seen[0] != seen[1]  # another grading's key, other probes
    log, xml, seal = _run(tmp_path, "tests/test_calc.py", guarded=True, args=("-x",))
    problems, body = seal_problems(seal, KEY, xml, isolated_test_map(xml, log), probes=True)
    assert problems == [] and body["probes"] == [] and "--maxfail" in body["probe_notes"][0], body


def test_a_test_file_that_cannot_be_imported_gets_a_sound_seal_without_probes(tmp_path):
    """Buggy code that breaks the hidden test file's import (a collection error): no test runs, no probe either, and
    that is no tampering."""
    _gold_minicalc(tmp_path)
    (tmp_path / "minicalc" / "__init__.py").write_text("raise ImportError('broken by the bug')\n")
    log, xml, seal = _run(tmp_path, "tests/test_calc.py", guarded=True)
    m = isolated_test_map(xml, log, test_files=["tests/test_calc.py"])
    problems, body = seal_problems(seal, KEY, xml, m, probes=True)
    assert problems == [] and m == {"": "ERROR"}, (problems, m, log[-2000:])
    assert body["probes"] == [] and body["probe_notes"] == ["no test of a hidden test file was collected"], body
