"""edgemon's parking rule (`edgemon.policy.parking`) and the slack feed it can be fed
(`edgemon.engine.feed`): what is parked, for whom, and when it rejoins."""

from __future__ import annotations

import math

import pytest

from edgemon.engine import EngineConfig
from edgemon.engine.feed import SlackEntry, slack_feed
from edgemon.monitor import Monitor
from edgemon.policy.parking import BAND_MS, Lead, Parking

NEED = 300.0


def lead(name: str, ahead: float | None, *, playing: bool = True) -> Lead:
    """A stream `ahead` ms ahead of its player, needing `NEED` ms to rejoin."""
    return Lead(name, ahead, NEED, playing=playing)


def test_nothing_is_parked_while_no_request_waits_without_a_row() -> None:
    """Parking buys a waiting request a row: with nobody waiting, or a row free for each
    waiting request, no stream is parked, however far ahead."""
    rule = Parking()
    far = [lead("a", 10_000.0), lead("b", 9_000.0)]
    assert rule.held(far, waiting=0, free_rows=0) == frozenset()
    assert rule.held(far, waiting=2, free_rows=2) == frozenset()


def test_one_stream_is_parked_per_waiting_request_the_longest_leads_first() -> None:
    """Two requests wait with no free row: the two streams furthest beyond their need are
    parked, not the third, nor one within the band."""
    rule = Parking()
    leads = [
        lead("close", NEED + BAND_MS),  # within the band: never parked
        lead("far", 9_000.0),
        lead("farther", 12_000.0),
        lead("near", 3_000.0),
    ]
    assert rule.held(leads, waiting=2, free_rows=0) == {"far", "farther"}


def test_a_parked_stream_rejoins_once_its_lead_falls_to_its_need_rows_or_not() -> None:
    """Protection first: a parked stream whose lead fell to what it needs rejoins even though
    the request it made room for still waits and no row is free."""
    rule = Parking()
    assert rule.held([lead("a", 5_000.0)], waiting=1, free_rows=0) == {"a"}
    assert rule.held([lead("a", NEED + 1.0)], waiting=1, free_rows=0) == {"a"}
    assert rule.held([lead("a", NEED)], waiting=1, free_rows=0) == frozenset()


def test_unknown_leads_and_players_not_yet_playing_are_never_parked() -> None:
    """A stream the feed does not know, or whose listener still waits for playback to start,
    is never parked; a parked stream that drops out of the feed rejoins, and an ended one is
    forgotten."""
    rule = Parking()
    assert rule.held([lead("a", None), lead("b", 9e9, playing=False)], waiting=5, free_rows=0) == (
        frozenset()
    )
    assert rule.held([lead("c", 9_000.0)], waiting=1, free_rows=0) == {"c"}
    assert rule.held([lead("c", None)], waiting=1, free_rows=0) == frozenset()
    assert rule.held([lead("d", 9_000.0)], waiting=1, free_rows=0) == {"d"}
    assert rule.held([], waiting=1, free_rows=0) == frozenset()


def test_spare_rows_are_the_parked_streams_and_those_that_could_be() -> None:
    """What an arriving request may count on: parked streams and parkable ones, not a stream
    within the band nor one not yet playing."""
    rule = Parking()
    rule.held([lead("parked", 9_000.0)], waiting=1, free_rows=0)
    leads = [
        lead("parked", 2_000.0),
        lead("parkable", 5_000.0),
        lead("close", NEED + 10.0),
        lead("waiting", 5_000.0, playing=False),
    ]
    assert rule.spare(leads) == {"parked", "parkable"}


def test_a_band_below_zero_is_refused() -> None:
    """The band is a number ≥ 0."""
    with pytest.raises(ValueError, match="band"):
        Parking(band_ms=-1.0)


def test_a_feed_entry_ages_only_once_its_player_plays() -> None:
    """A playing stream's slack falls a millisecond per millisecond after the entry was made;
    one whose playback starts later keeps its slack until then."""
    playing = SlackEntry("a", 1_000.0, play_start_ms=0.0, t_ms=100.0)
    waiting = SlackEntry("b", 1_000.0, play_start_ms=500.0, t_ms=100.0)
    never = SlackEntry("c", 1_000.0, play_start_ms=math.inf, t_ms=100.0)
    assert (playing.playing, waiting.playing) == (True, False)
    assert playing.slack_at(400.0) == 700.0
    assert waiting.slack_at(400.0) == 1_000.0
    assert waiting.slack_at(700.0) == 800.0
    assert never.slack_at(1e9) == 1_000.0


def test_the_feed_is_what_the_monitor_measured_of_each_stream() -> None:
    """Fed the players' reports, the monitor's device gives one entry per stream with audio:
    its slack and its play start; a stream still waiting for its first chunk has none."""
    monitor = Monitor(EngineConfig())
    batch = (
        b'[{"type":"start","stream":"s1","t_ms":0},'
        b'{"type":"chunk","stream":"s1","t_ms":100,"seq":0,"audio_ms":2000,"play_start_ms":100},'
        b'{"type":"start","stream":"s2","t_ms":0},'
        b'{"type":"chunk","stream":"s2","t_ms":150,"seq":0,"audio_ms":400,'
        b'"play_start_ms":9007199254740992},'
        b'{"type":"start","stream":"s3","t_ms":50}]'
    )
    monitor.handle("edgemon/v1/box/events", batch, 200.0, [])
    device = monitor.engine.device("box")
    assert device is not None
    feed = {entry.stream: entry for entry in slack_feed(device.streams.values(), 600.0)}
    assert set(feed) == {"s1", "s2"}
    assert feed["s1"].slack_ms == 1_500.0
    assert feed["s1"].playing
    assert feed["s2"].slack_ms == 400.0
    assert not feed["s2"].playing
