"""The fast text path of `/metrics` (`edgemon.adapters.metrics_text`) against prometheus_client."""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.exposition import choose_encoder
from prometheus_client.utils import floatToGoString

from edgemon.adapters import metrics
from edgemon.adapters.exposition import Slicer, render
from edgemon.adapters.metrics import ConnectionState, build_registry
from edgemon.adapters.metrics_text import go_float, go_floats
from edgemon.engine import EngineConfig
from edgemon.engine.views import DeviceView, LiveSummary
from edgemon.monitor import Monitor
from edgemon.simulate import Simulation

from fleets import SimulatedFleet

if TYPE_CHECKING:
    from collections.abc import Callable

    from edgemon.adapters.metrics import EdgemonRegistry
    from edgemon.engine.engine import Engine
    from edgemon.engine.outputs import Output
    from edgemon.engine.stats import DeviceStats

#: Process and platform series move on between two renderings.
_MOVING = re.compile(r"^(process_|python_).*\n", re.MULTILINE)
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


@given(
    st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(min_value=-(2**53), max_value=2**53),
        st.sampled_from([0.0, -0.0, 1e6, 999_999.999, 1e-7, 123_456_789.0, 1.7e12]),
    )
)
def test_go_float_is_prometheus_clients_formatting(value: float) -> None:
    """Every float and integer is written as prometheus_client writes it."""
    assert go_float(value) == floatToGoString(value)  # type: ignore[no-untyped-call]


_FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-1e6, max_value=1e6),
    st.floats(min_value=-1e-3, max_value=1e-3),
    st.sampled_from([0.0, -0.0, 1e-4, -1e-4, 9.99e-5, 1e6, 999_999.999, -1e6, 1e16, 1.7e12]),
)


@given(st.lists(_FLOATS, max_size=30), st.lists(st.floats(-1e5, 1e5), max_size=30))
def test_go_floats_writes_each_float_as_go_float_does(
    mixed: list[float], plain: list[float]
) -> None:
    """Floats formatted together (msgspec) are written exactly as one by one, whatever they
    hold (NaN, infinities, tiny and huge magnitudes, signed zeros), whether the fast path or
    the fallback writes them."""
    for values in (mixed, plain, mixed + plain):
        assert go_floats(values) == [go_float(v) for v in values]


@pytest.mark.asyncio
@pytest.mark.parametrize("accept", ["", OPENMETRICS])
async def test_text_path_is_the_registry_text_as_the_fleet_changes(accept: str) -> None:
    """A simulated fleet (a healthy device, an overloaded one with underruns and throttles,
    one that stalls; engine objects; finished streams; per-stream series) rendered by the
    sliced text path is byte for byte what prometheus_client renders from the same registry,
    at every scrape of a run: the text cached between scrapes (label prefixes, histograms)
    follows every change."""
    start = 1_764_000_000_000.0  # a real wall clock: timestamps take the long formatting path
    fleet = SimulatedFleet(
        Simulation(
            devices=3, streams=4, rtf=[0.1, 1.3, 0.7], stall_rate=0.2, seed=7, start_ms=start
        ),
        start,
        per_stream_series=3,
    )
    registry = fleet.registry
    encoder, _ = choose_encoder(accept)
    scrapes = 0
    next_scrape = start + 500.0
    for now_ms in fleet.feed(start + 30_000.0):
        if now_ms >= next_scrape:
            next_scrape += 1_500.0
            body, _ = await render(registry, accept, Slicer(math.inf))
            assert _MOVING.sub("", body.decode()) == _MOVING.sub("", encoder(registry).decode())
            scrapes += 1
    text = body.decode()
    assert scrapes >= 15
    for name in ("underruns_total", "throttle_engagements_total", "kv_admission_ok"):
        assert re.search(rf"^edgemon_{name}{{.*}} [1-9]", text, re.MULTILINE), name
    assert 'reason="completed"} ' in text
    assert "edgemon_stream_headroom_seconds{" in text


