"""Token-faithful outputs stay byte-identical across refactorings of the episode loop.

``tests/data/golden_episodes.json`` holds trajectories recorded by the code before the episode loop
was moved into ``agentfly_gym.rollout.episode`` (``python3 tests/golden_episodes.py --write``):
the runner on Chess in chain and step mode (seeded random policy, expert, the bundled SmolLM2 with
seeded sampling) and one ALFWorld game in both modes.  Real simulators and a real model; timings
are left out, everything else (ids, masks, logprobs, turns, step rows, messages, statuses) must
match exactly.
"""

from __future__ import annotations

import json

import pytest

from golden_episodes import GOLDEN, record

pytestmark = pytest.mark.timeout(300)


def _first_difference(a, b, path="") -> str:
    if type(a) is not type(b):
        return f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}: only in {'got' if k in a else 'expected'}"
            if json.dumps(a[k], sort_keys=True) != json.dumps(b[k], sort_keys=True):
                return _first_difference(a[k], b[k], f"{path}.{k}")
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            if json.dumps(x, sort_keys=True) != json.dumps(y, sort_keys=True):
                return _first_difference(x, y, f"{path}[{i}]")
    return f"{path}: {a!r} != {b!r}"


async def test_trajectories_are_identical_to_the_recorded_ones(shared_data):
    expected = json.loads(GOLDEN.read_text())
    got = json.loads(json.dumps(await record(), allow_nan=True))  # the same JSON round trip as the file
    assert sorted(got) == sorted(expected)
    for case in expected:
        # compared as JSON text: NaN logprobs compare equal and every float must match to the last bit
        same = json.dumps(got[case], sort_keys=True) == json.dumps(expected[case], sort_keys=True)
        assert same, f"{case}: {_first_difference(got[case], expected[case])}"
