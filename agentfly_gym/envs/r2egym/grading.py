"""Grading of R2E-Gym tasks: parse pytest's short test summary, compare with the expected map.

The format and the rule follow R2E-Gym (``r2egym/repo_analysis/execution_log_parser.py``
``parse_log_pytest`` and ``DockerRuntime._calculate_reward_r2e``):

* the tests run with ``pytest -rA``, so every test appears in the "short test summary info"
  section as ``PASSED path::Class::test``, ``FAILED path::test - message`` or
  ``ERROR path::test - message``;
* a test's name is the part after the first ``::`` with the remaining ``::`` turned into
  ``.`` (``tests/test_x.py::TestA::test_b[1]`` -> ``TestA.test_b[1]``), text after ``" - "``
  dropped;
* the reward is 1.0 only when the parsed map equals the expected map exactly (same keys,
  same statuses), else 0.0.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

__all__ = ["STATUSES", "compare_test_maps", "decolor", "parse_log_pytest", "reward_from_log"]

STATUSES = ("PASSED", "FAILED", "ERROR")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def decolor(text: str) -> str:
    """``text`` without ANSI colour escapes and carriage returns."""
    return _ANSI.sub("", text).replace("\r", "")


def parse_log_pytest(log: str | None) -> dict[str, str]:
    """The ``{test name: "PASSED"|"FAILED"|"ERROR"}`` map of a ``pytest -rA`` log.

    Args:
        log: the combined stdout/stderr of the pytest run (ANSI colours allowed).

    Returns:
        An empty dict when the log has no "short test summary info" section (e.g. pytest
        could not start, or the run was killed).  Names as in R2E-Gym (see module docstring).
    """
    if not log:
        return {}
    log = decolor(log)
    if "short test summary info" not in log:
        return {}
    out: dict[str, str] = {}
    for line in log.split("short test summary info", 1)[1].strip().split("\n"):
        # R2E-Gym's precedence: PASSED, then FAILED, then ERROR, by substring.
        if "PASSED" in line:
            out[".".join(line.split("::")[1:])] = "PASSED"
        elif "FAILED" in line:
            out[".".join(line.split("::")[1:]).split(" - ")[0]] = "FAILED"
        elif "ERROR" in line:
            out[".".join(line.split("::")[1:]).split(" - ")[0]] = "ERROR"
    return out


def _normalise(m: Mapping[str, str]) -> dict[str, str]:
    return {decolor(k).split(" - ")[0]: v for k, v in sorted(m.items())}


def compare_test_maps(parsed: Mapping[str, str], expected: Mapping[str, str] | str) -> float:
    """1.0 when ``parsed`` equals ``expected`` exactly (after R2E-Gym's key normalisation), else 0.0.

    Args:
        parsed: the map from :func:`parse_log_pytest`.
        expected: the task's expected map, or its JSON text (``expected_output_json``).
    """
    if isinstance(expected, str):
        expected = json.loads(expected)
    p, e = _normalise(parsed), _normalise(expected)
    if len(p) != len(e):
        return 0.0
    for k, v in p.items():
        if not k:
            continue  # as upstream: an unnamed entry only counts through the length check
        if e.get(k) != v:
            return 0.0
    return 1.0


def reward_from_log(log: str, expected: Mapping[str, str] | str) -> tuple[float, dict[str, str]]:
    """``(reward, parsed map)`` for a pytest log and a task's expected map."""
    parsed = parse_log_pytest(log)
    return compare_test_maps(parsed, expected), parsed
