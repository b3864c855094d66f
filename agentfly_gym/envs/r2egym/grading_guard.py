"""The launcher that runs an R2E-Gym task's hidden tests in the grading container (isolated grading).

Run as a script in place of ``python -m pytest`` (``python3 grading_guard.py ARGS...``), by the grading
container's interpreter, standard library only (Python 3.8 or later for the guard; older interpreters run
pytest unguarded and say so in the seal).  The code under test runs inside the pytest process, so it can reach
pytest's in-memory state; before pytest's plugins or any task code are imported this launcher:

* reads a random key that the host wrote next to this file, and deletes the file;
* installs two PEP 578 audit hooks (which Python cannot remove).  The first vetoes, for the rest of the process,
  the attribute writes that raise an audit event on the functions and objects of pytest, pluggy and this
  launcher (``f.__code__ = c``, ``report.__class__ = C``; CPython raises none for ``TestReport.__init__ = f``,
  which the snapshot below catches instead), writes to this folder other than the JUnit report, ``/proc/*/mem``, symbolic links into ``/proc``, ``ctypes``' raw memory access
  (``from_address``, CPython's C API through ``pythonapi``), ``gc``'s object graph walks, ``sys.settrace``,
  ``sys.setprofile``, ``sys._current_frames`` and ``sys.monitoring`` callbacks.  The second keeps the key and
  the statuses out of reach of Python objects (it is referenced only by the interpreter);
* snapshots the identities of everything pytest, pluggy and this launcher define (module and class
  namespaces), the registered hook implementations and the repository's ``conftest.py`` files; at every test
  report and at the end it checks them again: a swapped module function (``_pytest.runner.call_and_report =
  f``, which raises no audit event), a class namespace edited behind ``setattr``, a hook implementation from a
  plugin registered at run time out of the repository's code, a ``conftest.py`` that appeared or changed,
  each marks the run tampered;
* records the module code the import system (pytest's assertion rewriter, importlib's source loader) first runs
  for each hidden test file (the ``.py`` files named on the command line or under folders named there: they, their
  compiled files and the files of their folders, helpers and data, are read-only, and no code file is added
  there).  Before a test is called, its function (or, where its file decorates it,
  the one ``__wrapped__`` names) must be compiled in that code and its module be the namespace that code ran in:
  passing tests put in ``sys.modules`` or in the module's globals, a test function's code swapped: the run is
  tampered with.  While that code runs a profile function waits for its return, where what the file bound at its
  top level (tests, helpers, fixtures, classes and their methods, constants, imports; not the names its own
  functions rebind, ``global x`` or ``module.x = ...``, nor what the package adds) is recorded: before each test is
  called these names must be bound to the same objects (identity, so a list a fixture fills is still the file's),
  and so must its functions' keyword defaults and closure cells; they are checked again at the end (a rebind during
  the last test), and a function compiled from a hidden test file or its folder given another ``__code__`` or
  defaults marks the run tampered (:mod:`.guard_namespaces` holds the snapshots; the host ships it next to this file);
* adds tamper probes to the session once it is collected (:mod:`.guard_probes`): in each hidden test file, tests
  that must fail when pytest, the standard library and builtins are honest, under names and at places drawn from a
  stream derived from the key; one that passes, or whose report is missing or doubled, marks the run tampered;
* records each test's outcome as pytest's reports give it and, from its outermost wrapper of the call hook, whether
  the call raised (a passed report for a call that raised is tampering), and after ``pytest.main`` returns writes a
  seal to a descriptor opened before any task code ran: the statuses, the SHA-256 of the JUnit report, what was
  tampered with, the probes' node ids (the host leaves them out of the verdict), under an HMAC-SHA256 of the key.
  A run that ends early (``os._exit``), a second seal, a JUnit
  report changed after the seal, or statuses the report and the seal disagree on: the host scores 0.

This raises the bar; it is not a proof.  The tests' own code runs in the same process as the code under test, so
what the tests call and compare stays open to it: the package's functions (an object equal to everything), a name
rebound between a file's last statement and its return (a thread), the wrapper of a test its file decorates, a test
inherited from a class outside the hidden test files, a ``unittest`` test method replaced by its ``setUp`` (which runs
within the call), tampering aimed at one hidden test by name (a constant changed in place, a helper rebound and
restored within a call: the probes do not call the file's own names).  A determined exploit of the interpreter (a
C extension, a frame of the guard reached through a
traceback) can forge what the guard sees.
"""

