"""Parking as vLLM's schedulers run it (`edgemon.integrations._parking`): each running
request's lead on the feed it is given, the server's estimate from the chunks sent, or the
players' measured state joined by `X-Request-Id`; and the rule's answers on them."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sessions import Clock

from edgemon.client.feed import SlackFeedReader
from edgemon.environ import EnvironError, read_engine_environ
from edgemon.integrations._deadlines import VllmDeadlines
from edgemon.integrations._parking import ServedParking, parking_from_environ
from edgemon.policy.deadlines import Deadlines
from edgemon.policy.values import DeadlineSettings, Running
from edgemon.simulate.estimated import Stream
from edgemon.simulate.parked import FedParking

FRAME_MS = 80.0
STEP_MS = 70.0
MARGIN_MS = 122.0


@dataclass(slots=True)
class Req:
    """What the deadline policy's views read of a vLLM request."""

    request_id: str
    num_output_tokens: int
    num_prompt_tokens: int = 20
    num_computed_tokens: int = 20
    max_tokens: int = 4096


class Views:
    """The running requests as the scheduler shows them to parking: the deadline policy's
    views (`VllmDeadlines.running`), which note when each first chunk was out."""

    def __init__(self) -> None:
        settings = DeadlineSettings(first_chunk_frames=5, second_chunk_frames=25, frame_ms=80.0)
        self.deadlines = VllmDeadlines(Deadlines(settings, None), "off")

    def __call__(self, requests: list[Req], now_ms: float) -> list[Running]:
        return self.deadlines.running(requests, now_ms)


def _estimated() -> ServedParking:
    return ServedParking("estimated", frame_ms=FRAME_MS, chunks=(5, 25), margin_ms=MARGIN_MS)


def test_the_estimate_counts_whole_chunks_sent_since_the_first() -> None:
    """The peers' formula on the chunks a 5-then-25-frame chunker has sent: 30 tokens are two
    chunks (2.4 s of audio), counted from when the first chunk was first seen; a request that
    has not sent a chunk has no lead. What it needs: the margin and its next chunk's frames
    at the step."""
    parking, views = _estimated(), Views()
    early, late = Req("cmpl-a-0-abcdefgh", 3), Req("cmpl-b-0-abcdefgh", 5)
    first = parking.leads(10_000.0, views([early, late], 10_000.0), STEP_MS)
    assert first[0].lead_ms is None
    assert first[0].need_ms == pytest.approx(MARGIN_MS + 2 * STEP_MS)
    assert first[1].lead_ms == pytest.approx(5 * FRAME_MS)
    late.num_output_tokens = 34
    (lead,) = parking.leads(11_000.0, views([late], 11_000.0), STEP_MS)
    assert lead.lead_ms == pytest.approx(30 * FRAME_MS - 1_000.0)
    assert lead.need_ms == pytest.approx(MARGIN_MS + 21 * STEP_MS)


def test_measured_leads_come_from_the_feed_by_the_request_id() -> None:
    """`cmpl-{stream}-0-{suffix}` reads the stream's entry, aged on the reader's own clock
    whatever the scheduler's clock says; a
    player that has not started is not playing; a request with no entry has no lead."""
    clock = Clock(1000.0)
    reader = SlackFeedReader("mqtt://127.0.0.1:1", "dev1", clock=clock)
    streams = [
        {"stream": "s1", "slack_ms": 5_000.0, "playing": True, "play_start_ms": 0.0},
        {"stream": "s2", "slack_ms": 900.0, "playing": False, "play_start_ms": None},
    ]
    assert reader.take(json.dumps({"device": "dev1", "t_ms": 100.0, "streams": streams}).encode())
    parking = ServedParking(
        "measured", reader=reader, frame_ms=FRAME_MS, chunks=(5, 25), margin_ms=MARGIN_MS
    )
    clock.now += 0.5
    now_ms = 1.7e12  # the scheduler's clock (vLLM's: the wall clock), not the reader's
    requests = [Req("cmpl-s1-0-abcdefgh", 30), Req("cmpl-s2-0-abcdefgh", 5), Req("x", 30)]
    s1, s2, other = parking.leads(now_ms, Views()(requests, now_ms), STEP_MS)
    assert s1.lead_ms == pytest.approx(4_500.0)
    assert s1.playing
    assert s2.lead_ms == pytest.approx(900.0)
    assert not s2.playing
    assert other.lead_ms is None


