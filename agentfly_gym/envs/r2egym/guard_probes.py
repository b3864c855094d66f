"""Tamper probes of the grading launcher (:mod:`.grading_guard`), standard library only.

A tamper probe is a test that must FAIL when the test framework, the standard library and builtins behave
honestly: an ``==`` of unequal values, a check through builtins (``len``, ``isinstance``, ``abs``, ...) or the
standard library (``math.isclose``, ``operator.eq``), a raised exception, ``unittest.TestCase`` assertions of
false facts, a failing check inside a test class like the hidden tests' own.  The launcher adds probes to the
pytest session after collection, in every hidden test file, as functions whose globals are that file's module
namespace (they look up builtins and names as the file's tests do, and are bound there), compiled at the lines of
the file's tests, under names made from the file's own test names and at places among its tests, all drawn from a
stream only the launcher holds (derived from the grading's secret key, which the launcher reads and deletes before
any task code runs).  Generic tampering, anything that
makes failing code pass (a report rewritten, an assertion method or builtin patched, a loader substituting
test code), makes the probes pass too, and a probe that passes, or whose report is missing or doubled, marks the
run tampered.

Where the probes cannot make a run fail honestly they are not made: a run with ``--maxfail``/``-x`` (a failing
probe would stop the session).  A probe shares the fixtures and ``setup``/``teardown`` its place implies (the
file's autouse fixtures run for it).  What probes cannot see: tampering aimed at one hidden test (its helper,
constant or comparison by name), and code under test that returns values equal to everything.

The launcher loads this file from its own folder and keeps it in ``sys.modules`` under a private name that its
snapshot covers; what it calls from here is given everything it uses as arguments.
"""

import hashlib
import hmac
import types

#: words appended to a hidden test's name to make a probe's (``test_add`` -> ``test_add_negative``)
WORDS = ("empty", "negative", "large", "zero", "unicode", "none", "repr", "roundtrip", "default", "nested", "edge",
         "bytes", "kwargs", "order", "copy", "invalid", "types", "limits", "multi", "single", "twice", "mixed",
         "boundary", "reverse", "float", "strict", "lazy", "cached", "errors", "compat")
#: kinds of function probes; each hidden test file gets one of each, plus one probe class
FUNCTION_KINDS = ("compare", "builtins", "raise", "unittest", "stdlib")


def stream(key, size=8192, new=hmac.new, sha256=hashlib.sha256):
    """``size`` bytes derived from the grading's key (HMAC-SHA256 in counter mode): the probes' secret draws."""
    out, i = [], 0
    while sum(len(b) for b in out) < size:
        out.append(new(key, b"afg-tamper-probes-%d" % i, sha256).digest())
        i += 1
    return b"".join(out)[:size]


def drawer(pool, from_bytes=int.from_bytes, len=len):
    """``draw(n)``: an int in ``[0, n)`` taken from ``pool`` (the bytes of :func:`stream`), wrapping around."""
    pos = [0]

    def draw(n):
        i = pos[0] % (len(pool) - 4)
        pos[0] = i + 4
        return from_bytes(pool[i:i + 4], "big") % max(1, n)

    return draw


def _values(draw):
    """Two unequal small ints, and a third."""
    a = 2 + draw(97)
    return a, a + 1 + draw(9), 3 + draw(50)