import hashlib
import hmac
import json
import os
import re
import sys
import types



def _load_helper(name):
    """One of the launcher's helper modules (:mod:`.guard_namespaces`, :mod:`.guard_probes`), read from the file
    ``name + ".py"`` next to this one (the repository under test may hold a module of that name) and kept in
    ``sys.modules`` under a private name that the snapshot covers."""
    path = os.path.join(os.path.dirname(os.path.realpath(__file__)), name + ".py")
    mod = types.ModuleType("_afg_" + name)
    mod.__file__ = path
    with open(path, "rb") as f:
        exec(compile(f.read(), path, "exec"), vars(mod))
    sys.modules[mod.__name__] = mod
    return mod


_ns = _load_helper("guard_namespaces")
_MISSING, _CLASS_ADDED_OK, _snapshot, _code_like, _codes, _merge, _own_bindings, _rebound, _profile_reports_frames = (
    _ns._MISSING, _ns._CLASS_ADDED_OK, _ns._snapshot, _ns._code_like, _ns._codes, _ns._merge, _ns._own_bindings,
    _ns._rebound, _ns._profile_reports_frames)
_decorated, _conftests, _sha, _test_files, _trusted_impl = (_ns._decorated, _ns._conftests, _ns._sha, _ns._test_files,
                                                             _ns._trusted_impl)
_probes = _load_helper("guard_probes")
_RANK = {"SKIPPED": 0, "XPASS": 1, "PASSED": 2, "ERROR": 3, "FAILED": 4}
#: audit events refused outright: they reach any object or frame (gc's graph, other threads' frames, tracing)
_DENIED = frozenset({"gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames",
                     "sys.settrace", "sys.setprofile", "sys.monitoring.register_callback", "ctypes.cdata"})
#: audit events whose first two arguments are paths, refused inside the grading folder
_PATH_EVENTS = frozenset({"os.rename", "os.link", "os.remove", "os.rmdir", "os.truncate", "os.chmod", "os.chown",
                          "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile"})
_PROC_MEM = re.compile(r"^/proc/[^/]+/(task/[^/]+/)?mem$")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
#: the modules (and their classes) checked at every test report: what makes and delivers a report (all
#: modules at the end)
_CRITICAL = ("_pytest.runner", "_pytest.reports", "_pytest.skipping", "pluggy._callers", "pluggy._hooks", "__main__")
#: the hooks whose implementations are checked at every test report (all of them at the end)
_RUNTEST_HOOKS = ("pytest_runtest_protocol", "pytest_runtest_setup", "pytest_runtest_call", "pytest_runtest_teardown",
                  "pytest_runtest_makereport", "pytest_runtest_logreport", "pytest_pyfunc_call",
                  "pytest_report_teststatus", "pytest_runtestloop", "pytest_fixture_setup")


