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
from proctools import live_processes, wait_gone

pytestmark = pytest.mark.timeout(300)


async def test_trajectories_are_identical_to_the_recorded_ones(shared_data):
    before = live_processes(["java", "stockfish"])
    expected = json.loads(GOLDEN.read_text())
    got = json.loads(json.dumps(await record(), allow_nan=True))  # the same JSON round trip as the file
    assert sorted(got) == sorted(expected)
    for case in expected:
        # compared as JSON text: NaN logprobs compare equal and every float must match to the last bit
        assert json.dumps(got[case], sort_keys=True) == json.dumps(expected[case], sort_keys=True), case
    assert not wait_gone(live_processes(["java", "stockfish"]) - before), "a simulator process outlived the test"