def function_body(kind, draw, has_unittest, has_pytest):
    """The body (lines, 4-space indented) of a function probe of ``kind`` that fails when Python is honest.

    ``builtins``, ``stdlib`` and ``unittest`` probes OR several checks (in a drawn order): any one of them made
    true by tampering makes the probe pass."""
    a, b, c = _values(draw)
    w = WORDS[draw(len(WORDS))]
    if kind == "compare":
        return ["    assert %s" % (
            "%d == %d" % (a, b), "[%d, %d] == [%d, %d]" % (a, c, b, c), "%r == %r" % (w, w + "s"),
            "{%r: %d} == {%r: %d}" % (w, a, w, b), "(%d, %r) == (%d, %r)" % (a, w, b, w))[draw(5)]]
    if kind == "raise":
        return ["    " + ("raise ValueError(%r)" % w, "int(%r)" % w, "{}[%r]" % w, "[][%d]" % a,
                          "raise AssertionError(%r)" % w, "%d // (%d - %d)" % (a, c, c))[draw(6)]]
    if kind == "builtins":
        checks = ["len(%r) == %d" % ([a] * c, c + 1), "isinstance(%d, str)" % a, "abs(-%d) == -%d" % (a, a),
                  "sum([%d, %d]) == %d" % (a, c, a + c + 1), "max([%d, %d]) == min([%d, %d])" % (a, b, a, b),
                  "sorted([%d, %d]) == [%d, %d]" % (b, a, b, a), "any([0, None, %r])" % "",
                  "round(%d.4) == %d" % (a, a + 1), "bool(0)", "callable(%d)" % a, "issubclass(int, str)",
                  "hasattr(%d, %r)" % (a, w), "str(%d) == %r" % (a, str(b)), "repr(%r) == %r" % (w, w)]
    elif kind == "stdlib":
        checks = ["__import__('math').isclose(%d.0, %d.0)" % (a, b), "__import__('operator').eq(%d, %d)" % (a, b),
                  "__import__('operator').contains([%d], %d)" % (a, b), "__import__('cmath').isclose(%d, %d)" % (a, b),
                  "__import__('re').fullmatch('x+', %r) is not None" % w,
                  "__import__('fractions').Fraction(1, %d) == __import__('fractions').Fraction(1, %d)" % (a, b),
                  "__import__('json').dumps(%d) == %r" % (a, str(b)), "__import__('os').path.join('a', 'b') == 'a'"]
        if has_pytest:
            checks.append("%d == pytest.approx(%d)" % (a, b))
    else:  # unittest: assertions of false facts; one that does not raise makes the probe pass
        tc = "unittest" if has_unittest else "__import__('unittest')"
        calls = ["t.assertEqual(%d, %d)" % (a, b), "t.assertTrue(%d == %d)" % (a, b), "t.assertFalse(%d)" % a,
                 "t.assertIn(%d, [%d])" % (a, b), "t.assertIs(%d, None)" % a, "t.assertIsNone(%d)" % a,
                 "t.assertAlmostEqual(%d.0, %d.0)" % (a, b), "t.assertListEqual([%d], [%d])" % (a, b),
                 "t.assertDictEqual({1: %d}, {1: %d})" % (a, b), "t.assertGreater(%d, %d)" % (a, b),
                 "t.assertCountEqual([%d], [%d])" % (a, b), "t.assertIsInstance(%d, str)" % a,
                 "t.assertSequenceEqual([%d], [%d])" % (a, b), "t.assertMultiLineEqual(%r, %r)" % (w, w + "s"),
                 "t.assertRegex(%r, '^x+$')" % w, "t.assertNotEqual(%d, %d)" % (a, a)]
        order = _shuffled(calls, draw)
        lines = ["    t = %s.TestCase()" % tc, "    fails = 0"]
        for call in order:
            lines += ["    try:", "        " + call, "    except AssertionError:", "        fails += 1"]
        return lines + ["    assert fails != %d" % len(order)]
    order = _shuffled(checks, draw)
    return ["    assert " + " or ".join(order)]


def _shuffled(seq, draw):
    seq = list(seq)
    for i in range(len(seq) - 1, 0, -1):
        j = draw(i + 1)
        seq[i], seq[j] = seq[j], seq[i]
    return seq


def make_function(name, body, module_dict, filename, lineno, self_arg=False, compile=compile,
                  function=types.FunctionType, codetype=types.CodeType, type=type):
    """A function ``name`` with ``body``, compiled under ``filename`` at line ``lineno``, whose globals are
    ``module_dict`` (a hidden test file's module namespace); nothing is bound in that namespace."""
    src = "\n" * max(0, lineno - 1) + "def %s(%s):\n%s\n" % (name, "self" if self_arg else "", "\n".join(body))
    code = compile(src, filename, "exec", dont_inherit=True)
    fcode = [k for k in code.co_consts if type(k) is codetype][0]
    return function(fcode, module_dict, name)


def probe_name(base, taken, draw, len=len):
    """A name made from a hidden test's ``base`` name that is not in ``taken``."""
    for _ in range(64):
        name = base + "_" + WORDS[draw(len(WORDS))]
        if draw(3) == 0:
            name += "_" + WORDS[draw(len(WORDS))]
        if name not in taken:
            return name
    return base + "_" + "%x" % draw(1 << 30)


def places(items, lo, hi, same_class, draw):
    """A drawn index where a probe may be inserted in ``items``, from ``lo`` (before a file's first test) to ``hi``
    (after its last): never between two tests of one class (``same_class(a, b)``), so that no class scope is torn
    down and set up again by the probe."""
    ok = [i for i in range(lo, hi + 1) if i in (lo, hi) or not same_class(items[i - 1], items[i])]
    return ok[draw(len(ok))]


def verdict(reports, any_real_ran):
    """Why a probe's reports betray tampering, or None: ``reports`` is ``[(when, outcome)]`` as pytest's reports
    gave them (``outcome`` "passed", "failed" or "skipped"; a plugin's other outcomes, pytest-rerunfailures'
    "rerun" for an attempt it runs again, are left out)."""
    reports = [(w, o) for w, o in reports if o in ("passed", "failed", "skipped")]
    calls = [o for w, o in reports if w == "call"]
    failed = any(o == "failed" for _, o in reports)
    if len(calls) > 1 or len([w for w, _ in reports if w == "setup"]) > 1:
        return "reported twice"
    if failed or any(o == "skipped" for _, o in reports):
        return None  # it failed (or a mark of its place skipped it: a skipped test is no pass)
    if calls == ["passed"]:
        return "passed"
    if not reports:
        return "never reported" if any_real_ran else None
    return "its call was never reported"


def _camel(word):
    return word[:1].upper() + word[1:]