def _install(grade_dir, junit, key, seal_fd, pm, plugin, seal_code, before, test_args, probing):
    """Install the two audit hooks; nothing returned holds the key.

    The hooks and what they call look up no global name (task code can rebind this launcher's globals, and reach
    a frame's ``f_globals`` and, from Python 3.13, write its locals through a traceback): everything they use is a
    default argument, copied into each call's own frame, or a closure of functions only the state hook calls."""
    modules, classes, funcs = _snapshot()
    modules = _merge([(n, vars(m), ns) for n, m, ns in modules], before[0])
    classes = _merge(classes, before[1])
    oid = object.__hash__  # unique for live objects like id(), without id()'s audit event on every call
    fkeys = frozenset(oid(f) for f in funcs.values())
    guarded_classes = frozenset(oid(c) for c, _, _ in classes)
    watched = set()  # the ids of the hidden test files' module code while it runs

    def profiled(frame, event, arg, audit=sys.audit, watched=watched, oid=oid):
        """The profile function while a hidden test file's module code runs: reports that code's return to the state
        hook (which records what the file bound); reachable through ``sys.getprofile``, so guarded."""
        if event == "return" and oid(frame.f_code) in watched:
            audit("afg.loaded", frame)

    guarded = guarded_classes | fkeys | {oid(profiled)}
    runner_codes = frozenset(oid(c) for c in _codes(funcs))
    root = os.path.realpath(os.getcwd())
    conftests = _conftests(root)
    tests = _test_files(root, test_args)
    decorated, first, names, checked = _decorated(tests), {}, {}, set()
    stems = frozenset(os.path.basename(p).split(".")[0] for p in tests)
    test_dirs = frozenset(os.path.dirname(p) for p in tests)
    # the hidden tests' folders are frozen for the run: the files in them (helpers, data), and new code there
    frozen = frozenset(os.path.realpath(os.path.join(d, f)) for top in test_dirs for d, _, fs in os.walk(top)
                       for f in fs)
    code_dirs = test_dirs | frozenset(os.path.join(d, "__pycache__") for d in test_dirs)
    rewrite_hook = getattr(sys.modules.get("_pytest.assertion.rewrite"), "AssertionRewritingHook", None)
    loader_codes = frozenset(oid(f.__code__) for f in vars(rewrite_hook or object).values()
                             if isinstance(f, types.FunctionType) and f.__name__ in ("exec_module", "load_module"))
    from importlib import _bootstrap as boot, _bootstrap_external as boot_ext  # the import system's own (frozen)
    frames_removed, source_loader = boot._call_with_frames_removed.__code__, boot_ext.SourceFileLoader
    basics_exec = boot_ext._LoaderBasics.exec_module.__code__
    function_class = getattr(sys.modules.get("_pytest.python"), "Function", None)
    origin_code = type(plugin).pytest_runtest_call.__code__
    module_class = getattr(sys.modules.get("_pytest.python"), "Module", None)
    outcomes_mod = sys.modules.get("_pytest.outcomes")
    skip_types = tuple(getattr(outcomes_mod, n) for n in ("Skipped", "XFailed") if hasattr(outcomes_mod, n))
    probes, probe_reports, probe_notes, raised = {}, {}, [], {}  # the tamper probes (see guard_probes)
    draw = _probes.drawer(_probes.stream(key)) if probing else None

    def protected(p, basename=os.path.basename, dirname=os.path.dirname, sep=os.sep, any=any, frozen=frozen,
                  code=(".py", ".pyc", ".so", ".pth")):
        """Whether realpath ``p`` is a hidden test file, a file of their folders (or new code there), a file that
        would load in place of one, or a folder above one."""
        b = basename(p)
        return p in tests or p in frozen or (dirname(p) in code_dirs and b.endswith(code)) or (
            b.split(".")[0] in stems and (".pyc" in b or dirname(p) in test_dirs)) or any(
            d == p or d.startswith(p + sep) for d in test_dirs)

    report_code = type(plugin).pytest_runtest_logreport.__code__
    probes_code = type(plugin).pytest_collection_modifyitems.__code__
    makereport_code = type(plugin).pytest_runtest_makereport.__code__
    report_class = getattr(sys.modules.get("_pytest.reports"), "TestReport", None)
    grade_dir = os.path.realpath(grade_dir) + os.sep
    junit = os.path.realpath(junit)
    relay = pm.hook
    callers = {k: v for k, v in vars(relay).items() if hasattr(v, "get_hookimpls")}
    caller_types = frozenset(oid(type(v)) for v in callers.values())
    boot_impls = frozenset(oid(getattr(i.function, "__func__", i.function))
                           for hc in callers.values() for i in hc.get_hookimpls())
    impl_types = frozenset(oid(type(i)) for hc in callers.values() for i in hc.get_hookimpls())
    crit = [(n, d, ns) for n, d, ns in modules if n in _CRITICAL]
    crit_classes = [(c, d, ns) for c, d, ns in classes if getattr(c, "__module__", "") in _CRITICAL]
    main_dict = vars(sys.modules["__main__"])
    bindings, pending, compiled, own_codes = {}, set(), set(), set()  # own_codes: may call sys.setprofile
    watch = _profile_reports_frames()  # else what test files bind is not recorded (an interpreter unlike CPython's)

    def veto(event, args, guarded=guarded, guarded_classes=guarded_classes, runner_codes=runner_codes,
             oid=oid, getframe=sys._getframe, type=type, isinstance=isinstance, int=int, str=str, bytes=bytes,
             realpath=os.path.realpath, fsdecode=os.fsdecode, proc_mem=_PROC_MEM.match, write_flags=_WRITE_FLAGS,
             sep=os.sep, grade_dir=grade_dir, junit=junit, root=root, added_ok=_CLASS_ADDED_OK,
             pathlike=os.PathLike, denied=_DENIED, path_events=_PATH_EVENTS, err=PermissionError,
             protected=protected, enumerate=enumerate, copies=("shutil.copyfile", "os.link"), own_codes=own_codes):
        if event in ("object.__setattr__", "object.__delattr__"):
            obj, name = args[0], args[1]
            if ((oid(obj) in guarded and name not in added_ok) or (
                    name == "__class__" and oid(type(obj)) in guarded_classes)) and \
                    oid(getframe(1).f_code) not in runner_codes:
                raise err("grading: changing the test runner is not allowed")
        elif event == "open":
            path, mode, flags = args[0], args[1], args[2]
            if not isinstance(path, (str, bytes, pathlike)):
                return
            p = realpath(fsdecode(path))
            if proc_mem(p):
                raise err("grading: /proc/*/mem is not allowed")
            writing = bool((flags if type(flags) is int else 0) & write_flags) or (
                type(mode) is str and ("w" in mode or "a" in mode or "x" in mode or "+" in mode))
            if writing and (((p + sep).startswith(grade_dir) and p != junit) or protected(p) or
                            (p.endswith(sep + "conftest.py") and p.startswith(root + sep))):
                raise err("grading: writing this file is not allowed")
        elif event in path_events:
            for i, a in enumerate(args[:2]):  # a copy's or a hard link's source is only read
                p = realpath(fsdecode(a)) if isinstance(a, (str, bytes, pathlike)) else None
                if p is not None and ((p + sep).startswith(grade_dir) or protected(p) and (i or event not in copies)):
                    raise err("grading: changing the grading folder or the hidden tests is not allowed")
        elif event == "os.symlink":
            a, b = args[0], args[1]
            if isinstance(a, (str, bytes, pathlike)) and "proc" in fsdecode(a):
                raise err("grading: links into /proc are not allowed")
            if isinstance(b, (str, bytes, pathlike)) and protected(realpath(fsdecode(b))):
                raise err("grading: changing the hidden tests is not allowed")
        elif event in denied:
            if event != "sys.setprofile" or oid(getframe(1).f_code) not in own_codes:
                raise err("grading: this introspection is not allowed")
        elif event == "ctypes.dlsym":
            name = args[1] if len(args) > 1 else ""
            if type(name) is str and name.startswith(("Py", "_Py")):
                raise err("grading: CPython's C API through ctypes is not allowed")

    outcomes, tampered, seals, known = {}, [], [], {}

    def note(reason, tampered=tampered, len=len):
        if len(tampered) < 50 and reason not in tampered:
            tampered.append(reason)

    def namespaces(full, sysmods=sys.modules, plugin=plugin, vars=vars):
        for name, d, ns in (modules_all if full else crit):
            if name != "__main__" and vars(sysmods.get(name, plugin)) is not d:
                note("sys.modules[%r] replaced" % (name,))
            _compare(name, d, ns, False)
        for cls, d, ns in (classes if full else crit_classes):
            _compare(cls.__module__ + "." + cls.__qualname__, d, ns, True)

    def _compare(where, d, ns, is_class, missing=_MISSING, list=list, type=type, str=str, len=len,
                 code_like=_code_like, added_ok=_CLASS_ADDED_OK):
        seen = 0
        for k, cur in list(d.items()):
            if type(k) is not str:
                if is_class:
                    note(where + " gained a key that is not a name")
                continue
            pair = ns.get(k)
            if pair is None:
                if is_class and k not in added_ok and code_like(cur):
                    note(where + " gained " + k)
                continue
            seen += 1
            if cur is not pair[0] and cur is not pair[1]:
                note(where + "." + k + " replaced")
        if seen != len(ns):
            for k, pair in ns.items():
                if pair[0] is not missing and pair[1] is not missing and k not in d:
                    note(where + "." + k + " removed")

    def hooks(full, type=type, list=list, vars=vars, oid=oid, method=types.MethodType, function=types.FunctionType,
              module=types.ModuleType, runtest=_RUNTEST_HOOKS, trusted_impl=_trusted_impl):
        items = list(vars(relay).items()) if full else [(h, vars(relay).get(h)) for h in runtest]
        for hname, hc in items:
            if hc is None:
                continue
            if oid(type(hc)) not in caller_types:
                note("the hook relay holds a foreign object at " + str(hname))
                continue
            for impl in hc.get_hookimpls():
                if oid(type(impl)) not in impl_types:
                    note(str(hname) + " holds a foreign hook implementation")
                    continue
                f = impl.function
                if type(f) is method:
                    f = f.__func__
                if type(f) is not function:
                    note(str(hname) + " implemented by something that is not a function")
                    continue
                k = oid(f)
                if k in boot_impls or k in fkeys:
                    continue
                pkey = (hname, oid(impl.plugin))
                if pkey in known:
                    if known[pkey] is not f:
                        note("hook implementation of " + str(hname) + " replaced")
                    continue
                known[pkey] = f
                plug = impl.plugin
                pfile = vars(plug).get("__file__") if type(plug) is module else None
                if not trusted_impl(f.__code__.co_filename, pfile, root, conftests):
                    note(str(hname) + " implemented by a plugin registered at run time")

    modules_all = modules

    def test_path(filename, names=names, tests=tests, realpath=os.path.realpath, type=type, str=str):
        """The realpath of ``filename`` when it is a hidden test file, else None."""
        p = names.get(filename, False)
        if p is False:
            p = names[filename] = realpath(filename) if type(filename) is str and realpath(filename) in tests else None
        return p

    def loaded(code, getframe=sys._getframe, type=type, oid=oid, module_dict=types.ModuleType.__dict__["__dict__"],
               module=types.ModuleType, dict=dict, tuple=tuple, len=len, isinstance=isinstance, set=set,
               codetype=types.CodeType, setprofile=sys.setprofile, profiled=profiled, watch=watch):
        """At an ``exec`` of module code: the first one of a hidden test file run by the import system (pytest's
        assertion rewriter or importlib's source loader: both read the file) is its code, run in namespace ``ns``;
        a profile function reports that code's return, where what it bound is recorded (``afg.loaded``)."""
        p = test_path(code.co_filename)
        if p is None or p in first:
            return
        f1, ns = getframe(2), None  # the frame that called exec
        if oid(f1.f_code) in loader_codes:
            m = f1.f_locals.get("module", f1.f_locals.get("mod"))
            ns = module_dict.__get__(m) if isinstance(m, module) else None
        elif f1.f_code is frames_removed:
            f2 = f1.f_back
            if f2 is not None and f2.f_code is basics_exec and type(f2.f_locals.get("self")) is source_loader:
                a = f1.f_locals.get("args")
                ns = a[1] if type(a) is tuple and len(a) > 1 and type(a[1]) is dict else None
        out, stack = set(), [code]  # the oids of the code objects nested in it
        while stack and ns is not None:
            c = stack.pop()
            if oid(c) not in out:
                out.add(oid(c))
                stack.extend(k for k in c.co_consts if type(k) is codetype)
        if ns is not None:
            first[p] = (code, ns, out)
            compiled.update(out)
            if watch:
                pending.add(p)
                watched.add(oid(code))
                setprofile(profiled)

    def origin(item, isinstance=isinstance, type=type, str=str, getattr=getattr, oid=oid,
               function=types.FunctionType, method=types.MethodType, module=types.ModuleType,
               fcode=types.FunctionType.__dict__["__code__"], fdict=types.FunctionType.__dict__["__dict__"],
               mfunc=types.MethodType.__dict__["__func__"], mdict=types.ModuleType.__dict__["__dict__"],
               cdict=type.__dict__["__dict__"], err=Exception, len=len, enumerate=enumerate, issubclass=issubclass):
        """Why the test function ``item`` is about to call is not one its hidden test file defines, or None."""
        if function_class is None or not isinstance(item, function_class):
            return None  # not a Python test function (a doctest, a conftest's own items): nothing to compare
        try:
            p = test_path(str(getattr(item, "path", None) or item.fspath))
            obj, mod, cls = item.obj, item.module, item.cls
            name = getattr(item, "originalname", None) or item.name
        except err:
            return "its test function could not be read"
        if p is None:
            return "collected from a file that is not a hidden test file"
        if p not in first:
            return "its test file was never run by the import system"
        if type(mod) is not module or mdict.__get__(mod) is not first[p][1]:
            return "its module is not the one its test file ran in"
        chain, f = [], obj
        while len(chain) < 32:
            f = mfunc.__get__(f) if type(f) is method else f
            if type(f) is not function:
                break
            chain.append(f)
            f = fdict.__get__(f).get("__wrapped__")
        for i, f in enumerate(chain):
            c = fcode.__get__(f)
            q = test_path(c.co_filename)
            if q is None:
                continue  # a wrapper from elsewhere (a decorator): what it wraps must come from a test file
            if q not in first or oid(c) not in first[q][2]:
                return "its test function was not compiled from its file when pytest imported it"
            if i and (q, c.co_name) not in decorated:
                return "its test function is wrapped by a function that no decorator of its file made"
            return None
        if chain and issubclass(type(cls), type) and name not in cdict.__get__(cls):
            return None  # inherited from a base class outside the hidden test files (a package's test mixin)
        return "its test function is not defined in a hidden test file"

    def recorded(frame, getframe=sys._getframe, type=type, frametype=types.FrameType, setprofile=sys.setprofile,
                 own_bindings=_own_bindings):
        """At the return of module code the profile function reports: a hidden test file's first run of its module
        code ended (the frame is the profiled one, not one a caller made up); what it bound is recorded."""
        if type(frame) is not frametype or getframe(3) is not frame:
            return note("a module's return reported by other code")
        p = test_path(frame.f_code.co_filename)
        if p in pending and frame.f_code is first[p][0] and frame.f_globals is first[p][1]:
            bindings[p] = own_bindings(first[p][0], first[p][1])
            pending.discard(p)
            if not pending:
                setprofile(None)

    def rebinds(rebound=_rebound, len=len, root=root, list=list, watch=watch):
        """Note each name a hidden test file bound that is now bound to another object (or never recorded)."""
        for p, (_, ns, _) in list(first.items()) if watch else ():
            where = p[len(root) + 1:] if p.startswith(root) else p
            if p not in bindings:
                note(where + ": what its module code bound was never recorded")
                continue
            for name in rebound(ns, bindings[p]):
                note(where + ": " + name + " rebound since its module code ran")

    def state(event, args, getframe=sys._getframe, type=type, str=str, bool=bool, int=int, vars=vars,
              report_code=report_code, makereport_code=makereport_code, seal_code=seal_code,
              report_class=report_class, dumps=json.dumps, hmac_new=hmac.new, sha256=hashlib.sha256,
              write=os.write, close=os.close, sha=_sha, junit=junit, key=key, seal_fd=seal_fd,
              outcomes=outcomes, tampered=tampered, seals=seals, rank=_RANK, err=OSError, codetype=types.CodeType,
              checked=checked, origin_code=origin_code, getattr=getattr, profiled_code=profiled.__code__,
              function=types.FunctionType, fcode=types.FunctionType.__dict__["__code__"],
              fattrs=("__code__", "__defaults__", "__kwdefaults__"), probes=probes, probe_reports=probe_reports,
              raised=raised, skip_types=skip_types, issubclass=issubclass, dirname=os.path.dirname,
              realpath=os.path.realpath, sorted=sorted, any=any):
        if event == "exec":
            if type(args[0]) is codetype and args[0].co_name == "<module>":
                loaded(args[0])
            return
        if event == "object.__setattr__":
            if type(args[0]) is function and type(args[1]) is str and args[1] in fattrs and (
                    oid(fcode.__get__(args[0])) in compiled or
                    realpath(dirname(realpath(fcode.__get__(args[0]).co_filename))) in test_dirs):
                note("a function of a hidden test file or of its folder given another " + str(args[1]))
            return
        if type(event) is not str or not event.startswith("afg."):
            return
        caller = getframe(1).f_code
        if event == "afg.origin" and caller is origin_code:
            nodeid = str(getattr(args[0], "nodeid", None))
            why = origin(args[0]) if nodeid not in probes else None
            checked.add(nodeid)
            if why is not None:
                note(nodeid + ": " + why)
            rebinds()
            return
        if event == "afg.loaded" and caller is profiled_code:
            recorded(args[0])
            return
        if event == "afg.called" and caller is origin_code:  # what the test call raised, as pluggy caught it
            t = args[1]
            raised[str(args[0])] = None if t is None else "skip" if issubclass(t, skip_types) else "raised"
            return
        if event == "afg.probes" and caller is probes_code:
            if draw is None or args[1]:
                probe_notes.append("no tamper probes: " + (
                    "--maxfail (or --stepwise) is set" if args[1] else "turned off"))
                return
            made, why = _probes.add_probes(args[0], draw, test_path, function_class, module_class)
            probes.update(made)
            probe_notes.extend(why)
            return
        if event == "afg.report" and caller is report_code:
            nodeid, when, outcome, xfail = args
            if not (type(nodeid) is type(when) is type(outcome) is str):
                note("a report with fields that are not strings")
                return
            if when == "call" and outcome == "passed" and raised.get(nodeid) == "raised":
                note(nodeid + ": passed although its call raised")
            if nodeid in probes:
                probe_reports.setdefault(nodeid, []).append((when, outcome))
                namespaces(False)
                hooks(False)
                return
            status = ("FAILED" if when == "call" else "ERROR") if outcome == "failed" else (
                "XPASS" if xfail is True and outcome == "passed" else "PASSED" if outcome == "passed" else
                "SKIPPED")
            if rank[status] > rank.get(outcomes.get(nodeid), -1):
                outcomes[nodeid] = status
            if when == "call" and nodeid not in checked:
                note(nodeid + ": ran without its test function checked")
            namespaces(False)
            hooks(False)
        elif event == "afg.makereport" and caller is makereport_code:
            report, raised = args
            if type(report) is not report_class:
                note("a test report of another class")
                return
            outcome = vars(report).get("outcome")
            if type(outcome) is not str:
                note("a test report whose outcome is not a string")
            elif raised is True and outcome == "passed":
                nodeid = vars(report).get("nodeid")
                note((nodeid if type(nodeid) is str else "a test") + ": passed although its phase raised")
        elif event == "afg.seal" and caller is seal_code:
            if seals:
                note("a second seal")
                return
            seals.append(1)
            namespaces(True)
            hooks(True)
            rebinds()  # after the last test
            for nodeid in sorted(probes):
                why = _probes.verdict(probe_reports.get(nodeid, []), bool(outcomes))
                if why is not None:
                    note(nodeid + ": a tamper probe " + why)
            if main_dict.get("sys") is not sys_module:
                note("the launcher's names replaced")
            body = dumps({"statuses": outcomes, "tampered": tampered, "junit_sha256": sha(junit),
                          "rc": args[0] if type(args[0]) is int else -1, "audit": True, "probes": sorted(probes),
                          "probe_notes": probe_notes}, sort_keys=True)
            tag = hmac_new(key, body.encode(), sha256).hexdigest()
            try:
                write(seal_fd, (dumps({"body": body, "hmac": tag}) + "\n").encode())
                close(seal_fd)
            except err:
                pass
        else:
            note("forged event " + event)

    own_codes.update((oid(loaded.__code__), oid(recorded.__code__)))
    sys_module = sys
    sys.addaudithook(state)
    sys.addaudithook(veto)


