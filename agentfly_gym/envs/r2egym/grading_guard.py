"""The launcher that runs an R2E-Gym task's hidden tests in the grading container (isolated grading).

Run as a script in place of ``python -m pytest`` (``python3 grading_guard.py ARGS...``), by the grading
container's interpreter, standard library only (Python 3.8 or later for the guard; older interpreters run
pytest unguarded and say so in the seal).  The code under test runs inside the pytest process, so it can reach
pytest's in-memory state; before pytest's plugins or any task code are imported this launcher:

* reads a random key that the host wrote next to this file, and deletes the file;
* installs two PEP 578 audit hooks (which Python cannot remove).  The first vetoes, for the rest of the process:
  attribute writes and deletes on the classes and functions of pytest, pluggy and this launcher
  (``TestReport.__init__ = f``, ``f.__code__ = c``, ``report.__class__ = C``), writes to this folder other than
  the JUnit report, ``/proc/*/mem``, symbolic links into ``/proc``, ``ctypes``' raw memory access
  (``from_address``, CPython's C API through ``pythonapi``), ``gc``'s object graph walks, ``sys.settrace``,
  ``sys.setprofile``, ``sys._current_frames`` and ``sys.monitoring`` callbacks.  The second keeps the key and
  the statuses out of reach of Python objects (it is referenced only by the interpreter);
* snapshots the identities of everything pytest, pluggy and this launcher define (module and class
  namespaces), the registered hook implementations and the repository's ``conftest.py`` files; at every test
  report and at the end it checks them again: a swapped module function (``_pytest.runner.call_and_report =
  f``, which raises no audit event), a class namespace edited behind ``setattr``, a hook implementation from a
  plugin registered at run time out of the repository's code, a ``conftest.py`` that appeared or changed,
  each marks the run tampered;
* records each test's outcome as pytest's reports give it, and after ``pytest.main`` returns writes a seal to a
  descriptor opened before any task code ran: the statuses, the SHA-256 of the JUnit report, what was
  tampered with, under an HMAC-SHA256 of the key.  A run that ends early (``os._exit``), a second seal, a JUnit
  report changed after the seal, or statuses the report and the seal disagree on: the host scores 0.

This raises the bar; it is not a proof.  The tests' own code runs in the same process as the code under test,
so substituting the test functions or the objects they compare (an object equal to everything) is not
covered, and a determined exploit of the interpreter (a C extension, a frame of the guard reached through a
traceback) can forge what the guard sees.
"""

import hashlib
import hmac
import json
import os
import re
import sys
import types

_MISSING = object()
_PREFIXES = ("pytest", "_pytest", "pluggy")
_CLASS_ADDED_OK = frozenset({"__slotnames__", "__abstractmethods__", "_abc_impl"})
_SKIP_DIRS = frozenset({".git", ".venv", "venv", "node_modules", "site-packages", "dist-packages", "__pycache__",
                        ".tox", ".nox", ".eggs", "build"})
_PROC_MEM = re.compile(r"^/proc/[^/]+/(task/[^/]+/)?mem$")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_CRITICAL = ("_pytest.runner", "_pytest.reports", "_pytest.python", "_pytest.junitxml", "_pytest.skipping",
             "_pytest.outcomes", "_pytest.main", "pluggy._callers", "pluggy._hooks", "pluggy._manager", "__main__")


def _ours(name):
    return name == "__main__" or any(name == p or name.startswith(p + ".") for p in _PREFIXES)


def _snapshot():
    """``(modules, classes, functions)``: ``[(name, module, {key: value})]`` of pytest's, pluggy's and this
    launcher's modules, ``[(class, namespace, {key: value})]`` of their classes, ``{id: function}`` of their
    functions."""
    modules, classes, funcs, seen = [], [], {}, set()
    # modules: (name, module, namespace)
    for name, mod in sorted(sys.modules.items()):
        if not _ours(name) or not isinstance(mod, types.ModuleType):
            continue
        ns = {k: v for k, v in vars(mod).items()
              if isinstance(v, (type, types.FunctionType, types.ModuleType, types.BuiltinFunctionType))}
        modules.append((name, mod, ns))
        for v in ns.values():
            if isinstance(v, types.FunctionType):
                funcs[id(v)] = v
            if isinstance(v, type) and id(v) not in seen and _ours(getattr(v, "__module__", "") or ""):
                seen.add(id(v))
                cns = {k: m for k, m in vars(v).items() if _code_like(m)}
                classes.append((v, vars(v), cns))
                for m in cns.values():
                    f = getattr(m, "__func__", m)
                    for g in (f, getattr(m, "fget", None), getattr(m, "fset", None)):
                        if isinstance(g, types.FunctionType):
                            funcs[id(g)] = g
    return modules, classes, funcs