def _one_device() -> tuple[Monitor, EdgemonRegistry, DeviceStats]:
    """A monitor with device d1 (two streams, one finished) and its registry."""
    monitor = Monitor(EngineConfig())
    now = 1_764_000_000_000.0
    registry = build_registry(
        monitor,
        wall_clock=lambda: now,
        connection=ConnectionState(),
        per_stream_series=3,
        version="0",
    )
    chunks = [
        {"type": "chunk", "stream": "s1", "t_ms": now, "seq": 0, "audio_ms": 800.0},
        {"type": "chunk", "stream": "s2", "t_ms": now, "seq": 0, "audio_ms": 500.0},
        {"type": "chunk", "stream": "f", "t_ms": now, "seq": 0, "audio_ms": 90.0, "final": True},
    ]
    out: list[Output] = []
    monitor.handle("edgemon/v1/d1/events", json.dumps(chunks).encode(), now, out)
    device = monitor.engine.device("d1")
    assert device is not None
    return monitor, registry, device.stats


async def _text_path_is_the_registry_text(registry: EdgemonRegistry) -> str:
    body, _ = await render(registry, "", Slicer(math.inf))
    text = _MOVING.sub("", body.decode())
    assert text == _MOVING.sub("", choose_encoder("")[0](registry).decode())
    return text


def _engine_object(monitor: Monitor) -> None:
    geometry = {"num_layers": 4, "num_kv_heads": 2, "head_dim": 64}
    engine = {
        "kv_cache_bytes": 2**30,
        "max_num_seqs": 8,
        "max_model_len": 4096,
        "geometry": geometry,
    }
    payload = json.dumps(engine)
    monitor.handle("edgemon/v1/d1/engine", payload.encode(), 1_764_000_000_000.0, [])


def _capacity_object(monitor: Monitor, **fields: float) -> None:
    """A capacity object for d1 (the first one: every gauge; later ones: what they give)."""
    payload = json.dumps({"realtime_streams": 12, "running": 9, "start_wait_ms": 250, **fields})
    monitor.handle("edgemon/v1/d1/capacity", payload.encode(), 1_764_000_000_000.0, [])


def _moved_finished(stats: DeviceStats) -> None:
    """One finished stream's reason changes: every reason's count matters, not their sum."""
    stats.finished["completed"] -= 1
    stats.finished["cancelled"] += 1


def _moved_outcome(stats: DeviceStats) -> None:
    """One ended stream's outcome changes: every outcome's count matters, not their sum."""
    stats.slo["good"] -= 1
    stats.slo["gappy"] += 1