class GuardPlugin:
    """The launcher's pytest plugin: installs the hooks once pytest's own plugins and the command line's and
    installed plugins are loaded, just before the first ``conftest.py`` (the first task code) is imported; then
    reports each test's outcome to the state hook."""

    def __init__(self, grade_dir, key, seal_fd, seal_code):
        self.grade_dir, self.seal_fd, self.seal_code, self.key = grade_dir, seal_fd, seal_code, key

    def pytest_addoption(self):
        if self.key is not None:
            modules, classes, _ = _snapshot()
            self.before = ([(n, vars(m), ns) for n, m, ns in modules], classes)

    def pytest_load_initial_conftests(self, early_config):
        key, self.key = self.key, None
        before, self.before = getattr(self, "before", None), None
        if key is not None:
            _install(self.grade_dir, os.path.join(self.grade_dir, "report.xml"), key[0], self.seal_fd,
                     early_config.pluginmanager, self, self.seal_code, before,
                     list(getattr(early_config.known_args_namespace, "file_or_dir", None) or ()), key[1])

    def pytest_runtest_call(self, item):
        sys.audit("afg.origin", item)
        result = yield
        excinfo = result.excinfo
        sys.audit("afg.called", str(item.nodeid), excinfo[0] if excinfo else None)

    def pytest_collection_modifyitems(self, session, config, items):
        stops = getattr(config.option, "maxfail", 0) or getattr(config.option, "stepwise", 0)
        sys.audit("afg.probes", items, bool(stops))

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
            words = f.read().split()  # the key, then "probes=0" where the host turned the tamper probes off
        os.remove(key_path)
        key, probing = words[0], b"probes=0" not in words[1:]
    except (OSError, IndexError):
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
    plugins = []
    if audit:
        pytest.hookimpl(trylast=True)(GuardPlugin.pytest_load_initial_conftests)
        pytest.hookimpl(hookwrapper=True, tryfirst=True)(GuardPlugin.pytest_runtest_makereport)
        pytest.hookimpl(hookwrapper=True, tryfirst=True)(GuardPlugin.pytest_runtest_call)
        pytest.hookimpl(trylast=True)(GuardPlugin.pytest_collection_modifyitems)
        plugins.append(GuardPlugin(grade_dir, (key, probing), seal_fd, _seal.__code__))
    rc = pytest.main(list(argv), plugins=plugins)
    if audit:
        _seal(rc)
    elif key is not None:
        _unguarded_seal(key, seal_fd, os.path.join(grade_dir, "report.xml"), rc)
    sys.stdout.flush()
    return int(rc)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