def _code_like(v):
    """Whether a class attribute is behaviour (a function, a descriptor, a class) rather than data."""
    return isinstance(v, (types.FunctionType, staticmethod, classmethod, property, type)) or \
        hasattr(type(v), "__get__")


def _codes(funcs):
    """Ids of the code objects of ``funcs`` and of the functions nested in them, but not of pytest's helpers
    that set attributes for a caller (``monkeypatch``, ``pytester``): the code allowed to set attributes on the
    test runner's classes (pytest keeps a little state on them, ``pytestPDB._config``)."""
    out, stack = set(), []
    for f in funcs.values():
        if not (getattr(f, "__module__", "") or "").startswith(("_pytest.monkeypatch", "_pytest.pytester")):
            stack.append(f.__code__)
    while stack:
        c = stack.pop()
        if id(c) not in out:
            out.add(id(c))
            stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return frozenset(out)


def _conftests(root):
    """``{realpath: sha256}`` of the ``conftest.py`` files under ``root`` (virtual environments left out)."""
    out = {}
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in _SKIP_DIRS and not x.endswith((".egg-info", ".dist-info"))]
        if "conftest.py" in files:
            p = os.path.realpath(os.path.join(d, "conftest.py"))
            out[p] = _sha(p)
    return out


def _sha(path):
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def _paths(args):
    return [os.path.realpath(os.fsdecode(a)) for a in args if isinstance(a, (str, bytes, os.PathLike))]


def _merge(now, before):
    """``[(name or class, namespace, {key: (value now, value before)})]``: a namespace may hold either value
    (pytest's ``legacypath`` adds attributes after start-up and takes them back at exit)."""
    old = {who if isinstance(who, str) else id(who): ns for who, _, ns in before}
    missing = _MISSING
    out = []
    for who, d, ns in now:
        ons = old.get(who if isinstance(who, str) else id(who), {})
        pairs = {k: (v, ons.get(k, missing)) for k, v in ns.items()}
        pairs.update({k: (missing, v) for k, v in ons.items() if k not in ns})
        out.append((who, d, pairs))
    return out


