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

from agentfly_gym.envs.r2egym.isolation import guard_command, isolated_test_map, seal_problems

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
'''
CONFTEST = '''import pytest
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    yield
def pytest_collection_modifyitems(items):
    items.sort(key=lambda i: i.nodeid)
'''


def _run(cwd: Path, test: str, *, guarded: bool) -> tuple[str, bytes | None, bytes | None]:
    """Run pytest on ``test`` from ``cwd``, through the launcher (a copy in ``cwd/grade`` with its key) or
    plainly; ``(log, JUnit report, seal)``."""
    grade = cwd / "grade"
    grade.mkdir(exist_ok=True)
    for f in ("report.xml", "seal.json"):
        (grade / f).unlink(missing_ok=True)
    shutil.copy(GUARD, grade / "guard.py")
    shutil.copy(GUARD.with_name("guard_namespaces.py"), grade / "guard_namespaces.py")
    (grade / "key").write_bytes(KEY)
    runner = [str(grade / "guard.py")] if guarded else ["-m", "pytest"]
    env = {"PATH": "/usr/bin:/bin", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONPATH": str(cwd),
           "PYTHONDONTWRITEBYTECODE": "1",
           "PYTEST_ADDOPTS": f"--junitxml={grade / 'report.xml'} -o junit_family=xunit1"}
    r = subprocess.run([sys.executable, *runner, "-rA", "-p", "no:cacheprovider", "-o", "addopts=", test], cwd=cwd,
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
    m = isolated_test_map(xml, log, test_files=["tests/test_x.py"])
    assert m == isolated_test_map(plain_xml, plain_log, test_files=["tests/test_x.py"])  # same verdict as plain pytest
    assert m["test_monkeypatch_and_mock"] == m["test_logging_and_frames"] == m["test_raises"] == "PASSED", log
    assert m["test_decorated_here"] == m["test_decorated_by_mock"] == m["TestUnittest.test_u"] == "PASSED", m
    assert m["test_setup_error"] == m["test_teardown_error"] == "ERROR" and m["test_xpass_strict"] == "FAILED"
    assert all(m[t] == "PASSED" for t in m if "_own_" in t) and len([t for t in m if "_own_" in t]) == 8, m
    problems, body = seal_problems(seal, KEY, xml, m)
    assert problems == [] and body["audit"] is True and body["tampered"] == [], (problems, log[-3000:])


#: The in-process hacks the fast suite (``-m "not slow"``) checks, one of each kind (a pytest internal wrapped, a test's
#: code swapped, a helper rebound in the test file's globals); the others (two pytest runs each, seconds) are slow.
FAST_HACKS = ("testreport_wrap", "test_code_swap", "helper_globals_swap")


@pytest.mark.parametrize("hack", [n if n in FAST_HACKS else pytest.param(n, marks=pytest.mark.slow)
                                  for n, h in r2e_hacks.HACKS.items() if h.in_process])
def test_in_process_hacks_fool_plain_pytest_and_not_the_launcher(hack, tmp_path):
    action = r2e_hacks.HACKS[hack].actions[0]
    text = action.split("<<'AFG_EOF' && echo replaced\n", 1)[1].rsplit("AFG_EOF", 1)[0]
    problems, log = _fools_pytest_then_guarded(tmp_path, text)
    assert problems, log[-3000:]


def _fools_pytest_then_guarded(tmp_path, package_init: str, conftest: str | None = None,
                               test_file: str | None = None) -> tuple[list[str], str]:
    """The minicalc task with the package's ``__init__.py`` (and a root ``conftest.py``, and another hidden
    ``tests/test_calc.py``) given: asserts that plain pytest is fooled into passing every test (the fixture's three
    tests, or ``test_file``'s), then runs the launcher; returns its seal's problems and its log."""
    shutil.copytree(FIXTURES / "repos" / "minicalc", tmp_path, dirs_exist_ok=True)
    shutil.copytree(FIXTURES / "hidden" / "minicalc" / "tests", tmp_path / "tests")
    if test_file is not None:
        (tmp_path / "tests" / "test_calc.py").write_text(test_file)
    if conftest is not None:
        (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "minicalc" / "__init__.py").write_text(package_init)
    log, xml, _ = _run(tmp_path, "tests/test_calc.py", guarded=False)
    fooled = isolated_test_map(xml, log, test_files=["tests/test_calc.py"])
    assert set(fooled.values()) == {"PASSED"} and (test_file is not None or fooled == {
        "test_add": "PASSED", "test_sub": "PASSED", "TestMul.test_mul": "PASSED"}), (fooled, log[-2000:])
    log, xml, seal = _run(tmp_path, "tests/test_calc.py", guarded=True)
    problems, _ = seal_problems(seal, KEY, xml, isolated_test_map(xml, log, test_files=["tests/test_calc.py"]))
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
    assert "without" in seal_problems(None, KEY, xml, m)[0][0] and seal_problems(b"", KEY, xml, m)[0]
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
'''


def test_audit_hooks_refuse_what_reaches_past_pytest(tmp_path):
    """What the audit hooks refuse raises PermissionError in the test (the same test fails under plain pytest)."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_v.py").write_text(VETOED.replace(
        'sys.argv[0].rsplit("/", 1)[0] + "/../grade/seal.json"', repr(str(tmp_path / "grade" / "seal.json"))))
    log, xml, _ = _run(tmp_path, "tests/test_v.py", guarded=False)
    assert isolated_test_map(xml, log) == {"test_vetoes": "FAILED"}, log[-2000:]
    log, xml, seal = _run(tmp_path, "tests/test_v.py", guarded=True)
    m = isolated_test_map(xml, log)
    assert m == {"test_vetoes": "PASSED"}, log[-3000:]
    assert seal_problems(seal, KEY, xml, m)[0] == []


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
