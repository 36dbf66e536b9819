"""A device's safety margins (docs/semantics.md): which margin each of its streams is judged by.

The order: the device's `[devices.<id>]` section, then the stream's `start` event, then the
engine object (explicit, else by hardware class), then `[slack] default_margin_ms`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgemon.engine.config import DeviceOverride, EngineConfig
    from edgemon.engine.tts import TtsEngineInfo


class Margins:
    """What a device's margins come from: a part a `Device` holds, owning the operator's
    override of the device and the base margin (the engine object's, else the default)."""

    __slots__ = ("base", "override")

    def __init__(self, device_id: str, config: EngineConfig) -> None:
        #: The device's `[devices.<id>]` section, if any (it also names a player model).
        self.override: DeviceOverride | None = None
        #: The margin of streams whose `start` asked for none, unless the override sets one.
        self.base = config.slack.default_margin_ms
        self.configure(device_id, config, None)

    def configure(self, device_id: str, config: EngineConfig, info: TtsEngineInfo | None) -> None:
        """Take the configuration in force and the device's engine object (None: none yet)."""
        self.override = config.devices.get(device_id)
        margin = None if info is None else info.margin
        self.base = config.slack.default_margin_ms if margin is None else margin

    def for_stream(self, from_start: float | None) -> float:
        """The margin of a stream whose `start` event asked for `from_start` (None: none)."""
        override = self.override
        if override is not None and override.margin_ms is not None:
            return override.margin_ms
        return self.base if from_start is None else from_start
