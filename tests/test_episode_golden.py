"""Token-faithful outputs stay byte-identical across refactorings of the episode loop.

``tests/data/golden_episodes.json`` holds trajectories recorded by the code before the episode loop
was moved into ``agentfly_gym.rollout.episode`` (``python3 tests/golden_episodes.py --write``):
the runner on Chess in chain and step mode (seeded random policy, expert, the bundled SmolLM2 with
seeded sampling) and one ALFWorld game in both modes.  Real simulators and a real model; timings
are left out, everything else (ids, masks, turns, step rows, messages, statuses) must match exactly,
and so must a scripted policy's logprobs (NaN).  A model's logprobs match to ``LOGPROB_ATOL`` nats: the
float32 CPU kernels of torch and transformers differ in the last bits between builds (the locked set
gives differences of about 4e-6 on the SmolLM2 cases), while a token shifted by one or a changed
sampling path shows as a gap of whole nats.
"""

from __future__ import annotations

import json
import math

import pytest

from golden_episodes import GOLDEN, record

pytestmark = pytest.mark.timeout(300)
LOGPROB_ATOL = 1e-4


def _same(a, b, key: str = "") -> bool:
    """Exact equality, except floats under a ``*logprobs`` key: equal to LOGPROB_ATOL (NaN equals NaN)."""
    if isinstance(a, float) and isinstance(b, float) and key.endswith("logprobs"):
        return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= LOGPROB_ATOL
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], k) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y, key) for x, y in zip(a, b))
    return json.dumps(a) == json.dumps(b)


def _first_difference(a, b, path="") -> str:
    if type(a) is not type(b):
        return f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}: only in {'got' if k in a else 'expected'}"
            if not _same(a[k], b[k], k):
                return _first_difference(a[k], b[k], f"{path}.{k}")
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            if not _same(x, y, path.rsplit(".", 1)[-1]):
                return _first_difference(x, y, f"{path}[{i}]")
    return f"{path}: {a!r} != {b!r}"


@pytest.mark.slow
async def test_trajectories_are_identical_to_the_recorded_ones(test_data):
    expected = json.loads(GOLDEN.read_text())
    got = json.loads(json.dumps(await record(), allow_nan=True))  # the same JSON round trip as the file
    assert sorted(got) == sorted(expected)
    for case in expected:
        assert _same(got[case], expected[case]), f"{case}: {_first_difference(got[case], expected[case])}"


def test_the_comparison_has_teeth():
    """A shifted token or a logprob off by more than the tolerance is a difference; kernel noise is not."""
    row = {"response_ids": [1, 2], "response_logprobs": [-0.5, float("nan")], "response_mask": [1, 0]}
    assert _same(row, {**row, "response_logprobs": [-0.5 + 4e-6, float("nan")]})
    assert not _same(row, {**row, "response_logprobs": [-0.5 + 1e-3, float("nan")]})
    assert not _same(row, {**row, "response_logprobs": [-0.5, -0.1]})
    assert not _same(row, {**row, "response_ids": [2, 1]})
    assert not _same([row], [{**row, "response_mask": [1, 1]}])
