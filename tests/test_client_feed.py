"""`SlackFeedReader`: edgemon's slack feed as an engine reads it (docs/protocol.md, "Slack feed
object"): entries placed on the reader's clock, aged as the protocol says, joined to vLLM's
request ids; and the feed of a running daemon read through a real Mosquitto."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import pytest
from sessions import Clock

from edgemon.client.feed import SlackFeedReader, read_feed, stream_of
from edgemon.daemon.app import Daemon

from clients import chunk, device, now_ms, send, settings_for
from daemons import running
from links import until

if TYPE_CHECKING:
    from brokers import Broker


def _feed(t_ms: float, *streams: dict[str, Any]) -> bytes:
    return json.dumps({"device": "dev1", "t_ms": t_ms, "streams": list(streams)}).encode()


def _entry(stream: str, slack_ms: float, play_start_ms: float | None) -> dict[str, Any]:
    playing = play_start_ms is not None and play_start_ms <= 10_000.0
    return {
        "stream": stream,
        "slack_ms": slack_ms,
        "playing": playing,
        "play_start_ms": play_start_ms,
        "age_ms": 5.0,
    }


def test_entries_age_on_the_readers_clock_from_receipt() -> None:
    """A playing stream's lead falls one ms per ms after receipt; one whose play start is
    500 ms ahead keeps its lead for those 500 ms; one that has not said when keeps it."""
    streams = read_feed(
        _feed(
            10_000.0,
            _entry("playing", 900.0, 9_000.0),
            _entry("soon", 900.0, 10_500.0),
            _entry("waiting", 900.0, None),
        ),
        received_s=50.0,
    )
    at = 50.3  # 300 ms after receipt
    assert streams["playing"].lead_ms(at) == pytest.approx(600.0)
    assert streams["playing"].playing(at)
    assert streams["soon"].lead_ms(at) == pytest.approx(900.0)
    assert not streams["soon"].playing(at)
    assert streams["soon"].lead_ms(50.8) == pytest.approx(600.0)
    assert streams["soon"].playing(50.8)
    assert streams["waiting"].lead_ms(60.0) == pytest.approx(900.0)
    assert not streams["waiting"].playing(60.0)


@pytest.mark.parametrize(
    ("request_id", "stream"),
    [
        ("cmpl-req-42-0-1a2b3c4d", "req-42"),
        ("cmpl-tenant:abc-3-ABCDEFGH", "tenant:abc"),
        ("chatcmpl-req-42-1a2b3c4d", "req-42"),
        ("cmpl-1a2b3c4d", None),
        ("req-42", None),
        ("0", None),
    ],
)
def test_stream_of_joins_vllms_request_ids_to_the_players_stream(
    request_id: str, stream: str | None
) -> None:
    """vLLM's OpenAI server names a request `cmpl-{X-Request-Id}-{index}-{8 chars}` or
    `chatcmpl-{X-Request-Id}-{8 chars}`; anything else joins no stream."""
    assert stream_of(request_id) == stream


def test_a_new_object_replaces_the_last_and_an_old_one_is_ignored() -> None:
    """A stream absent from the latest object has ended; an object older than `max_age_ms`
    gives nothing."""
    clock = Clock(100.0)
    reader = SlackFeedReader("mqtt://127.0.0.1:1", "dev1", max_age_ms=3_000.0, clock=clock)
    assert reader.take(_feed(1.0, _entry("a", 500.0, 0.0), _entry("b", 700.0, 0.0)))
    assert reader.get("a") is not None
    assert reader.take(_feed(2.0, _entry("b", 650.0, 0.0)))
    assert reader.get("a") is None
    entry = reader.get("b")
    assert entry is not None
    assert entry.slack_ms == 650.0
    clock.now += 3.5
    assert reader.get("b") is None
    assert reader.received == 2


def test_a_payload_that_is_no_feed_is_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Bad payloads leave the last feed as it was, each is counted, and one warning says so."""
    reader = SlackFeedReader("mqtt://127.0.0.1:1", "dev1", clock=Clock(100.0))
    assert reader.take(_feed(1.0, _entry("a", 500.0, 0.0)))
    with caplog.at_level(logging.WARNING, logger="edgemon.client"):
        bad = [b"{", b"[]", _feed(1.0, {"stream": 3}), b'{"t_ms": 1, "streams": [{}]}']
        assert not any(reader.take(payload) for payload in bad)
    assert reader.rejected == len(bad)
    assert reader.get("a") is not None
    assert sum("not a slack feed object" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.integration
@pytest.mark.asyncio
async def test_the_reader_follows_a_running_daemons_feed(mosquitto_broker: Broker) -> None:
    """Through a real Mosquitto: a player's 2 s of audio reach the daemon, and the engine's
    reader holds the stream with the slack the daemon computed, playing."""
    broker = mosquitto_broker
    daemon = Daemon(settings_for(broker), environ={}, install_signal_handlers=False)
    reader = SlackFeedReader(
        broker.url, "dev1", topic_prefix=broker.prefix, client_id=broker.client_id("engine")
    )
    async with running(daemon), device(broker) as client:
        reader.open()
        try:
            first = chunk("s1", 0, 2_000, 50)
            sent = now_ms()
            await send(client, "dev1", {"type": "start", "stream": "s1", "t_ms": sent}, first)
            await until(lambda: reader.get("s1") is not None, "the stream in the engine's feed")
        finally:
            reader.close()
    entry = reader.get("s1")
    assert entry is not None
    assert entry.playing(entry.received_s)
    assert 0.0 < entry.slack_ms <= 2_000.0
    assert entry.start_in_ms is not None
    assert entry.start_in_ms <= 0.0
