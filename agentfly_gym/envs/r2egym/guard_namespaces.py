"""The namespace snapshots of the grading launcher (:mod:`.grading_guard`), standard library only.

The launcher loads this file from its own folder (in the grading container, next to its copy) and keeps it in
``sys.modules`` under a private name, so its namespace and functions are snapshotted and guarded like the
launcher's own.  What the launcher's audit hooks call from here looks up no global name: everything it uses is a
default argument (task code can rebind a module's globals).

* :func:`_snapshot`, :func:`_merge`, :func:`_codes`, :func:`_code_like`: pytest's, pluggy's and the launcher's
  modules, classes and functions, compared at every test report;
* :func:`_own_bindings`, :func:`_rebound`: what a hidden test file's module code bound at its top level (its
  tests, helpers, fixtures, classes, constants and imports), recorded when that code returns and compared before
  each test is called; :func:`_decorated`: which of a hidden test file's functions a decorator may wrap.
"""

import hashlib
import opcode
import os
import sys
import types

_SELF = __name__
_MISSING = object()
_SKIP_DIRS = frozenset({".git", ".venv", "venv", "node_modules", "site-packages", "dist-packages", "__pycache__",
                        ".tox", ".nox", ".eggs", "build"})
_PREFIXES = ("pytest", "_pytest", "pluggy")
_CLASS_ADDED_OK = frozenset({"__slotnames__", "__abstractmethods__", "_abc_impl"})
#: bytecode operations that bind or unbind a name: at a module's top level (``STORE_NAME``, ...), those that bind
#: its globals; inside its functions and classes, those that may rebind one (``global x``, ``module.x = ...``)
_OPS = {n: opcode.opmap[n] for n in ("STORE_NAME", "DELETE_NAME", "STORE_GLOBAL", "DELETE_GLOBAL", "STORE_ATTR",
                                     "DELETE_ATTR") if n in opcode.opmap}
_DEREF_OPS = frozenset(opcode.opmap[n] for n in ("STORE_DEREF", "DELETE_DEREF") if n in opcode.opmap)
_TOP_OPS = frozenset(v for k, v in _OPS.items() if not k.endswith("_ATTR"))
_NESTED_OPS = frozenset(v for k, v in _OPS.items() if k.endswith(("_GLOBAL", "_ATTR")))


def _ours(name):
    """Whether module ``name`` is one the launcher snapshots: pytest's, pluggy's, the launcher's and its helpers."""
    return name == "__main__" or name == _SELF or name.startswith("_afg_") or any(
        name == p or name.startswith(p + ".") for p in _PREFIXES)


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


def _code_like(v, type=type, issubclass=issubclass, mro=type.__dict__["__mro__"].__get__,
               tdict=type.__dict__["__dict__"].__get__):
    """Whether a class attribute is behaviour (a function, a descriptor, a class) rather than data (looks only at
    types through ``type``'s own descriptors, never at the value's or its metaclass's attributes)."""
    t = type(v)
    if issubclass(t, type):
        return True
    for c in mro(t):
        if "__get__" in tdict(c):
            return True
    return False


def _codes(funcs):
    """The code objects of ``funcs`` and of the functions nested in them, but not of pytest's helpers
    that set attributes for a caller (``monkeypatch``, ``pytester``): the code allowed to set attributes on the
    test runner's classes (pytest keeps a little state on them, ``pytestPDB._config``)."""
    out, stack = {}, []
    for f in funcs.values():
        if not (getattr(f, "__module__", "") or "").startswith(("_pytest.monkeypatch", "_pytest.pytester")):
            stack.append(f.__code__)
    while stack:
        c = stack.pop()
        if id(c) not in out:
            out[id(c)] = c
            stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return list(out.values())


def _merge(now, before):
    """``[(name or class, namespace, {key: (value now, value before)})]``: a namespace may hold either value
    (pytest's ``legacypath`` adds attributes after start-up and takes them back at exit)."""
    old = {who if isinstance(who, str) else id(who): ns for who, _, ns in before}
    missing, out = _MISSING, []
    for who, d, ns in now:
        ons = old.get(who if isinstance(who, str) else id(who), {})
        pairs = {k: (v, ons.get(k, missing)) for k, v in ns.items()}
        pairs.update({k: (missing, v) for k, v in ons.items() if k not in ns})
        out.append((who, d, pairs))
    return out


