"""Every environment's action parser: equal to the regex it replaced, linear in the input, never raising
anything but its own parse error (one action must not freeze every rollout).

The reference regexes below are the former implementations (upstream WebShop's ``parse_action`` regex
among them); hypothesis draws texts from the characters and words that drive their backtracking and
checks that the linear parsers return exactly what they returned.  The timing tests feed the inputs that
took seconds (WebShop ``"[" * 65536``: 31 s, R2E's repeated ``<function=a>``) at the env's size cap and
assert a bound two orders of magnitude above what the linear code needs, so they do not flake under load.
"""

from __future__ import annotations

import json
import re
import time

import chess
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentfly_gym.envs.base import AgentFlyEnv
from agentfly_gym.envs.chess.moves import MoveError, parse_move
from agentfly_gym.envs.prompting import _action_lines, _fence_bodies, extract_action
from agentfly_gym.envs.r2egym.actions import ActionParseError, parse_action as parse_tool_call
from agentfly_gym.envs.r2egym.env import R2EAgentPrompt
from agentfly_gym.envs.webshop.server import parse_action as parse_webshop

CAP = AgentFlyEnv.max_action_length  # every env truncates actions to this many characters

# The former implementations, kept as the oracle.
OLD_ACTION_RE = re.compile(r"(?:^|\n)\s*(?:\*\*)?action(?:\*\*)?\s*[:=]\s*(.+)", re.IGNORECASE)
OLD_FENCE_RE = re.compile(r"```(?:\w+)?\s*\n?(.*?)```", re.DOTALL)
UPSTREAM_WEBSHOP_RE = re.compile(r"(.+)\[(.+)\]")  # web_agent_site/envs/web_agent_text_env.py
OLD_LABEL_RE = re.compile(r"(?i)\b(?:action|move|answer)\b\s*\**\s*[:=]")
OLD_XML_BLOCK = re.compile(r"<function\s*=.*?</function>", re.DOTALL)
OLD_TOOL_CALL_BLOCK = re.compile(r"<tool_call>.*?</tool_call>", re.DOTALL)


def texts(pieces: list[str], max_size: int = 14):
    return st.lists(st.sampled_from(pieces), max_size=max_size).map("".join)


PROMPT_PIECES = ["\n", " ", "\t", "\r", "\u00a0", "*", "**", "action", "Action", "ACTION", ":", "=", "x", "y z",
                 "`", "```", "py", "[", "]", "\"", "'"]
SETTINGS = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(texts(PROMPT_PIECES))
def test_action_lines_equal_the_former_regex(text):
    assert _action_lines(text) == OLD_ACTION_RE.findall(text)


@SETTINGS
@given(texts(PROMPT_PIECES))
def test_fence_bodies_equal_the_former_regex(text):
    assert _fence_bodies(text) == OLD_FENCE_RE.findall(text)


@pytest.mark.slow
@SETTINGS
@given(texts(["[", "]", "a", "b[", "]c", "\n", " ", "click", "search", "\r"], max_size=16))
def test_webshop_parse_action_equals_upstreams_regex(text):
    m = UPSTREAM_WEBSHOP_RE.match(text)
    assert parse_webshop(text) == ((text, None) if m is None else (m.group(1), m.group(2)))


@SETTINGS
@given(texts(["action", "move", "answer", "Move", " ", "\n", "*", ":", "=", "x", "e4"]))
def test_chess_label_regex_matches_the_same_labels(text):
    from agentfly_gym.envs.chess.moves import _LABEL_RE

    assert [m.span() for m in _LABEL_RE.finditer(text)] == [m.span() for m in OLD_LABEL_RE.finditer(text)]


R2E_PIECES = ["<function=", "<function = ", "execute_bash", "finish", ">", "</function>", "<parameter=", "cmd",
              "</parameter>", "<tool_call>", "</tool_call>", "ls", "\n", " ", "{", "}", "\"", ":", "name"]


@SETTINGS
@given(texts(R2E_PIECES, max_size=16))
def test_r2e_prompt_keeps_the_same_block_as_the_former_regexes(text):
    old = text.strip()
    for rx in (OLD_XML_BLOCK, OLD_TOOL_CALL_BLOCK):
        blocks = rx.findall(text)
        if blocks:
            old = blocks[-1]
            break
    assert R2EAgentPrompt(system="").parse_action(text) == old


@SETTINGS
@given(st.text(max_size=200) | texts(R2E_PIECES, max_size=30))
def test_r2e_parser_raises_only_its_parse_error(text):
    try:
        call = parse_tool_call(text)
    except ActionParseError:
        return
    assert call.name in ("file_editor", "search", "execute_bash", "finish")


@pytest.mark.parametrize("text", [
    "[" * CAP,
    "a[" * (CAP // 2),
    "[]" * (CAP // 2),
])
def test_webshop_parser_is_linear(text):
    t0 = time.perf_counter()
    parse_webshop(text)
    assert time.perf_counter() - t0 < 2.0  # the regex took 31 s on "[" * 65536


@pytest.mark.parametrize("text", [
    "\n" * CAP,
    "```" + "a" * CAP,
    "action" + " " * CAP,
    ("Action" + " " * 50) * (CAP // 56),
    "move" + " " * CAP + "\n",
])
def test_prompt_and_chess_parsers_are_linear(text):
    t0 = time.perf_counter()
    extract_action(text)
    with pytest.raises(MoveError):
        parse_move(chess.Board(), text)
    assert time.perf_counter() - t0 < 2.0  # the former regexes took 6 s on 20,000 newlines


@pytest.mark.parametrize("text", [
    "<function=a>" * (CAP // 12),
    "<function=a" * (CAP // 11),
    "<function=execute_bash>" + "<parameter=cmd>" * (CAP // 15) + "</function>",
    "<tool_call>" * (CAP // 11),
    "{" * CAP,
    '{"' * (CAP // 2),
    '{"a": ' * (CAP // 6),
    '{"name": "execute_bash", "arguments": "' + "[" * (CAP - 60) + '"}',
])
def test_r2e_parser_is_linear_and_fails_cleanly(text):
    t0 = time.perf_counter()
    with pytest.raises(ActionParseError):
        parse_tool_call(text)
    R2EAgentPrompt(system="").parse_action(text)
    assert time.perf_counter() - t0 < 2.0


def test_r2e_deep_json_is_a_parse_error_not_a_recursion_error():
    deep = '{"name": "execute_bash", "arguments": ' + '{"a": ' * 5000 + "1" + "}" * 5001
    with pytest.raises(ActionParseError, match="nested too deeply"):
        parse_tool_call(deep)
    with pytest.raises(ActionParseError, match="nested too deeply"):
        parse_tool_call(json.dumps({"name": "execute_bash", "arguments": "[" * 5000}))


def test_r2e_json_call_after_many_braces_is_still_found():
    text = "{} " * 2000 + 'then {"name": "execute_bash", "arguments": {"cmd": "ls"}} done'
    assert parse_tool_call(text).arguments == {"cmd": "ls"}
