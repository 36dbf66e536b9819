"""The fast text path of `/metrics` (`edgemon.adapters.metrics_text`) against prometheus_client."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.exposition import choose_encoder
from prometheus_client.utils import floatToGoString

from edgemon.adapters.exposition import Slicer, render
from edgemon.adapters.metrics_text import go_float
from edgemon.simulate import Simulation

from fleets import SimulatedFleet

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