def _stored(code, ops, ext=opcode.opmap.get("EXTENDED_ARG", -1), len=len, range=range, set=set):
    """The names that ``code`` itself (not the code nested in it) binds or unbinds with one of ``ops``, read from
    its bytecode (two bytes an instruction since Python 3.6; ``dis`` is not used: task code could have replaced it)."""
    b, names, out, arg = code.co_code, code.co_names, set(), 0
    for i in range(0, len(b) - 1, 2):
        op, a = b[i], b[i + 1] | arg
        if op == ext:
            arg = a << 8
            continue
        arg = 0
        if op in ops and a < len(names):
            out.add(names[a])
    return out


def _own_bindings(code, ns, stored=_stored, top=_TOP_OPS, nested=_NESTED_OPS, codetype=types.CodeType, type=type,
                  str=str, issubclass=issubclass, sorted=sorted, tuple=tuple, list=list, get=dict.get,
                  missing=_MISSING, tdict=type.__dict__["__dict__"].__get__, code_like=_code_like):
    """``((name, value, members), ...)``: what a hidden test file's module code ``code``, at the end of its run in
    namespace ``ns`` (a ``dict``), bound at its top level (its tests, helpers, fixtures, classes, constants,
    imports), less the names its own functions and classes may rebind (``global x``, ``module.x = ...`` in
    ``setup_module``, ``cls.x = ...``: any attribute they set by that name; a name they spell as a string:
    ``setattr(cls, "x", v)``, ``globals()["x"] = v``, ``mock.patch(__name__ + ".x")``); ``members``, for a class the
    file defines, ``((key, member), ...)`` of the functions and descriptors in its namespace (a test's helper methods),
    else ``()``.  These stay as they are while its tests run.  Names something else put in ``ns`` (the package, the
    import system) are not the file's and are left out."""
    own, rebinds, stack = stored(code, top), set(), list(k for k in code.co_consts if type(k) is codetype)
    while stack:
        c = stack.pop()
        rebinds |= stored(c, nested)
        stack.extend(k for k in c.co_consts if type(k) is codetype)
        for k in c.co_consts if c.co_flags & 1 else ():  # in functions (CO_OPTIMIZED; not class bodies, whose
            for t in (k if type(k) is tuple else (k,)):  # constants name their methods), the names spelt as strings:
                if type(t) is str and 0 < len(t) < 200 and "<" not in t:  # setattr(cls, "x", v), globals()["x"],
                    rebinds.add(t.rsplit(".", 1)[-1])  # mock.patch(__name__ + ".helper")
    out, module_name = [], get(ns, "__name__", missing)
    for name in sorted(own - rebinds):
        value, members = get(ns, name, missing), []
        if value is missing:
            continue
        if issubclass(type(value), type) and type(module_name) is str:
            d = tdict(value)
            m = d.get("__module__")
            if type(m) is str and m == module_name:
                for k, v in list(d.items()):
                    if type(k) is str and k not in rebinds and code_like(v):
                        members.append((k, v))
        out.append((name, value, tuple(members), _function_state(value)))
    return tuple(out)


def _function_state(f, cells_count=None, type=type, function=types.FunctionType, tuple=tuple, err=ValueError,
                    kwdefaults=types.FunctionType.__dict__["__kwdefaults__"].__get__,
                    closure=types.FunctionType.__dict__["__closure__"].__get__,
                    fcode=types.FunctionType.__dict__["__code__"].__get__, deref=None, len=len, range=range):
    """For a function with keyword defaults or a closure: ``(keyword defaults' values, closure cells' contents,
    whether its cells count)``, the objects a test's helper compares with (``def verify(got, *, want=5)``, a checker
    made by ``make_checker(5)``); the cells of a function that rebinds them itself (``nonlocal x``: its code stores to
    a cell) are left out (``cells_count`` None: read that from its bytecode, once, when it is recorded).  ``None``
    for anything else."""
    if type(f) is not function:
        return None
    kw, cells = kwdefaults(f), closure(f) or ()
    if not kw and not cells:
        return None
    if cells_count is None:
        b, ops = fcode(f).co_code, deref or _DEREF_OPS
        cells_count = not any(b[i] in ops for i in range(0, len(b) - 1, 2))
    out = []
    for cell in cells if cells_count else ():
        try:
            out.append(cell.cell_contents)
        except err:
            out.append(_MISSING)
    return (tuple(kw.values()) if type(kw) is dict else (), tuple(out), cells_count)