def test_a_stream_parks_for_a_waiting_request_and_rejoins_when_it_needs_to() -> None:
    """With a request waiting and no row free, the stream with the most lead beyond its need
    sits out (one per waiting request); nobody parks with a row free; a parked stream
    rejoins once its lead falls to its need, whatever waits. Parks and parked steps are
    counted."""
    parking, views = _estimated(), Views()
    rich, poor = Req("cmpl-rich-0-abcdefgh", 5 + 25 * 3), Req("cmpl-poor-0-abcdefgh", 5)
    running = [rich, poor]
    views(running, 0.0)  # both first seen with their first chunk sent

    def held(now_ms: float, *, waiting: int, free_rows: int) -> frozenset[str]:
        shown = views(running, now_ms)
        return parking.step(now_ms, shown, waiting=waiting, free_rows=free_rows, step_ms=STEP_MS)[0]

    assert held(1.0, waiting=1, free_rows=1) == frozenset()
    parked = held(2.0, waiting=1, free_rows=0)
    assert parked == {rich.request_id}
    # 80 frames sent: 6.4 s of audio. It needs 122 ms + 25 frames of 70 ms = 1.87 s.
    assert held(4_000.0, waiting=1, free_rows=0) == parked
    assert held(4_600.0, waiting=5, free_rows=0) == frozenset()
    assert (parking.parks, parking.parked_steps) == (1, 2)


def test_parking_is_off_unless_the_environment_asks() -> None:
    """`EDGEMON_PARKING` unset: no parking; `estimated`: the deadline policy's chunks and
    frame, the batch's rows vLLM's seats unless `EDGEMON_PARKING_ROWS` says fewer; `measured`
    without `EDGEMON_GATE_DEVICE` is refused by name."""
    settings = DeadlineSettings(first_chunk_frames=5, second_chunk_frames=25, frame_ms=FRAME_MS)
    assert parking_from_environ(read_engine_environ({}), settings) is None
    environ = read_engine_environ({"EDGEMON_PARKING": "estimated"})
    parking = parking_from_environ(environ, settings)
    assert parking is not None
    assert (parking.feed, parking.chunks, parking.margin_ms) == ("estimated", (5, 25), 200.0)
    assert parking.rows is None
    rows = read_engine_environ({"EDGEMON_PARKING": "estimated", "EDGEMON_PARKING_ROWS": "16"})
    fewer = parking_from_environ(rows, settings)
    assert fewer is not None
    assert fewer.rows == 16
    with pytest.raises(EnvironError, match="EDGEMON_PARKING: measured"):
        read_engine_environ({"EDGEMON_PARKING": "measured"})
    with pytest.raises(EnvironError, match="EDGEMON_PARKING: 'sometimes' is not one of"):
        read_engine_environ({"EDGEMON_PARKING": "sometimes"})


@st.composite
def traces(draw: st.DrawFn) -> list[tuple[float, list[int], int, int]]:
    """Steps of a few streams: (time, tokens each has emitted, requests waiting, free rows);
    tokens never go back, a stream may start late."""
    count = draw(st.integers(1, 4))
    emitted = [0] * count
    steps = []
    t = 0.0
    for _ in range(draw(st.integers(1, 40))):
        t += draw(st.floats(10.0, 400.0))
        emitted = [e + draw(st.integers(0, 12)) for e in emitted]
        steps.append((t, list(emitted), draw(st.integers(0, 3)), draw(st.integers(-1, 2))))
    return steps


@given(traces())
def test_served_and_virtual_parking_take_the_same_decisions_on_a_trace(
    trace: list[tuple[float, list[int], int, int]],
) -> None:
    """The same estimated parking in vLLM's scheduler and in the simulated engine: on any
    trace of emitted tokens, waiting requests and free rows, each step parks the same
    streams (the virtual engine's view of a stream: the audio in its chunks sent, when its
    first chunk was sent, the frames its next chunk needs)."""
    served = ServedParking("estimated", frame_ms=FRAME_MS, chunks=(5, 25), margin_ms=MARGIN_MS)
    virtual = FedParking(
        "estimated",
        measured=lambda _stream: None,
        step_ms=lambda: STEP_MS,
        margin_ms=MARGIN_MS - 22.0,
        delivery_ms=22.0,
    )
    first_sent: dict[str, float] = {}
    views = Views()
    for now, emitted, waiting, free in trace:
        requests = [Req(f"cmpl-s{i}-0-abcdefgh", e) for i, e in enumerate(emitted)]
        streams = []
        for request in requests:
            e = request.num_output_tokens  # a chunk of 5 frames, then of 25
            sent = 0 if e < 5 else 5 + 25 * ((e - 5) // 25)
            next_frames = 5 - e if e < 5 else 25 - (e - 5) % 25
            if sent:
                first_sent.setdefault(request.request_id, now)
            streams.append(
                Stream(
                    request.request_id,
                    0.0,
                    first_sent.get(request.request_id),
                    sent * FRAME_MS,
                    next_frames,
                )
            )
        shown = views(requests, now)
        mine, _ = served.step(now, shown, waiting=waiting, free_rows=free, step_ms=STEP_MS)
        assert mine == virtual.held(now, streams, free, waiting=waiting)
