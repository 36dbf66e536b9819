"""The web Reporter's hand-off through shared memory (clients/js/src/handoff.ts), in Node
against the calls themselves: whatever way each call takes (a ring slot or a message) and
however late the messages come, the worker applies the calls made, in their order
(clients/js/test/handoff.mjs). The package must be built (`make test-browser` does).
"""

from __future__ import annotations

import json
import subprocess

from web_players import JS, node_command


def test_the_worker_applies_the_calls_made_in_their_order() -> None:
    """200 random sequences of calls (3 seeds: up to 8,000 calls each, odd fields, audio
    formats, streams that end and start again), the worker reading the ring and the messages
    at random moments, at times not before the ring is full, a call now and then that could
    not be posted (skipped, its stream's later calls named again): every other call applied
    once, equal to the call made, in order; both ways were taken, often."""
    for seed in (1, 2, 3):
        done = subprocess.run(
            [*node_command(), str(JS / "test" / "handoff.mjs"), str(seed), "200"],
            cwd=JS, capture_output=True, text=True, check=True, timeout=120,
        )  # fmt: skip
        result = json.loads(done.stdout)
        assert result["wrong"] == [], result
        assert result["onRing"] > result["calls"] / 5, result
        assert result["byMessage"] > result["calls"] / 5, result
        assert result["filled"] > 0, result