def _rebound(ns, bound, get=dict.get, missing=_MISSING, tdict=type.__dict__["__dict__"].__get__,
             proxy_get=type(type.__dict__).get, function_state=_function_state, len=len, zip=zip, any=any):
    """The names of ``bound`` (from :func:`_own_bindings`) that ``ns`` no longer binds to the same object (the same
    identity: a list or dict that a fixture fills is still the file's), and ``class.key`` for a class member
    replaced or removed, and ``name's keyword defaults or closure`` for a function whose keyword defaults or closure
    cells now hold other objects."""
    out = []
    for name, value, members, fstate in bound:
        if get(ns, name, missing) is not value:
            out.append(name)
            continue
        now = function_state(value, fstate[2]) if fstate is not None else None
        if fstate is not None and (now is None or len(now[0]) != len(fstate[0]) or len(now[1]) != len(fstate[1]) or any(
                a is not b for a, b in zip(now[0] + now[1], fstate[0] + fstate[1]))):
            out.append(name + "'s keyword defaults or closure")
            continue
        d = tdict(value) if members else None
        for k, m in members:
            if proxy_get(d, k, missing) is not m:
                out.append(name + "." + k)
    return out


def _profile_reports_frames():
    """Whether a profile function, at the return of module code, runs right above that code's frame (the launcher
    checks so that a return reported by other code is not taken; without it the launcher records nothing); run
    before any task code."""
    code, seen = compile("x = 1", "<afg-probe>", "exec"), []

    def probe(frame, event, arg, getframe=sys._getframe):
        if event == "return" and frame.f_code is code:
            seen.append(getframe(1) is frame)

    sys.setprofile(probe)
    try:
        exec(code, {})
    finally:
        sys.setprofile(None)
    return seen == [True]


def _decorated(files):
    """``{(path, name)}`` of the functions of ``files`` under a decorator that may wrap them (any but
    ``pytest.mark.*``, ``pytest.fixture``, ``staticmethod`` and ``classmethod``), read from their source."""
    import ast

    out, plain = set(), ("pytest.fixture", "fixture", "staticmethod", "classmethod")
    for p in files:
        try:
            with open(p, "rb") as f:
                src = f.read().decode("utf-8", "replace")
            nodes = [n for n in ast.walk(ast.parse(src, p)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        except (OSError, SyntaxError, ValueError):
            continue
        named = [(n.name, (ast.get_source_segment(src, d) or "?").split("(")[0].replace(" ", ""))
                 for n in nodes for d in n.decorator_list]
        out.update((p, n) for n, d in named if not d.startswith(("pytest.mark.", "mark.")) and d not in plain)
    return out


def _conftests(root):
    """``{realpath: sha256}`` of the ``conftest.py`` files under ``root`` (virtual environments left out)."""
    out = {}
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in _SKIP_DIRS and not x.endswith((".egg-info", ".dist-info"))]
        if "conftest.py" in files:
            p = os.path.realpath(os.path.join(d, "conftest.py"))
            out[p] = _sha(p)
    return out


def _sha(path, open=open, sha256=hashlib.sha256, err=OSError):
    try:
        with open(path, "rb") as f:
            return sha256(f.read()).hexdigest()
    except err:
        return None


def _test_files(root, args):
    """``frozenset`` of the hidden test files' realpaths: the ``.py`` files pytest's positional arguments name or
    hold (``path::node`` allowed); without any, the ``test_*.py`` and ``*_test.py`` files under ``root``."""
    out, named = set(), [os.path.realpath(a.split("::")[0]) for a in args if isinstance(a, str) and a]
    for p in named or [root]:
        for d, dirs, files in os.walk(p) if os.path.isdir(p) else [(os.path.dirname(p), [], [os.path.basename(p)])]:
            dirs[:] = [x for x in dirs if x not in _SKIP_DIRS and not x.endswith((".egg-info", ".dist-info"))]
            out.update(os.path.join(d, f) for f in files if f.endswith(".py") and (
                named or f.startswith("test_") or f.endswith("_test.py")))
    return frozenset(out)


def _trusted_impl(filename, plugin_file, root, conftests, realpath=os.path.realpath, basename=os.path.basename,
                  isfile=os.path.isfile, sep=os.sep, skip=_SKIP_DIRS, any=any, str=str, type=type):
    """A hook implementation registered after start-up (its function's file ``filename``; ``plugin_file`` the
    ``__file__`` of its plugin when that is a module): from a ``conftest.py`` of the repository as it was at
    start-up, or from code outside the repository (an installed pytest plugin)."""
    if type(filename) is not str:
        return False
    path = realpath(filename)
    if basename(path) == "conftest.py":
        if type(plugin_file) is not str or realpath(plugin_file) != path:
            return False
        want = conftests.get(path)
        return want is not None and want == _sha(path)
    inside = path.startswith(root + sep) and not any(p in skip for p in path[len(root):].split(sep))
    return not inside and isfile(path)
