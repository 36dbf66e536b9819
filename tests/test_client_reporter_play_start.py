"""A player that sends `start` at the request and prebuffers tells its playback start with the
first chunk (`Reporter.chunk(..., play_start_ms=)`, docs/protocol.md's optional chunk field)."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import pytest

from edgemon.client import Reporter

from mqtt_probe import probe

if TYPE_CHECKING:
    from collections.abc import Callable

    from brokers import Broker

pytestmark = pytest.mark.integration

T0 = 1_700_000_000_000.0


def clock() -> Callable[[], float]:
    """A device clock that advances 1 ms per reading."""
    ticks = itertools.count()
    return lambda: T0 + next(ticks)


def test_the_first_chunk_carries_the_playback_start(mosquitto_broker: Broker) -> None:
    """`start` at the request, then a chunk with `play_start_ms`: the chunk event carries it;
    later chunks without it carry none."""
    broker = mosquitto_broker
    topic = broker.topic("dev1", "events")
    with probe(broker.host, broker.port, topic) as watcher:
        reporter = broker.reporter(
            "dev1",
            flush_ms=500,
            clock=clock(),
            merge_chunks=False,  # two calls, two events: what this test reads
        )
        with reporter:
            reporter.start("req-1", margin_ms=80)
            reporter.chunk("req-1", audio_ms=400, eta_ms=1500, play_start_ms=T0 + 1350.5)
            reporter.chunk("req-1", audio_ms=2000, eta_ms=1500)
            assert reporter.flush(15)
        assert watcher.wait_for(lambda seen: len(seen) >= 1)
    events: list[dict[str, Any]] = [e for m in watcher.seen if m.topic == topic for e in m.json()]
    start, first, second = events
    assert start == {"type": "start", "stream": "req-1", "t_ms": T0, "margin_ms": 80.0}
    assert first["play_start_ms"] == T0 + 1350.5
    assert "play_start_ms" not in second


def test_a_bad_playback_start_is_refused_and_nothing_is_sent() -> None:
    """A negative or non-finite `play_start_ms` raises ValueError at the call (nothing invalid
    goes on the wire), as for `start`."""
    reporter = Reporter("mqtt://127.0.0.1:1", "dev1")
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="play_start_ms"):
            reporter.chunk("req-1", audio_ms=100, play_start_ms=bad)
    assert reporter.stats.events == 0
