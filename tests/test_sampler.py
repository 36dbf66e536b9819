"""The device's sampler on its own: on the period's grid, only while streams are live."""

from __future__ import annotations

from edgemon.engine.outputs import Output, StreamSample
from edgemon.engine.sampling import Sampler
from edgemon.engine.stream import Stream


def _stream(stream_id: str) -> Stream:
    return Stream(
        stream_id, t_ms=0.0, rebuffer=False, margin=80.0, margin_from_start=None,
        started_by_event=False, play_start_ms=None,
    )  # fmt: skip


def test_off_without_a_period() -> None:
    """No period: nothing is ever armed."""
    assert Sampler(None).start(123.0) is None


def test_starts_on_the_grid_once_and_samples_each_live_stream() -> None:
    """A period of 100 ms: a stream live at 250 arms 300 (the grid), and a second start
    arms nothing more; at 300 each live stream gives one sample stamped 300 and 400 is
    armed next; with no live stream left nothing is armed, and a later start arms again."""
    sampler = Sampler(100.0)
    assert sampler.start(250.0) == 300.0
    assert sampler.start(260.0) is None
    streams = [_stream("a"), _stream("b")]
    out: list[Output] = []
    assert sampler.sample("dev", streams, 300.0, out) == 400.0
    assert [(s.device, s.stream, s.t_ms) for s in out if isinstance(s, StreamSample)] == [
        ("dev", "a", 300.0),
        ("dev", "b", 300.0),
    ]
    assert sampler.sample("dev", [], 400.0, []) is None
    assert sampler.start(450.0) == 500.0