#: Each count the text path keeps lines of, changed alone between two scrapes.
COUNT_CHANGES: dict[str, Callable[[Monitor, DeviceStats], object]] = {
    "engagements": lambda _m, s: setattr(s, "throttle_engagements", s.throttle_engagements + 1),
    "underruns": lambda _m, s: setattr(s, "underruns", s.underruns + 1),
    "retracted": lambda _m, s: setattr(s, "underruns_retracted", s.underruns_retracted + 1),
    "chunks": lambda _m, s: setattr(s, "chunks", s.chunks + 1),
    "started": lambda _m, s: setattr(s, "streams_started", s.streams_started + 1),
    "finished": lambda _m, s: _moved_finished(s),
    "stream count": lambda m, _s: m.handle(
        "edgemon/v1/d1/events",
        b'{"type":"start","stream":"w","t_ms":1764000000000.0}',
        1_764_000_000_000.0,
        [],
    ),
    "kv verdict": lambda m, _s: _engine_object(m),
    "capacity object": lambda m, _s: _capacity_object(m, running=3, shed_total=2),
    "histogram": lambda _m, s: s.chunk_gap.observe(42.0),
    "slo outcome": lambda _m, s: _moved_outcome(s),
    "longest gap": lambda _m, s: s.longest_gap.observe(120.0),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("change", COUNT_CHANGES, ids=list(COUNT_CHANGES))
async def test_cached_count_lines_follow_each_count_alone(change: str) -> None:
    """The lines kept between scrapes (the device's counts, its KV verdict, its histograms,
    its engine's capacity) are written again when any one of them changes, and only the
    scrape after it shows the new value: the text path stays byte for byte the registry's
    text."""
    monitor, registry, stats = _one_device()
    before = await _text_path_is_the_registry_text(registry)
    COUNT_CHANGES[change](monitor, stats)
    after = await _text_path_is_the_registry_text(registry)
    assert after != before


@pytest.mark.asyncio
async def test_capacity_lines_follow_every_object() -> None:
    """A device's capacity lines, written with its other floats, are the registry's text after
    every object: the first, one that leaves fields out (their gauges go), one after an engine
    restart (the refusals counter adds across it) and one that brings every field back (its
    predicted wait of 1e9 ms kept as the 10 minutes a wait is read as at most)."""
    monitor, registry, _ = _one_device()
    texts = []
    for fields in (
        {"shed_total": 7},
        {"running": 12, "shed_total": 9},
        {"running": 4, "start_wait_ms": 0, "shed_total": 1},
        {"realtime_streams": 2.5, "running": 1, "waiting": 0, "start_wait_ms": 1e9},
    ):
        payload = json.dumps(fields).encode()
        monitor.handle("edgemon/v1/d1/capacity", payload, 1_764_000_000_000.0, [])
        texts.append(await _text_path_is_the_registry_text(registry))
    shed = [re.findall(r"^edgemon_engine_shed_total\{.*\} (.*)$", t, re.MULTILINE) for t in texts]
    assert shed == [["7.0"], ["9.0"], ["10.0"], ["10.0"]]
    assert "edgemon_engine_waiting{" not in texts[1]
    assert 'edgemon_engine_start_wait_seconds{device="d1"} 600.0' in texts[3]  # clamped


class _Scripted(DeviceView):
    """A device view whose lowest stream's slack and headroom (ms), and the device's lowest
    of both, the test sets: a value going to -0.0 or NaN, which the engine does not produce
    on demand."""

    __slots__ = ()
    slack_head: ClassVar[tuple[float, float]] = (0.0, 0.0)

    def summary(self, now: float, lowest: int = 0) -> LiveSummary:
        base = super().summary(now, lowest)
        slack, head = self.slack_head
        return LiveSummary(base.at_risk, head, slack, (("s1", slack, head),))


@pytest.mark.asyncio
async def test_a_line_is_reused_only_for_the_same_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A line is kept while its value stays; a new value, a zero changing sign (0.0 == -0.0,
    written apart) and NaN (never equal to itself) are written afresh: per-stream series and
    the device's own (its lowest slack and headroom)."""
    _, registry, _ = _one_device()

    def scripted(engine: Engine, device_id: str) -> DeviceView | None:
        device = engine.device(device_id)
        return None if device is None else _Scripted(device)

    monkeypatch.setattr(metrics, "device_view", scripted)
    steps = [(1500.0, -2000.0), (1500.0, -2000.0), (0.0, -0.0), (-0.0, 0.0), (-0.0, 0.0),
             (math.nan, math.inf), (math.nan, 2e9), (7.0, 2e9)]  # fmt: skip
    for slack, head in steps:
        _Scripted.slack_head = (slack, head)
        body, _ = await render(registry, "", Slicer(math.inf))
        names = (
            "edgemon_stream_playback",
            "edgemon_stream_headroom",
            "edgemon_playback_slack_min",
            "edgemon_headroom_min",
        )
        lines = [line for line in body.decode().splitlines() if line.startswith(names)]
        stream, device = '{device="d1",stream="s1"}', '{device="d1"}'
        assert lines == [
            f"edgemon_playback_slack_min_seconds{device} {go_float(slack / 1000)}",
            f"edgemon_headroom_min_seconds{device} {go_float(head / 1000)}",
            f"edgemon_stream_playback_slack_seconds{stream} {go_float(slack / 1000)}",
            f"edgemon_stream_headroom_seconds{stream} {go_float(head / 1000)}",
        ]
