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
    assert call.name == "finish" and call.arguments == {}


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
    assert "file_editor" in p.system and "execute_bash" in p.system and "finish" in p.system


# ---------------------------------------------------------------- grading on real pytest output
def _pytest_log(repo: Path, *extra: str) -> str:
    r = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "-o", "addopts=", *extra,
                        "tests"], cwd=repo, capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(repo), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PATH": "/usr/bin:/bin"}, check=False)
    return r.stdout + r.stderr


@pytest.fixture
def fixture_repo(tmp_path) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURES / "repos" / "minicalc", repo)
    shutil.copytree(FIXTURES / "hidden" / "minicalc" / "tests", repo / "tests")
    return repo


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
    assert parsed == expected and reward == 1.0
    # an erroring fixture gives ERROR; a broken module gives a collection ERROR and reward 0
    (fixture_repo / "tests" / "test_err.py").write_text(
        "import pytest\n@pytest.fixture\ndef boom():\n    raise RuntimeError('x')\ndef test_e(boom):\n    pass\n")
    assert parse_log_pytest(_pytest_log(fixture_repo))["test_e"] == "ERROR"
    (fixture_repo / "tests" / "test_err.py").unlink()
    ops.write_text("def add(:\n")
    reward, parsed = reward_from_log(_pytest_log(fixture_repo), expected)
    assert reward == 0.0 and "ERROR" in parsed.values()


def test_compare_and_parse_edge_cases():
    exp = {"a": "PASSED", "T.b": "PASSED"}
    assert compare_test_maps({"a": "PASSED", "T.b": "PASSED"}, exp) == 1.0
    assert compare_test_maps({"a": "PASSED"}, exp) == 0.0
    assert compare_test_maps({"a": "PASSED", "T.b": "PASSED", "c": "PASSED"}, exp) == 0.0
    assert compare_test_maps({"a": "PASSED", "T.b": "FAILED"}, exp) == 0.0
    assert parse_log_pytest("") == {} and parse_log_pytest("collected 0 items\nKilled") == {}
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
        assert t.docker_image == row["docker_image"] and not t.local
        assert t.issue == "Title: wrong sum" and t.expected == {"test_sum": "PASSED"}
        assert t.task_id == "pandas@abc123abc123" and t.gold_patch is None
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
    assert t.local and t.repo_dir.is_dir() and (t.hidden_dir / "tests" / "test_calc.py").is_file()
    assert not (t.repo_dir / "tests").exists()  # hidden tests are not in the repository
    assert t.gold_patch.startswith("diff --git a/minicalc/ops.py")
