"""The device's margins on their own: which margin a stream is judged by, in the order of
docs/semantics.md (device config, start event, engine object, default)."""

from __future__ import annotations

from edgemon.engine.config import DeviceOverride, EngineConfig, SlackPolicy
from edgemon.engine.margins import Margins
from edgemon.engine.tts import TtsEngineInfo


def test_the_operators_margin_beats_the_start_event_and_the_engine_object() -> None:
    """A `[devices.<id>]` margin is every stream's, whatever its start or engine object asks."""
    config = EngineConfig(devices={"pinned": DeviceOverride(margin_ms=300.0)})
    margins = Margins("pinned", config)
    assert (margins.for_stream(None), margins.for_stream(40.0)) == (300.0, 300.0)
    margins.configure("pinned", config, TtsEngineInfo(margin_ms=10.0))
    assert (margins.for_stream(None), margins.for_stream(40.0)) == (300.0, 300.0)
    assert Margins("other", config).for_stream(None) == 80.0


def test_a_start_event_beats_the_engine_object_which_beats_the_default() -> None:
    """Without an operator's margin: the start event's, else the engine object's (explicit,
    else by hardware class), else the configured default; a reload takes the new default
    and keeps the engine object's word."""
    config = EngineConfig(slack=SlackPolicy(default_margin_ms=80.0))
    margins = Margins("d", config)
    assert (margins.for_stream(None), margins.for_stream(40.0)) == (80.0, 40.0)
    margins.configure("d", config, TtsEngineInfo(hardware_class="npu"))
    assert (margins.for_stream(None), margins.for_stream(40.0)) == (200.0, 40.0)
    info = TtsEngineInfo(margin_ms=120.0, hardware_class="npu")
    margins.configure("d", config, info)
    assert margins.for_stream(None) == 120.0
    reloaded = EngineConfig(
        slack=SlackPolicy(default_margin_ms=60.0), devices={"d": DeviceOverride(player="rebuffer")}
    )
    margins.configure("d", reloaded, info)
    assert margins.for_stream(None) == 120.0
    margins.configure("d", reloaded, None)
    assert (margins.for_stream(None), margins.for_stream(40.0)) == (60.0, 40.0)
    assert margins.override == DeviceOverride(player="rebuffer")
