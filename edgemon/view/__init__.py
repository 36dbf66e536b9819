"""The terminal view shared by `edgemon demo` and `edgemon top`.

It renders the `/api/v1/streams` body (`edgemon.adapters.http.streams_view`) with `rich`:
devices with their throttle state, and the streams lowest in headroom with slack bars. It
reads only that JSON-shaped dict, so the in-process demo and a remote `top` show the same.
"""

from __future__ import annotations

from edgemon.view.render import DeviceTotals, ViewError, render_view, status_line

__all__ = ["DeviceTotals", "ViewError", "render_view", "status_line"]
