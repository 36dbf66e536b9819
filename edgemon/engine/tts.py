"""What a device's TTS engine told us about itself (its docs/protocol.md engine object)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgemon.engine.config import HARDWARE_MARGIN_MS

if TYPE_CHECKING:
    from edgemon.engine.kv import KVVerdict


@dataclass(frozen=True, slots=True)
class TtsEngineInfo:
    """The parts of an engine object edgemon uses: its margin and its KV admission verdict."""

    margin_ms: float | None = None
    hardware_class: str | None = None
    kv: KVVerdict | None = None
    kv_error: str | None = None

    @property
    def margin(self) -> float | None:
        """The margin this engine asks for: explicit, else by hardware class, else none."""
        if self.margin_ms is not None:
            return self.margin_ms
        if self.hardware_class is not None:
            return HARDWARE_MARGIN_MS.get(self.hardware_class)
        return None