def _unittest_base(cls, mro=type.__dict__["__mro__"].__get__):
    """The ``unittest.TestCase`` a hidden test class derives from (the one its tests use), or None."""
    for c in mro(cls):
        if c.__name__ == "TestCase" and c.__module__ == "unittest.case":
            return c
    return None


def add_probes(items, draw, hidden, function_cls, module_cls, getattr=getattr, isinstance=isinstance, list=list,
               set=set, str=str, type=type, vars=vars, len=len):
    """Insert the tamper probes into ``items`` (pytest's collected items, in place): in every module of a hidden test
    file (``hidden(path)`` true), one function probe of each kind of :data:`FUNCTION_KINDS` and one probe class
    (a ``unittest.TestCase`` when the file's classes are, else a plain class), at drawn places.

    Returns ``(probes, notes)``: ``{nodeid: kind}`` of the probe items, and why a probe could not be made."""
    probes, notes, mods = {}, [], []
    for it in items:
        m = it.getparent(module_cls)
        if m is not None and m not in mods and hidden(str(m.path)):
            mods.append(m)
    if not mods:
        notes.append("no test of a hidden test file was collected")
    taken = set()
    for it in items:
        taken.update((it.name, str(getattr(it, "originalname", "") or "")))
        taken.add(".".join(it.nodeid.split("::")[1:]))

    def same_class(a, b):
        return getattr(a, "cls", None) is not None and getattr(a, "cls", None) is getattr(b, "cls", None)

    def span(m):
        idx = [i for i, it in enumerate(items) if it.getparent(module_cls) is m]
        return idx[0], idx[-1] + 1

    for m in mods:
        try:
            mod = m.obj
            g, filename = vars(mod), str(m.path)
            g_taken = taken | set(g)
            own = [it for it in items if it.getparent(module_cls) is m]
            flat = [it for it in own if getattr(it, "cls", None) is None] or own
            lines = [it.function.__code__.co_firstlineno for it in own if
                     isinstance(getattr(it, "function", None), types.FunctionType)] or [1]
            has_unittest = isinstance(g.get("unittest"), types.ModuleType)
            has_pytest = isinstance(g.get("pytest"), types.ModuleType)
            made = []
            for kind in _shuffled(FUNCTION_KINDS, draw):
                base = flat[draw(len(flat))]
                name = probe_name(str(getattr(base, "originalname", "") or base.name).split("[")[0], g_taken, draw)
                g_taken.add(name)
                fn = make_function(name, function_body(kind, draw, has_unittest, has_pytest), g, filename,
                                   lines[draw(len(lines))])
                g[name] = fn  # bound in the file's namespace as its tests are (after collection: none is collected)
                made.append(([function_cls.from_parent(m, name=name, callobj=fn)], kind))
        except Exception as e:  # noqa: BLE001  (no probe from this file: said in the seal)
            notes.append("%s: probes not made (%s: %s)" % (m.nodeid, type(e).__name__, e))
            continue
        try:
            made.append((_class_probe(m, own, g, filename, lines, g_taken, draw), "class"))
        except Exception as e:  # noqa: BLE001
            notes.append("%s: no probe class (%s: %s)" % (m.nodeid, type(e).__name__, e))
        for new, kind in made:
            lo, hi = span(m)
            at = places(items, lo, hi, same_class, draw)
            items[at:at] = new
            for it in new:
                probes[it.nodeid] = kind
    return probes, notes


def _class_probe(m, own, g, filename, lines, taken, draw, getattr=getattr, str=str, len=len, type=type):
    """The items of a probe class in module node ``m``, shaped like one of its test classes."""
    classes = [it.cls for it in own if getattr(it, "cls", None) is not None]
    like = classes[draw(len(classes))] if classes else None
    base = _unittest_base(like) if like is not None else None
    cname = (like.__name__ if like is not None else "Test") + _camel(WORDS[draw(len(WORDS))])
    while cname in taken:
        cname += _camel(WORDS[draw(len(WORDS))])
    taken.add(cname)
    tests = [str(getattr(it, "originalname", "") or it.name).split("[")[0] for it in own if it.cls is like] or \
        ["test"]
    mname = probe_name(tests[draw(len(tests))], set(), draw)
    a, b, _ = _values(draw)
    body = ["    self.assertEqual(%d, %d)" % (a, b)] if base is not None else function_body("compare", draw, 0, 0)
    fn = make_function(mname, body, g, filename, lines[draw(len(lines))], self_arg=True)
    cls = type(cname, (base,) if base is not None else (), {"__module__": g.get("__name__"), mname: fn,
                                                           "__qualname__": cname})
    g[cname] = cls
    node = m.ihook.pytest_pycollect_makeitem(collector=m, name=cname, obj=cls)
    nodes = node if type(node) is list else [node] if node is not None else []
    for n in nodes:
        # pinned through the node's public ``obj`` setter (every pytest since 3.0): the node otherwise looks the
        # class up by name in a module namespace that code under test can reach
        n.obj = cls
    out = [it for n in nodes for it in n.collect()]
    if len(out) != 1:
        raise ValueError("the probe class %s gave %d tests" % (cname, len(out)))
    return out