def _install(grade_dir, junit, key, seal_fd, pm, plugin, seal_code, before):
    """Install the two audit hooks; nothing returned holds the key."""
    modules, classes, funcs = _snapshot()
    modules = _merge([(n, vars(m), ns) for n, m, ns in modules], before[0])
    classes = _merge(classes, before[1])
    guarded = frozenset(id(c) for c, _, _ in classes) | frozenset(funcs)
    runner_codes = _codes(funcs)
    guarded_classes = frozenset(id(c) for c, _, _ in classes)
    root = os.path.realpath(os.getcwd())
    conftests = _conftests(root)
    report_code = type(plugin).pytest_runtest_logreport.__code__
    makereport_code = type(plugin).pytest_runtest_makereport.__code__
    report_class = getattr(sys.modules.get("_pytest.reports"), "TestReport", None)
    grade_dir = os.path.realpath(grade_dir) + os.sep
    junit = os.path.realpath(junit)
    boot_impls = set()
    for hc in vars(pm.hook).values():
        if hasattr(hc, "get_hookimpls"):
            boot_impls.update(id(getattr(i.function, "__func__", i.function)) for i in hc.get_hookimpls())
    boot_impls = frozenset(boot_impls)
    crit = [(n, m, ns) for n, m, ns in modules if n in _CRITICAL]
    crit_classes = [(c, d, ns) for c, d, ns in classes if getattr(c, "__module__", "") in _CRITICAL]

    def veto(event, args):
        if event in ("object.__setattr__", "object.__delattr__"):
            obj, name = args[0], args[1]
            if ((id(obj) in guarded and name not in _CLASS_ADDED_OK) or (
                    name == "__class__" and id(type(obj)) in guarded_classes)) and \
                    id(sys._getframe(1).f_code) not in runner_codes:
                raise PermissionError(f"grading: {event} {name!r} on the test runner is not allowed")
        elif event == "open":
            path, mode, flags = args
            if isinstance(path, int):
                return
            p = os.path.realpath(os.fsdecode(path))
            if _PROC_MEM.match(p):
                raise PermissionError("grading: /proc/*/mem is not allowed")
            writing = bool((flags or 0) & _WRITE_FLAGS) or any(c in (mode or "") for c in "wax+")
            if writing and ((p + os.sep).startswith(grade_dir) and p != junit or
                            os.path.basename(p) == "conftest.py" and p.startswith(root + os.sep)):
                raise PermissionError(f"grading: writing {p} is not allowed")
        elif event in ("os.rename", "os.link", "os.remove", "os.rmdir", "os.truncate", "os.chmod", "os.chown",
                       "os.utime", "shutil.rmtree"):
            if any((p + os.sep).startswith(grade_dir) for p in _paths(args[:2])):
                raise PermissionError(f"grading: {event} in the grading folder is not allowed")
        elif event == "os.symlink":
            if any("proc" in os.fsdecode(a) for a in args[:1] if isinstance(a, (str, bytes, os.PathLike))):
                raise PermissionError("grading: links into /proc are not allowed")
        elif event in ("gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames",
                       "sys.settrace", "sys.setprofile", "sys.monitoring.register_callback", "ctypes.cdata"):
            raise PermissionError(f"grading: {event} is not allowed")
        elif event == "ctypes.dlsym":
            name = args[1] if len(args) > 1 else ""
            if isinstance(name, str) and name.startswith(("Py", "_Py")):
                raise PermissionError("grading: CPython's C API through ctypes is not allowed")

    outcomes = {}  # nodeid -> worst status
    tampered = []
    seals = []
    known_impls = {}

    def note(reason):
        if len(tampered) < 50 and reason not in tampered:
            tampered.append(reason)

    def check(full):
        for name, d, ns in (modules if full else crit):
            if name != "__main__" and vars(sys.modules.get(name, plugin)) is not d:
                note(f"sys.modules[{name!r}] replaced")
            for k, (v, v0) in ns.items():
                cur = d.get(k, _MISSING)
                if cur is not v and cur is not v0:
                    note(f"{name}.{k} replaced")
        for cls, d, ns in (classes if full else crit_classes):
            for k, (v, v0) in ns.items():
                cur = d.get(k, _MISSING)
                if cur is not v and cur is not v0:
                    note(f"{cls.__module__}.{cls.__qualname__}.{k} replaced")
            if len(d) != len(ns):
                extra = [k for k in set(d) - set(ns) - _CLASS_ADDED_OK if _code_like(d.get(k))]
                if extra:
                    note(f"{cls.__module__}.{cls.__qualname__} gained {sorted(extra)[:5]}")
        for hname, hc in list(vars(pm.hook).items()):
            if not hasattr(hc, "get_hookimpls"):
                continue
            for impl in hc.get_hookimpls():
                f = getattr(impl.function, "__func__", impl.function)
                if id(f) in boot_impls or id(f) in funcs:
                    continue
                key = (hname, id(impl.plugin))
                if key in known_impls:
                    if known_impls[key] is not f:
                        note(f"hook implementation of {hname} replaced")
                    continue
                known_impls[key] = f
                if not _trusted_impl(f, impl.plugin, root, conftests):
                    note(f"{hname} implemented by a plugin registered at run time: "
                         f"{getattr(impl.plugin, '__name__', type(impl.plugin).__name__)}")

    def state(event, args):
        if not event.startswith("afg."):
            return
        caller = sys._getframe(1).f_code
        if event == "afg.report" and caller is report_code:
            nodeid, when, outcome, xfail = args
            status = ("FAILED" if when == "call" else "ERROR") if outcome == "failed" else (
                "XPASS" if xfail and outcome == "passed" else "PASSED" if outcome == "passed" else "SKIPPED")
            _worst(outcomes, nodeid, status)
            check(False)
        elif event == "afg.makereport" and caller is makereport_code:
            report, raised = args
            if type(report) is not report_class:
                note(f"a test report of class {type(report).__name__}")
            elif raised and report.outcome == "passed":
                note(f"{report.nodeid}: passed although its {report.when} phase raised")
        elif event == "afg.seal" and caller is seal_code:
            if seals:
                note("a second seal")
            seals.append(1)
            check(True)
            body = json.dumps({"statuses": outcomes, "tampered": tampered, "junit_sha256": _sha(junit),
                               "rc": args[0], "audit": True}, sort_keys=True)
            tag = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
            try:
                os.write(seal_fd, (json.dumps({"body": body, "hmac": tag}) + "\n").encode())
                os.close(seal_fd)
            except OSError:
                pass
        else:
            note(f"forged event {event}")

    sys.addaudithook(state)
    sys.addaudithook(veto)


