"""Listeners and players doing what the server cannot see (`edgemon.simulate.listeners`):
pauses, Wi-Fi stalls, the player's own stalls and prebuffers, as the players score them and as
their reports tell edgemon; and the policy fed what they measured (`feed:`, `park:`)."""

from __future__ import annotations

import math

import pytest

from edgemon.simulate.engine import Chunk
from edgemon.simulate.listeners import ListenerPlan, listening
from edgemon.simulate.loop import LoopPlan, run_loop
from edgemon.simulate.players import Player
from edgemon.simulate.policies import policy
from edgemon.simulate.profiles import JETSON
from edgemon.simulate.scenarios import scenario


def chunk(seq: int, audio_ms: float, *, final: bool = False) -> Chunk:
    """A chunk of stream `s` announcing no wait."""
    return Chunk("s", seq, round(audio_ms / 80), audio_ms, final, 0.0, None)


def test_a_pause_moves_the_play_start_and_is_no_gap() -> None:
    """Playing from 200 with 2 s buffered, the listener pauses at 1000 for 5 s: the player
    holds its audio meanwhile, a chunk at 6000 finds it not dry, its start silence is still
    200, and its Reporter gives the play start as far as the pause has gone."""
    player = Player("s", requested_ms=0.0, cushion_ms=200.0)
    player.receive(chunk(0, 2000.0), 0.0)
    assert player.hold(1000.0, 5000.0)
    assert player.reported_start_ms(3000.0) == 2200.0
    assert player.reported_start_ms(6000.0) == 5200.0
    player.receive(chunk(1, 2000.0, final=True), 6000.0)
    player.settle(10_000.0)
    assert (player.underruns, player.longest_gap_ms) == (0, 0.0)
    assert player.start_silence_ms(10_000.0) == 200.0
    assert player.outcome(10_000.0) == "good"


def test_a_pause_is_ignored_unless_the_player_is_playing_audio() -> None:
    """Before the start, and once the buffer ran dry, a pause changes nothing."""
    player = Player("s", requested_ms=0.0, cushion_ms=500.0)
    player.receive(chunk(0, 400.0), 0.0)
    assert not player.hold(100.0, 1000.0)  # starts at 500
    assert not player.hold(1000.0, 1000.0)  # dry from 900
    assert player.start_ms == 500.0


def test_a_prebuffering_player_starts_once_it_holds_its_prebuffer() -> None:
    """A 0.6 s player starts at the chunk that brings it 600 ms; a whole-stream player at the
    final chunk; until then they report no start."""
    short = Player("s", requested_ms=0.0, start_at_audio_ms=600.0)
    short.receive(chunk(0, 400.0), 100.0)
    assert short.start_ms is None
    assert short.reported_start_ms(150.0) is None
    short.receive(chunk(1, 400.0), 900.0)
    assert short.start_ms == 900.0
    whole = Player("s", requested_ms=0.0, start_at_audio_ms=math.inf)
    whole.receive(chunk(0, 400.0), 100.0)
    whole.receive(chunk(1, 2000.0, final=True), 2500.0)
    assert whole.start_ms == 2500.0
    assert whole.start_silence_ms(9_000.0) == 2500.0


def test_a_rebuffering_player_stops_until_it_holds_more_after_each_underrun() -> None:
    """Starting at 600 ms held, it runs dry at 100 + 800 = 900; a 400 ms chunk at 1000 is not
    the 900 ms it now waits for (600 + 300); 500 ms more at 1500 is: one underrun of 600 ms,
    and it plays on from 1500 with 900 ms held, until it runs dry again at 2400. Its start
    silence stays the 100 ms before it first played."""
    player = Player("s", requested_ms=0.0, start_at_audio_ms=600.0, rebuffer_step_ms=300.0)
    player.receive(chunk(0, 800.0), 100.0)
    assert player.start_ms == 100.0
    player.receive(chunk(1, 400.0), 1000.0)
    assert player.underruns == 0
    assert player.slack_ms(1200.0) == 400.0  # stopped: it holds what came
    assert player.played_ms(1200.0) == 800.0
    assert player.reported_start_ms(1200.0) == 400.0
    player.receive(chunk(2, 500.0), 1500.0)
    assert (player.underruns, player.underrun_ms, player.longest_gap_ms) == (1, 600.0, 600.0)
    assert player.slack_ms(1500.0) == 900.0
    player.settle(5_000.0)  # dry again at 2400, never restarted: a second underrun
    assert (player.underruns, player.longest_gap_ms) == (2, 2600.0)
    assert player.start_silence_ms(5_000.0) == 100.0  # a stop is a gap, not a later start


def test_a_stalled_link_delivers_what_it_held_when_it_comes_back() -> None:
    """Inside a stall a delivery waits for its end; outside it arrives as sent."""
    link = ListenerPlan(stalls=((1000.0, 2500.0), (4000.0, 4500.0)))
    assert link.delivered_ms(999.0) == 999.0
    assert link.delivered_ms(1000.0) == 2500.0
    assert link.delivered_ms(2499.0) == 2500.0
    assert link.delivered_ms(3000.0) == 3000.0
    assert link.delivered_ms(4200.0) == 4500.0


