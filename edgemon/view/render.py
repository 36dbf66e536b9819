"""Render a `/api/v1/streams` body as rich tables, or as one plain status line.

The body is read once into small records (`_read`), which also checks its shape: `top` gets
it from the network, so a wrong answer is a `ViewError` with one clear reason, not a
`KeyError` deep in a table. Times are milliseconds, as on the wire.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from edgemon.errors import EdgemonError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rich.console import RenderableType

#: Slack that fills a whole bar; more is drawn full with an arrow.
BAR_FULL_MS = 4_000.0
BAR_WIDTH = 16
#: The terminal width a frame is drawn for: both tables fit it, no header cut.
VIEW_COLUMNS = 100
_EIGHTHS = " ▏▎▍▌▋▊▉"


class ViewError(EdgemonError, ValueError):
    """The body is not a `/api/v1/streams` answer (the reason says what is wrong)."""


@dataclass(frozen=True, slots=True)
class DeviceTotals:
    """Cumulative counts of a device that the streams body does not carry."""

    underruns: int
    throttle_engagements: int


class _Stream(NamedTuple):
    device: str
    stream: str
    phase: str
    slack_ms: float | None
    eta_ms: float | None
    headroom_ms: float | None
    margin_ms: float
    at_risk: bool
    in_underrun: bool
    chunks: int
    underruns: int


class _Device(NamedTuple):
    device: str
    throttle: bool
    throttle_for_ms: float | None
    margin_ms: float
    at_risk: int
    min_headroom_ms: float | None
    streams: list[_Stream]


# ---------------------------------------------------------------------- reading
def _optional_number(obj: Mapping[str, Any], key: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ViewError(f"{key} is not a number")
    return float(value)


def _read_stream(device: str, obj: Any) -> _Stream:
    if not isinstance(obj, dict):
        raise ViewError(f"a stream of {device} is not an object")
    return _Stream(
        device=device,
        stream=str(obj.get("stream", "?")),
        phase=str(obj.get("phase", "live")),
        slack_ms=_optional_number(obj, "slack_ms"),
        eta_ms=_optional_number(obj, "eta_ms"),
        headroom_ms=_optional_number(obj, "headroom_ms"),
        margin_ms=_optional_number(obj, "margin_ms") or 0.0,
        at_risk=obj.get("at_risk") is True,
        in_underrun=obj.get("in_underrun") is True,
        chunks=int(_optional_number(obj, "chunks") or 0),
        underruns=int(_optional_number(obj, "underruns") or 0),
    )


def _read_device(obj: Any) -> _Device:
    if not isinstance(obj, dict) or not isinstance(obj.get("device"), str):
        raise ViewError("a device entry has no `device` name")
    name: str = obj["device"]
    streams = obj.get("streams", [])
    if not isinstance(streams, list):
        raise ViewError(f"`streams` of {name} is not a list")
    throttle = obj.get("throttle") is True
    since, now = _optional_number(obj, "throttle_since_ms"), _optional_number(obj, "t_ms")
    return _Device(
        device=name,
        throttle=throttle,
        throttle_for_ms=None if not throttle or since is None or now is None else now - since,
        margin_ms=_optional_number(obj, "margin_ms") or 0.0,
        at_risk=int(_optional_number(obj, "streams_at_risk") or 0),
        min_headroom_ms=_optional_number(obj, "min_headroom_ms"),
        streams=[_read_stream(name, stream) for stream in streams],
    )


def _read(view: Mapping[str, Any]) -> list[_Device]:
    if not isinstance(view, dict) or not isinstance(view.get("devices"), list):
        raise ViewError("no `devices` list: not a /api/v1/streams answer")
    return [_read_device(device) for device in view["devices"]]


def _underruns(device: _Device, totals: Mapping[str, DeviceTotals] | None) -> int:
    """Since the daemon started if known, else over the streams tracked now."""
    known = None if totals is None else totals.get(device.device)
    return sum(s.underruns for s in device.streams) if known is None else known.underruns


# ---------------------------------------------------------------------- rich
def render_view(
    view: Mapping[str, Any],
    *,
    title: str,
    status: Text | str | None = None,
    totals: Mapping[str, DeviceTotals] | None = None,
    labels: Mapping[str, str] | None = None,
    max_streams: int = 12,
    prefills: Mapping[str, str] | None = None,
) -> RenderableType:
    """One frame: a title line, the devices table and the streams lowest in headroom.

    `totals` gives cumulative underruns and throttle engagements per device (without it the
    underruns of the streams tracked now are shown); `labels` a note per device (e.g. its RTF);
    `prefills`, when given, adds a column with each engine's prefill state: `held` (obeying a
    throttle), `admitting`, or `ignored` (an engine that does not read the throttle).
    Raises `ViewError` when `view` is not a `/api/v1/streams` body.
    """
    devices = _read(view)
    header = Text(title, style="bold")
    if status is not None:
        header.append("  ")
        header.append(status if isinstance(status, Text) else Text(status))
    parts: list[RenderableType] = [header, _devices_table(devices, totals, labels or {}, prefills)]
    streams = sorted(
        (s for d in devices for s in d.streams),
        key=lambda s: (s.headroom_ms is None, s.headroom_ms or 0.0, s.device, s.stream),
    )
    if streams:
        shown = streams[: max(1, max_streams)]
        parts.append(_streams_table(shown))
        if len(streams) > len(shown):
            parts.append(Text(f"  … {len(streams) - len(shown)} more streams", style="dim"))
    return Group(*parts)


def _table(title: str) -> Table:
    """A table without vertical rules, so that a frame fits `VIEW_COLUMNS`."""
    return Table(
        title=title,
        title_justify="left",
        expand=False,
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
        collapse_padding=True,
    )


def _devices_table(
    devices: list[_Device],
    totals: Mapping[str, DeviceTotals] | None,
    labels: Mapping[str, str],
    prefills: Mapping[str, str] | None,
) -> Table:
    table = _table("devices")
    table.add_column("device", no_wrap=True)
    table.add_column("throttle", no_wrap=True)
    table.add_column("margin", justify="right")
    table.add_column("streams", justify="right")
    table.add_column("at risk", justify="right")
    table.add_column("min headroom", justify="right")
    table.add_column("underruns", justify="right")
    table.add_column("engaged", justify="right")
    if prefills is not None:
        table.add_column("prefills", no_wrap=True)
    if not devices:
        table.add_row(Text("no device has published yet", style="dim"))
    for device in devices:
        name = Text(device.device, style="bold")
        if device.device in labels:
            name.append(f" {labels[device.device]}", style="dim")
        throttle = (
            Text(f"● ON {_seconds(device.throttle_for_ms)}", style="bold red")
            if device.throttle
            else Text("○ off", style="green")
        )
        underruns = _underruns(device, totals)
        known = None if totals is None else totals.get(device.device)
        cells: list[RenderableType] = [
            name,
            throttle,
            _ms(device.margin_ms),
            str(len(device.streams)),
            Text(str(device.at_risk), style="bold red" if device.at_risk else ""),
            _headroom(device.min_headroom_ms, device.margin_ms),
            Text(str(underruns), style="red" if underruns else ""),
            "–" if known is None else str(known.throttle_engagements),
        ]
        if prefills is not None:
            cells.append(_prefills(prefills.get(device.device)))
        table.add_row(*cells)
    return table


def _streams_table(streams: list[_Stream]) -> Table:
    table = _table("streams, lowest headroom first")
    table.add_column("device", no_wrap=True)
    table.add_column("stream", no_wrap=True, max_width=24)
    table.add_column("slack", no_wrap=True, min_width=BAR_WIDTH + 1)
    table.add_column("slack ms", justify="right")
    table.add_column("eta ms", justify="right")
    table.add_column("headroom", justify="right")
    table.add_column("chunks", justify="right")
    table.add_column("underruns", justify="right")
    table.add_column("state", no_wrap=True)
    for stream in streams:
        style = _style(stream)
        table.add_row(
            stream.device,
            stream.stream,
            _bar(stream.slack_ms, style),
            _ms(stream.slack_ms),
            _ms(stream.eta_ms),
            _headroom(stream.headroom_ms, stream.margin_ms),
            str(stream.chunks),
            Text(str(stream.underruns), style="red" if stream.underruns else ""),
            Text(_state(stream), style=style),
        )
    return table


_PREFILLS = {
    "held": ("■ held", "bold yellow"),
    "admitting": ("admitting", "green"),
    "ignored": ("not gated", "dim"),
}


def _prefills(state: str | None) -> Text:
    text, style = _PREFILLS.get(state or "", (state or "–", "dim"))
    return Text(text, style=style)


def _style(stream: _Stream) -> str:
    if stream.in_underrun or stream.at_risk:
        return "bold red"
    if stream.phase != "live":
        return "dim"
    head = stream.headroom_ms
    if head is not None and head < 2 * stream.margin_ms:
        return "yellow"
    return "green"


def _state(stream: _Stream) -> str:
    if stream.in_underrun:
        return "UNDERRUN"
    if stream.at_risk:
        return "AT RISK"
    return stream.phase


def _bar(slack_ms: float | None, style: str) -> Text:
    """A bar of `BAR_WIDTH` cells, full at `BAR_FULL_MS` of slack, in eighths of a cell."""
    if slack_ms is None:
        return Text("")
    if slack_ms <= 0:
        return Text("▕ dry", style="bold red")
    eighths = min(BAR_WIDTH * 8, math.ceil(slack_ms / BAR_FULL_MS * BAR_WIDTH * 8))
    full, rest = divmod(eighths, 8)
    bar = "█" * full + (_EIGHTHS[rest] if rest else "")
    if slack_ms > BAR_FULL_MS:
        bar += "▸"
    return Text(bar, style=style)


def _headroom(headroom_ms: float | None, margin_ms: float) -> Text:
    if headroom_ms is None:
        return Text("–", style="dim")
    style = "bold red" if headroom_ms < margin_ms else ""
    return Text(_ms(headroom_ms), style=style)


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}"


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value / 1000.0:.1f}s"


# ---------------------------------------------------------------------- plain
def status_line(
    view: Mapping[str, Any],
    *,
    totals: Mapping[str, DeviceTotals] | None = None,
    prefills: Mapping[str, str] | None = None,
) -> str:
    """One line per frame for logs and pipes: every device's throttle, streams and underruns
    (and what its engine does with prefills, when `prefills` says)."""
    parts = []
    for device in _read(view):
        throttle = "THROTTLED" if device.throttle else "ok"
        part = (
            f"{device.device} {throttle} streams={len(device.streams)} "
            f"at_risk={device.at_risk} underruns={_underruns(device, totals)}"
        )
        state = None if prefills is None else prefills.get(device.device)
        if state is not None:
            part += f" prefills={state}"
        parts.append(part)
    return " | ".join(parts) if parts else "no device has published yet"