def _worst(outcomes, nodeid, status):
    rank = {"SKIPPED": 0, "XPASS": 1, "PASSED": 2, "ERROR": 3, "FAILED": 4}
    if rank[status] > rank.get(outcomes.get(nodeid), -1):
        outcomes[nodeid] = status


def _trusted_impl(f, plugin, root, conftests):
    """A hook implementation registered after start-up: from a ``conftest.py`` of the repository as it was at
    start-up, or from code outside the repository (an installed pytest plugin)."""
    code = getattr(f, "__code__", None)
    if code is None:
        return False
    path = os.path.realpath(code.co_filename)
    if isinstance(plugin, types.ModuleType) and os.path.basename(path) == "conftest.py":
        return conftests.get(path) is not None and conftests.get(path) == _sha(path) and \
            os.path.realpath(getattr(plugin, "__file__", "") or "") == path
    inside = path.startswith(root + os.sep) and not any(p in _SKIP_DIRS for p in path[len(root):].split(os.sep))
    return not inside and os.path.isfile(path)


class GuardPlugin:
    """The launcher's pytest plugin: installs the hooks once pytest's own plugins and the command line's and
    installed plugins are loaded, just before the first ``conftest.py`` (the first task code) is imported; then
    reports each test's outcome to the state hook."""

    def __init__(self, grade_dir, key, seal_fd, seal_code):
        self.grade_dir, self.seal_fd, self.seal_code = grade_dir, seal_fd, seal_code
        self.key = key

    def pytest_addoption(self):
        if self.key is not None:
            modules, classes, _ = _snapshot()
            self.before = ([(n, vars(m), ns) for n, m, ns in modules], classes)

    def pytest_load_initial_conftests(self, early_config):
        key, self.key = self.key, None
        before, self.before = getattr(self, "before", None), None
        if key is not None:
            _install(self.grade_dir, os.path.join(self.grade_dir, "report.xml"), key, self.seal_fd,
                     early_config.pluginmanager, self, self.seal_code, before)

    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        sys.audit("afg.makereport", outcome.get_result(), call.excinfo is not None)

    def pytest_runtest_logreport(self, report):
        sys.audit("afg.report", str(report.nodeid), str(report.when), str(report.outcome),
                  bool(getattr(report, "wasxfail", None) is not None))


def _seal(rc):
    sys.audit("afg.seal", int(rc))


def _unguarded_seal(key, seal_fd, junit, rc):
    body = json.dumps({"statuses": {}, "tampered": [], "junit_sha256": _sha(junit), "rc": int(rc),
                       "audit": False}, sort_keys=True)
    os.write(seal_fd, (json.dumps({"body": body, "hmac": hmac.new(key, body.encode(), hashlib.sha256).hexdigest()})
                       + "\n").encode())
    os.close(seal_fd)


def main(argv):
    grade_dir = os.path.dirname(os.path.realpath(__file__))
    key_path, seal_path = os.path.join(grade_dir, "key"), os.path.join(grade_dir, "seal.json")
    try:
        with open(key_path, "rb") as f:
            key = f.read().strip()
        os.remove(key_path)
    except OSError:
        key = None
    seal_fd = os.open(seal_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o600) \
        if key else None
    if getattr(sys.flags, "safe_path", False):
        del sys.path[0]
    else:
        sys.path[0] = os.getcwd()  # as ``python -m pytest`` has it
    import pytest

    sys.argv = [os.path.join(os.path.dirname(pytest.__file__), "__main__.py"), *argv]
    audit = key is not None and hasattr(sys, "addaudithook")
    pytest.hookimpl(trylast=True)(GuardPlugin.pytest_load_initial_conftests)
    pytest.hookimpl(hookwrapper=True, tryfirst=True)(GuardPlugin.pytest_runtest_makereport)
    plugin = GuardPlugin(grade_dir, key if audit else None, seal_fd, _seal.__code__)
    rc = pytest.main(list(argv), plugins=[plugin])
    if audit:
        _seal(rc)
    elif key is not None:
        _unguarded_seal(key, seal_fd, os.path.join(grade_dir, "report.xml"), rc)
    sys.stdout.flush()
    return int(rc)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