def test_listeners_are_drawn_per_run_and_stream_as_their_flags_say() -> None:
    """The same seed and stream give the same listener; pauses last between MIN_S and MAX_S
    and come to about the share asked; Wi-Fi stalls last between MIN_S and MAX_S; device
    stalls fall within the stream's audio; prebuffers come in three kinds."""
    pause = listening("pause", "0.5:2:30")
    assert pause.plan(1, "r7", 20_000.0, 0.0) == pause.plan(1, "r7", 20_000.0, 0.0)
    plans = [pause.plan(1, f"r{i}", 20_000.0, 0.0) for i in range(400)]
    paused = [p.holds[0] for p in plans if p.holds]
    assert 150 < len(paused) < 250
    assert all(4_000.0 <= at <= 16_000.0 and 2_000.0 <= d <= 30_000.0 for at, d in paused)
    wifi = listening("wifi", "0.5:2:10").plan(1, "r1", 20_000.0, 500.0)
    assert wifi.stalls
    assert all(a > 500.0 and 500.0 <= b - a <= 2_000.0 for a, b in wifi.stalls)
    device = listening("device", "0.2:1:2").plan(1, "r1", 20_000.0, 0.0)
    assert device.holds
    assert all(0.0 < at < 20_000.0 and 200.0 <= d <= 1_000.0 for at, d in device.holds)
    prebuffer = listening("prebuffer", "0.2:0.6:0.3")
    kinds = {prebuffer.plan(1, f"r{i}", 1.0, 0.0).start_at_audio_ms for i in range(60)}
    assert kinds == {200.0, 600.0, math.inf}


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("pause", "1.5:2:30", "share of listeners"),
        ("pause", "0.5:30:2", "MIN_S must be at most MAX_S"),
        ("wifi", "2:1:10", "MIN_S must be at most MAX_S"),
        ("prebuffer", "0.6:0.2:0.3", "SHORT_S must be at most LONG_S"),
        ("device", "0.2:1", "3 numbers > 0"),
        ("wifi", "0.5:nan:10", "3 numbers > 0"),
    ],
)
def test_listener_flags_say_what_is_wrong(name: str, text: str, words: str) -> None:
    """A bad flag is refused with a line naming what is wrong."""
    with pytest.raises(ValueError, match=words):
        listening(name, text)


def loop_run(scene: str, text: str, **flags: str) -> LoopPlan:
    """A short loaded jetson run of `text` in scenario `scene`."""
    return LoopPlan(
        profile=JETSON,
        rate_rps=0.9 * JETSON.capacity_rps(),
        seed=606,
        duration_ms=60_000.0,
        policy=policy(text, JETSON),
        scenario=scenario(scene, listeners=flags),
    )


def test_a_wifi_stall_holds_a_players_chunks_back() -> None:
    """With every link stalling often, some chunks reach their players seconds late, at a
    stall's end: players hear underruns the steady run does not have."""
    stalled = run_loop(loop_run("wifi", "edgemon", wifi="1:2:5"))
    steady = run_loop(loop_run("steady", "edgemon"))
    assert stalled.score.underruns > steady.score.underruns


def test_measured_parking_parks_paused_streams_that_the_estimate_cannot_see() -> None:
    """Fed what the players measured, the policy parks streams whose listeners paused (their
    slack grows while they hold it); the same rule on the server's estimate sees every
    stream playing on, and parks fewer. Both serve the run."""
    measured = run_loop(loop_run("pause", "edgemon+feed:measured", pause="1:20:60"))
    estimated = run_loop(loop_run("pause", "edgemon+feed:estimated", pause="1:20:60"))
    assert measured.parked_steps > estimated.parked_steps
    assert measured.score.good > 0
    assert estimated.score.good > 0


def test_the_feed_parts_parse_into_what_the_engine_applies() -> None:
    """`feed:measured` parks on measured leads and takes its headroom from the feed;
    `feed:estimated` parks on the estimate and estimates the headroom; `feed:none` neither."""
    measured = policy("edgemon+feed:measured", JETSON)
    estimated = policy("edgemon+feed:estimated", JETSON)
    none = policy("edgemon+feed:none", JETSON)
    assert (measured.parking, measured.feed) == ("measured", "measured")
    assert measured.deadlines is not None
    assert not measured.deadlines.estimate_headroom
    assert (estimated.parking, estimated.feed) == ("estimated", "estimated")
    assert estimated.deadlines is not None
    assert estimated.deadlines.estimate_headroom
    assert (none.parking, none.feed) == (None, "none")
    assert policy("park:measured", JETSON).kind == "mine"
    with pytest.raises(ValueError, match="unknown policy"):
        policy("feed:guessed", JETSON)
