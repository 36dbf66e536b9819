"""The real-time box: engine steps in wall time, players reporting what a Reporter needs."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from edgemon.simulate.engine import TtsEngine
from edgemon.simulate.players import Delivery
from edgemon.simulate.profiles import JETSON, StepModel, Workload
from edgemon.simulate.realtime import Box
from edgemon.simulate.workload import Arrivals

#: Fast steps and short requests, so a second of wall time holds whole streams.
FAST = dataclasses.replace(
    JETSON,
    step=StepModel(base_ms=4.0, per_prefill_token_ms=0.01, per_decode_seq_ms=0.5),
    chunk_schedule=(2, 5),
    network_ms=1.0,
    network_jitter_ms=0.5,
    workload=Workload(
        text_median_tokens=3, text_sigma=0.1, frames_sigma=0.05, template_tokens=40, clone_share=0
    ),
)


class RecordingReporter:
    """A hand-written stand-in for `Reporter` that records each call in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def start(self, stream: str, **kwargs: Any) -> None:
        self.calls.append(("start", stream, kwargs))

    def chunk(self, stream: str, **kwargs: Any) -> None:
        self.calls.append(("chunk", stream, kwargs))

    def end(self, stream: str, reason: str = "completed") -> None:
        self.calls.append(("end", stream, {"reason": reason}))


def box(reporter: RecordingReporter, gate: Any = None) -> Box:
    return Box(
        device="b",
        engine=TtsEngine(FAST, gate=gate),
        arrivals=Arrivals(20.0, FAST.workload, seed=4),
        delivery=Delivery(FAST.network_ms, FAST.network_jitter_ms, 4),
        reporter=reporter,
        margin_ms=80.0,
    )


def test_each_stream_is_started_at_its_request_and_reported_in_order() -> None:
    """Per stream: one `start` (with the margin) when the request is made; the first chunk
    says when the player starts (`play_start_ms`), later ones do not; chunks carry the
    engine's eta except the final one; streams unfinished at the end (served or not) are
    ended as cancelled; the players' score counts every request."""
    reporter = RecordingReporter()
    simulated = box(reporter)
    score = asyncio.run(simulated.run(1.0))
    assert score.requests == simulated.status.requests > 5
    assert score.completed > 0
    by_stream: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for kind, stream, kwargs in reporter.calls:
        by_stream.setdefault(stream, []).append((kind, kwargs))
    assert set(by_stream) == set(simulated.players)
    for stream, calls in by_stream.items():
        player = simulated.players[stream]
        kinds = [kind for kind, _ in calls]
        assert calls[0] == ("start", {"margin_ms": 80.0})
        chunks = [kwargs for kind, kwargs in calls if kind == "chunk"]
        assert len(chunks) == player.chunks
        if chunks:
            assert chunks[0]["play_start_ms"] == player.start_ms
            assert all(c["play_start_ms"] is None for c in chunks[1:])
        assert sum(c["audio_ms"] for c in chunks) == player.audio_ms
        assert all(c["eta_ms"] is not None for c in chunks if not c["final"])
        if player.final:
            assert kinds.count("end") == 0
            assert chunks[-1]["eta_ms"] is None
            assert chunks[-1]["final"] is True
        else:
            assert kinds[-1] == "end"
            assert calls[-1][1] == {"reason": "cancelled"}


def test_a_gate_that_always_throttles_holds_every_request() -> None:
    """Gate True: nothing is ever admitted, the box says it is holding, nobody hears audio."""
    reporter = RecordingReporter()
    simulated = box(reporter, gate=lambda: True)
    score = asyncio.run(simulated.run(0.3))
    assert score.requests > 0
    assert score.streams == 0
    starts = [stream for kind, stream, _ in reporter.calls if kind == "start"]
    ends = [(stream, kwargs) for kind, stream, kwargs in reporter.calls if kind == "end"]
    assert len(starts) == score.requests  # each request said start when it was made
    assert ends == [(stream, {"reason": "cancelled"}) for stream in starts]
    assert simulated.status.held
    assert simulated.status.waiting == score.requests


def test_boxes_with_one_origin_count_the_same_requests() -> None:
    """Two boxes on one seed and one origin, one holding everything: both count every
    request due by the end, whatever each was doing when the time ran out."""

    async def both() -> tuple[int, int]:
        served, held = box(RecordingReporter()), box(RecordingReporter(), gate=lambda: True)
        origin = served.clock()
        one, two = await asyncio.gather(
            served.run(0.5, origin_ms=origin), held.run(0.5, origin_ms=origin)
        )
        return one.requests, two.requests

    served, held = asyncio.run(both())
    assert served == held > 3
