"""edgemon: playback-slack monitor and prefill throttle for streaming TTS on edge boxes."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("edgemon")
except PackageNotFoundError:  # pragma: no cover - only when run from a bare source tree
    __version__ = "0+unknown"

__all__ = ["__version__"]
