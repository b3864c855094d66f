"""R2E-Gym: tool-call parsing (XML and JSON, malformed input), reward parsing of real pytest
output, and loading of R2E-Gym dataset rows.  No container needed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agentfly_gym.envs.r2egym import (
    ActionParseError,
    R2EGymEnv,
    compare_test_maps,
    load_tasks,
    parse_action,
    parse_log_pytest,
    reward_from_log,
)
from agentfly_gym.errors import ConfigError, DataNotFoundError
from r2e_hacks import NO_BYTECODE

FIXTURES = Path(__file__).parent / "fixtures" / "r2e"


# ---------------------------------------------------------------- action parsing
def test_xml_call_keeps_whitespace_and_converts_types():
    text = ("I will fix it.\n<function=file_editor>\n<parameter=command>str_replace</parameter>\n"
            "<parameter=path> /testbed/minicalc/ops.py </parameter>\n"
            "<parameter=old_str>\n    return a - b\n</parameter>\n"
            "<parameter=new_str>    return a + b</parameter>\n</function>")
    call = parse_action(text)
    assert call.name == "file_editor"
    assert call.arguments == {"command": "str_replace", "path": "/testbed/minicalc/ops.py",
                              "old_str": "    return a - b", "new_str": "    return a + b"}
    call = parse_action("<function=file_editor><parameter=command>view</parameter><parameter=path>/testbed/a.py"
                        "</parameter><parameter=view_range>[3, -1]</parameter></function>")
    assert call.arguments["view_range"] == [3, -1]
    call = parse_action("<function=file_editor><parameter=command>insert</parameter><parameter=path>/x</parameter>"
                        "<parameter=insert_line> 7 </parameter><parameter=new_str>y</parameter></function>")
    assert call.arguments["insert_line"] == 7
    # the last call of several wins; submit is finish
    call = parse_action("<function=search><parameter=search_term>a</parameter></function>\n<function=submit>\n</function>")
    assert call.name == "finish"
    assert call.arguments == {}


def test_json_calls():
    assert parse_action('{"name": "execute_bash", "arguments": {"cmd": "ls"}}').arguments == {"cmd": "ls"}
    c = parse_action('ok <tool_call>\n{"name": "search", "arguments": "{\\"search_term\\": \\"def add\\"}"}\n</tool_call>')
    assert (c.name, c.arguments) == ("search", {"search_term": "def add"})
    c = parse_action('Let me look. {"name": "file_editor", "parameters": {"command": "view", "path": "/testbed", '
                     '"view_range": [1, 5]}} done')
    assert c.arguments["view_range"] == [1, 5]


@pytest.mark.parametrize("text, fragment", [
    ("", "empty"),
    ("I think the bug is in ops.py", "no tool call found"),
    ("<function=rm_rf><parameter=path>/</parameter></function>", "unknown tool 'rm_rf'"),
    ("<function=execute_bash><parameter=command>ls</parameter></function>", "no parameter(s) ['command']"),
    ("<function=search><parameter=path>/testbed</parameter></function>", "missing required parameter(s) ['search_term']"),
    ("<function=execute_bash><parameter=cmd>ls</parameter>", "no closing </function>"),
    ("<function=file_editor><parameter=command>delete</parameter><parameter=path>/a</parameter></function>",
     "command='delete' is not one of"),
    (("<function=file_editor><parameter=command>view</parameter><parameter=path>/a</parameter>"
     "<parameter=view_range>[1]</parameter></function>"), "view_range"),
    (("<function=file_editor><parameter=command>insert</parameter><parameter=path>/a</parameter>"
     "<parameter=insert_line>two</parameter><parameter=new_str>x</parameter></function>"), "insert_line='two'"),
    ('{"name": "search", "arguments": "{not json"}', "not valid JSON"),
    ('{"name": "search", "arguments": [1, 2]}', "must be an object"),
])
def test_malformed_calls_say_what_is_wrong(text, fragment):
    with pytest.raises(ActionParseError) as ei:
        parse_action(text)
    assert fragment in str(ei.value)


def test_agent_prompt_extracts_the_last_tool_block():
    p = R2EGymEnv.agent_prompt
    reply = "Thoughts...\n<function=search>\n<parameter=search_term>x</parameter>\n</function>\ntrailing words"
    assert p.parse_action(reply) == "<function=search>\n<parameter=search_term>x</parameter>\n</function>"
    assert p.parse_action(' {"name": "finish", "arguments": {}} ') == '{"name": "finish", "arguments": {}}'
    assert "file_editor" in p.system
    assert "execute_bash" in p.system
    assert "finish" in p.system


# ---------------------------------------------------------------- grading on real pytest output
def _pytest_log(repo: Path, *extra: str) -> str:
    r = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "-o", "addopts=", *extra,
                        "tests"], cwd=repo, capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(repo), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PATH": "/usr/bin:/bin"}, check=False)
    return r.stdout + r.stderr


@pytest.fixture
def fixture_repo(tmp_path) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURES / "repos" / "minicalc", repo, ignore=NO_BYTECODE)
    shutil.copytree(FIXTURES / "hidden" / "minicalc" / "tests", repo / "tests", ignore=NO_BYTECODE)
    return repo


@pytest.mark.slow
def test_reward_from_real_pytest_runs(fixture_repo):
    expected = json.loads(load_tasks(FIXTURES / "tasks.jsonl")[0].row["expected_output_json"])
    log = _pytest_log(fixture_repo)
    assert "short test summary info" in log
    reward, parsed = reward_from_log(log, expected)
    assert parsed == {"test_add": "FAILED", "test_sub": "PASSED", "TestMul.test_mul": "PASSED"}
    assert reward == 0.0
    ops = fixture_repo / "minicalc" / "ops.py"
    ops.write_text(ops.read_text().replace("return a - b", "return a + b", 1))
    reward, parsed = reward_from_log(_pytest_log(fixture_repo, "--color=yes"), json.dumps(expected))
    assert parsed == expected
    assert reward == 1.0
    # an erroring fixture gives ERROR; a broken module gives a collection ERROR and reward 0
    (fixture_repo / "tests" / "test_err.py").write_text(
        "import pytest\n@pytest.fixture\ndef boom():\n    raise RuntimeError('x')\ndef test_e(boom):\n    pass\n")
    assert parse_log_pytest(_pytest_log(fixture_repo))["test_e"] == "ERROR"
    (fixture_repo / "tests" / "test_err.py").unlink()
    ops.write_text("def add(:\n")
    reward, parsed = reward_from_log(_pytest_log(fixture_repo), expected)
    assert reward == 0.0
    assert "ERROR" in parsed.values()


def test_compare_and_parse_edge_cases():
    exp = {"a": "PASSED", "T.b": "PASSED"}
    assert compare_test_maps({"a": "PASSED", "T.b": "PASSED"}, exp) == 1.0
    assert compare_test_maps({"a": "PASSED"}, exp) == 0.0
    assert compare_test_maps({"a": "PASSED", "T.b": "PASSED", "c": "PASSED"}, exp) == 0.0
    assert compare_test_maps({"a": "PASSED", "T.b": "FAILED"}, exp) == 0.0
    assert parse_log_pytest("") == {}
    assert parse_log_pytest("collected 0 items\nKilled") == {}
    log = ("=== short test summary info ===\nPASSED t.py::a\nFAILED t.py::T::b - AssertionError: x - y\n"
           "ERROR t.py::c - RuntimeError\n=== 1 failed ===")
    assert parse_log_pytest(log) == {"a": "PASSED", "T.b": "FAILED", "c": "ERROR"}


# ---------------------------------------------------------------- task loading
def _upstream_row() -> dict:
    return {"repo_name": "pandas", "docker_image": "namanjain12/pandas_final:abc123", "commit_hash": "abc123" * 6,
            "problem_statement": "[ISSUE]\nTitle: wrong sum\n[/ISSUE]", "parsed_commit_content": "{}",
            "expected_output_json": json.dumps({"test_sum": "PASSED"}), "modified_files": ["pandas/core/x.py"],
            "execution_result_content": "", "relevant_files": [], "prompt": ""}


def test_load_upstream_rows_from_jsonl_and_parquet(tmp_path):
    row = _upstream_row()
    (tmp_path / "rows.jsonl").write_text(json.dumps(row) + "\n")
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "rows.parquet")
    for name in ("rows.jsonl", "rows.parquet"):
        (t,) = load_tasks(tmp_path / name)
        assert t.docker_image == row["docker_image"]
        assert not t.local
        assert t.issue == "Title: wrong sum"
        assert t.expected == {"test_sum": "PASSED"}
        assert t.task_id == "pandas@abc123abc123"
        assert t.gold_patch is None
    bad = dict(row)
    del bad["expected_output_json"]
    (tmp_path / "bad.jsonl").write_text(json.dumps(bad) + "\n")
    with pytest.raises(ConfigError, match="expected_output_json"):
        load_tasks(tmp_path / "bad.jsonl")
    with pytest.raises(DataNotFoundError):
        load_tasks(tmp_path / "missing.jsonl")
    with pytest.raises(ConfigError, match="docker_image"):
        load_tasks(_write(tmp_path / "noimg.jsonl", {**row, "docker_image": ""}))


def _write(path: Path, row: dict) -> Path:
    path.write_text(json.dumps(row) + "\n")
    return path


def test_local_fixture_task_resolves_paths():
    (t,) = load_tasks(FIXTURES)
    assert t.local
    assert t.repo_dir.is_dir()
    assert (t.hidden_dir / "tests" / "test_calc.py").is_file()
    assert not (t.repo_dir / "tests").exists()  # hidden tests are not in the repository
    assert t.gold_patch.startswith("diff --git a/minicalc/ops.py")


# ---------------------------------------------------------------- isolated grading: diff filter, JUnit map
def _git(cwd: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True).stdout


@pytest.fixture
def model_diff(tmp_path) -> tuple[Path, bytes]:
    """A real ``git diff --binary`` (as the env exports it) of a fix plus every kind of change a fix may not make."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    (repo / "tests" / "test_a.py").write_text("def test(): pass\n")
    (repo / "data.bin").write_bytes(b"bin\x00ary")
    _git(repo, "init", "-q", ".")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    base = repo.parent / "base"
    shutil.copytree(repo, base)
    (repo / "pkg" / "mod.py").write_text("def f():\n    return 2\n")          # the fix
    (repo / "data.bin").write_bytes(b"bin\x01ary\x00\xff")                    # a binary change
    (repo / "we ird\tname.py").write_text("x = 1\n")                          # a quoted path
    (repo / "pkg" / "conftest.py").write_text("x = 1\n")
    (repo / "pytest.py").write_text("x = 1\n")
    (repo / "sitecustomize.py").write_text("x = 1\n")
    (repo / "pkg" / "x.pth").write_text("import os\n")
    for package in ("sitecustomize", "src/usercustomize", "afg_plug"):  # start-up hooks and a plugin as packages
        (repo / package).mkdir(parents=True)
        (repo / package / "__init__.py").write_text("x = 1\n")
    (repo / "lib").mkdir()
    (repo / "lib" / "pkg.egg-link").write_text("/testbed\n")
    (repo / "pkg" / "__pycache__").mkdir()
    (repo / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\x00pyc")
    (repo / "pkg.egg-info").mkdir()
    (repo / "pkg.egg-info" / "entry_points.txt").write_text("[pytest11]\nx = pkg.mod\n")
    (repo / "setup.cfg").write_text("[tool:pytest]\naddopts = -p pkg.mod\n")
    (repo / "tests" / "test_a.py").write_text("def test(): assert 1\n")
    (repo / "tests" / "helper.py").write_text("x = 1\n")
    (repo / "numpy.py").write_text("x = 1\n")
    (repo / "link").symlink_to("/etc/passwd")
    _git(repo, "add", "-A")
    diff = _git(repo, "diff", "--cached", "--binary", "--no-renames", "--full-index", "HEAD")
    return base, diff


def test_filter_diff_keeps_the_fix_and_drops_what_steers_the_tests(model_diff):
    from agentfly_gym.envs.r2egym.isolation import (DiffRules, filter_diff, hidden_test_rules, plugin_modules,
                                                    shadow_candidates)

    base, diff = model_diff
    assert "numpy" in shadow_candidates(diff)  # (whether a name exists already is asked in the grading box)
    files, dirs = hidden_test_rules(["tests/test_a.py"])
    out = filter_diff(diff, DiffRules(files, dirs, frozenset({"numpy"}), plugin_modules("", "afg_plug")))
    assert sorted(out.kept) == ["data.bin", "pkg/mod.py", "we ird\tname.py"]
    reasons = {d["path"]: d["reason"] for d in out.dropped}
    assert set(reasons) == {"pkg/conftest.py", "pytest.py", "sitecustomize.py", "pkg/x.pth",
                            "pkg/__pycache__/mod.cpython-311.pyc", "pkg.egg-info/entry_points.txt", "setup.cfg",
                            "tests/test_a.py", "tests/helper.py", "numpy.py", "link", "sitecustomize/__init__.py",
                            "src/usercustomize/__init__.py", "afg_plug/__init__.py", "lib/pkg.egg-link"}, reasons
    assert "start-up" in reasons["sitecustomize/__init__.py"]
    assert "PYTEST_PLUGINS" in reasons["afg_plug/__init__.py"]
    assert "symbolic link" in reasons["link"]
    assert "hidden test" in reasons["tests/test_a.py"]
    # the kept part applies to a clean copy and makes exactly the kept changes
    subprocess.run(["git", "apply", "-"], input=out.diff, cwd=base, check=True, capture_output=True)
    status = _git(base, "status", "--porcelain", "-z", "--untracked-files=all").split(b"\0")
    assert sorted(s[3:].decode() for s in status if s) == ["data.bin", "pkg/mod.py", "we ird\tname.py"]
    assert (base / "data.bin").read_bytes() == b"bin\x01ary\x00\xff"


def test_filter_diff_refuses_text_smuggled_after_a_hunk():
    """``git apply`` also reads traditional ``---``/``+++`` headers between file sections: text after a
    section's last hunk could patch a file the filter never saw (here ``conftest.py``), so such a section is
    dropped whole; so are malformed headers and hunks whose line counts do not match."""
    from agentfly_gym.envs.r2egym.isolation import filter_diff

    good = (b"diff --git a/m.py b/m.py\nindex 1111111..2222222 100644\n--- a/m.py\n+++ b/m.py\n"
            b"@@ -1 +1 @@\n-x = 1\n+x = 2\n")
    smuggled = good + b"--- a/conftest.py\n+++ b/conftest.py\n@@ -0,0 +1 @@\n+import evil\n"
    assert filter_diff(good).kept == ["m.py"]
    out = filter_diff(smuggled)
    assert out.kept == []
    assert out.diff == b""
    assert out.dropped == [{"path": "m.py", "reason": "text outside a hunk"}]
    short = good.replace(b"@@ -1 +1 @@", b"@@ -1,2 +1 @@")
    assert filter_diff(short).kept == []
    bad_header = b"diff --git a/m.py b/other.py\n" + good.split(b"\n", 1)[1]
    assert filter_diff(bad_header).dropped[0]["reason"] == "malformed diff header"
    assert filter_diff(b"--- a/x\n+++ b/x\n@@ -0,0 +1 @@\n+y\n").dropped[0]["reason"].startswith("text before")
    escape = good.replace(b"m.py", b"../m.py")
    assert filter_diff(escape).dropped[0]["reason"] == "invalid path"
    venv = good.replace(b"m.py", b".venv/lib/python3.9/site-packages/_pytest/runner.py")
    assert filter_diff(venv).dropped[0]["reason"].startswith("installed packages")


def test_junit_map_matches_upstreams_log_parse(tmp_path):
    """The same pytest run read both ways: JUnit XML mapped onto R2E-Gym's names gives upstream's map (passes,
    failures, setup and teardown errors, parametrized ids with '::' and ' - ', inherited tests, xpass and
    xfail and skip left out) except where the log parser is fooled: a failure whose message says PASSED."""
    from agentfly_gym.envs.r2egym.grading import _normalise
    from agentfly_gym.envs.r2egym.isolation import isolated_test_map

    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "__init__.py").write_text("")
    (tests / "base.py").write_text("class Base:\n    def test_inherited(self):\n        pass\n")
    (tests / "test_x.py").write_text('''import pytest
from tests.base import Base
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
@pytest.mark.skip
def test_skip(): pass
''')
    report = tmp_path / "report.xml"
    r = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "tests/test_x.py",
                        f"--junitxml={report}", "-o", "junit_family=xunit1"], cwd=tmp_path, capture_output=True,
                       text=True, env={"PATH": "/usr/bin:/bin", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    log = r.stdout + r.stderr
    junit = _normalise(isolated_test_map(report.read_bytes(), log, test_files=["tests/test_x.py"]))
    upstream = _normalise(parse_log_pytest(log))
    assert upstream.pop("test_fooled") == "PASSED"
    assert junit.pop("test_fooled") == "FAILED"
    assert junit == upstream, (junit, upstream)
    assert junit["TestInh.test_inherited"] == "PASSED"
    assert junit["TestC.test_p[a.b]"] == "PASSED"
    assert junit["test_teardown_error"] == junit["test_setup_error"] == "ERROR"
    assert "test_xpass" not in junit


def test_grading_mode_is_checked():
    with pytest.raises(ConfigError, match="grading"):
        R2EGymEnv(tasks=FIXTURES / "tasks.jsonl", backend="sandbox", grading="yes")
    assert R2EGymEnv(tasks=FIXTURES / "tasks.jsonl", backend="sandbox").grading == "isolated"


@pytest.mark.parametrize("action", [
    '{"name": "execute_bash", "arguments": {"cmd": "echo \\ud800 hi"}}',            # a lone surrogate escape
    '<tool_call>{"name": "file_editor", "arguments": {"command": "create", "path": "/testbed/\\udfff.py", '
    '"file_text": "x"}}</tool_call>',
    '{"name": "file_editor", "arguments": {"command": "view", "path": "/testbed/a.py", "view_range": [1, 1e999]}}',
    '{"name": "file_editor", "arguments": {"command": "view", "path": "/testbed/a.py", "view_range": [1, Infinity]}}',
])
def test_json_values_no_command_can_hold_are_parse_errors(action):
    """Found by the newcomer check: these raised UnicodeEncodeError / OverflowError deep in the tool run and
    ended the episode; they are malformed actions, answered with a message the model can act on."""
    from agentfly_gym.envs.r2egym.actions import ActionParseError, parse_action

    with pytest.raises(ActionParseError, match="surrogate|view_range"):
        parse_action(action)
