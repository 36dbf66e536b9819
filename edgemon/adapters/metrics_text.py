"""The engine's samples written straight to exposition text: the fast path of `/metrics`.

prometheus_client's families turn each sample into a `Sample` object that an encoder later
turns into a line. At 10,000 streams on 100 devices that is thousands of objects and as many
encoder calls per scrape. `DeviceText` writes one device's lines at once instead, and reuses
what did not change since the last scrape:
- each series' label prefix (`name{device="…",stream="…"} `) is computed once;
- the lines of the device's counts (streams tracked, engagements, underruns, retractions,
  chunks, streams begun and finished, ended streams by outcome, the KV verdict) are
  rewritten only when one of those integers (or the verdict) changed;
- the engine's capacity (its last capacity object, rare) is written with the floats below;
- every other series of the device (those that move with the clock: slack, headroom,
  at-risk, time throttled or in underrun; and the other floats) keeps its last line with
  the value it was written from, and is written again only for another value (formatting
  a float the way prometheus_client does, Python's shortest `repr`, is most of the cost of
  a line);
- the per-stream series, whose slack moves at every scrape, are written afresh, each
  device's values formatted together (`go_floats`: one msgspec call, which writes the same
  digits as `repr` at a twentieth of its cost);
- a histogram's lines are rewritten only when it has new observations.

Lines are the same in both formats (the engine's families carry no timestamps, exemplars or
units; the formats differ only in their headers), and the same as prometheus_client's text:
`tests/test_metrics_text.py` and `tests/test_http.py` compare the two renderings of a
changing fleet byte for byte.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import msgspec
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from edgemon.engine.service_level import OUTCOMES

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from prometheus_client.samples import Sample

    from edgemon.engine.capacity import CapacityRecord
    from edgemon.engine.histogram import Histogram
    from edgemon.engine.kv import KVVerdict
    from edgemon.engine.views import DeviceView

__all__ = [
    "DeviceText",
    "add_histogram",
    "capacity_values",
    "go_float",
    "go_floats",
    "sample_line",
]

_INF: Final = float("inf")
_MS: Final = 1000.0
#: Below this, prometheus_client writes a float as Python's `repr` does.
_REPR_BELOW: Final = 1e6
#: Streams' series kept per device before its cache starts afresh (streams come and go).
STREAM_SERIES_LIMIT: Final = 4096
#: The device's histograms, in the order their text is cached.
_HISTOGRAMS: Final = (
    "slack_at_arrival",
    "chunk_gap",
    "time_to_first_audio",
    "start_silence",
    "longest_gap",
)
#: `DeviceView.kv`'s families, by the `KVVerdict` field they export.
_KV: Final = ("kv_bytes_per_token", "kv_max_seqs", "kv_max_num_seqs", "kv_admission_ok")


def go_float(value: float) -> str:
    """`value` as prometheus_client writes it (Go's `%g`-like formatting).

    Below 1e6 that is Python's `repr` of the float; larger values, infinities and NaN take
    prometheus_client's own path.
    """
    if -_INF < value < _REPR_BELOW:  # False for NaN
        return repr(float(value))
    return str(floatToGoString(value))  # type: ignore[no-untyped-call]


_ENCODE: Final = msgspec.json.Encoder().encode


def go_floats(values: Sequence[float]) -> list[str]:
    """`[go_float(v) for v in values]` for floats, in one pass: msgspec writes the shortest
    text that reads back as the same float, as `repr` does. Where the two could differ
    (an exponent, or `null` for NaN and the infinities; a magnitude below 1e-4, where
    `repr` turns to an exponent and msgspec does not yet; a value of 1e6 or more, which
    prometheus_client writes its own way; an item without a decimal point, not a float)
    every value is written by `go_float` instead. `tests/test_metrics_text.py` holds the two
    to the same text."""
    if not values:
        return []
    text = _ENCODE(values)[1:-1]
    if (
        b"e" in text
        or b"n" in text
        or b"0.0000" in text
        or max(values) >= _REPR_BELOW
        or text.count(b".") != len(values)
    ):
        return [go_float(value) for value in values]
    return text.decode().split(",")


def _line(prefix: str, value: float) -> str:
    """`prefix` (the series) and the value, as a line."""
    if -_INF < value < _REPR_BELOW:  # go_float's common case, inline: the hot line of a scrape
        return f"{prefix}{float(value)!r}\n"
    return f"{prefix}{go_float(value)}\n"


def escape(value: str) -> str:
    """A label value escaped for the text formats."""
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def sample_line(sample: Sample) -> str:
    """One sample as a line (no timestamp, no exemplar: the engine sets neither)."""
    value = go_float(sample.value)
    if not sample.labels:
        return f"{sample.name} {value}\n"
    labels = ",".join(f'{k}="{escape(v)}"' for k, v in sorted(sample.labels.items()))
    return f"{sample.name}{{{labels}}} {value}\n"


def add_histogram(family: HistogramMetricFamily, device: str, histogram: Histogram) -> None:
    """Add one device's engine histogram to a prometheus_client family."""
    buckets = [
        ("+Inf" if le == _INF else repr(le / _MS), float(n)) for le, n in histogram.cumulative()
    ]
    family.add_metric([device], buckets, histogram.total / _MS)


def capacity_values(record: CapacityRecord) -> list[tuple[str, float]]:
    """The capacity families' samples (family attribute, value in base units): a gauge for each
    field the last capacity object gave (none once it was voided), and the refusals counted
    across engine restarts."""
    last = record.last
    values: list[tuple[str, float]] = [] if last is None else [
        (slot, value)
        for slot, value in (
            ("engine_realtime_capacity", last.realtime_streams),
            ("engine_running", last.running),
            ("engine_waiting", last.waiting),
            ("engine_start_wait", None if last.start_wait_ms is None else last.start_wait_ms / _MS),
        )
        if value is not None
    ]  # fmt: skip
    values.append(("engine_shed", record.shed))
    return values


def _kv_values(kv: KVVerdict) -> tuple[float | None, ...]:
    """The KV families' values, in `_KV` order (None: no sample)."""
    admission = None if kv.admission_ok is None else (1.0 if kv.admission_ok else 0.0)
    return (kv.bytes_per_token, kv.max_seqs_without_preemption, kv.max_num_seqs, admission)


class _Series:
    """One series: its prefix, and its last line with the value it was written with."""

    __slots__ = ("line", "prefix", "value")

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.value: float | None = None
        self.line = ""

    def text(self, value: float) -> str:
        """The series' line for `value`: the last one if written with the same value. Equal
        non-zero numbers have one text; 0.0 and -0.0 are equal but written apart, and NaN is
        never equal: those are written again."""
        if value != self.value or not value:
            self.value = value
            self.line = _line(self.prefix, value)
        return self.line


class _Device:
    """What is kept of one device between scrapes."""

    __slots__ = ("counts", "counts_key", "finished", "histograms", "series", "slo", "streams")

    def __init__(
        self, series: dict[str, _Series], finished: tuple[str, ...], slo: tuple[str, ...]
    ) -> None:
        #: Each device-labelled family's series, by family.
        self.series = series
        #: `edgemon_streams_finished_total`'s prefixes, in reason order.
        self.finished = finished
        #: `edgemon_streams_slo_total`'s prefixes, in `OUTCOMES` order.
        self.slo = slo
        #: Per stream: its slack and headroom series prefixes.
        self.streams: dict[str, tuple[str, str]] = {}
        #: The counts the `counts` lines were written from, and those lines.
        self.counts_key: tuple[object, ...] | None = None
        self.counts: list[tuple[int, str]] = []
        #: Per histogram: (histogram, its bucket counts and sum when its text was written, the
        #: text).
        self.histograms: list[tuple[Histogram, list[int], float, str] | None] = [None] * len(
            _HISTOGRAMS
        )


class DeviceText:
    """Writes a device's lines, family by family, reusing what did not change.

    `layout` gives, for each family `_add_device` fills (by its attribute name in
    `edgemon.adapters.metrics`), its position in `describe` order and its sample name (a
    histogram's: its base name); `reasons` are the `reason` label's values, in order;
    `per_stream` caps the per-stream series (0: none).
    """

    __slots__ = ("_devices", "_layout", "_per_stream", "_pos", "_reasons")

    def __init__(
        self, layout: Mapping[str, tuple[int, str]], reasons: Sequence[str], per_stream: int
    ) -> None:
        self._layout = dict(layout)
        self._pos = {slot: position for slot, (position, _) in layout.items()}
        self._reasons = tuple(reasons)
        self._per_stream = per_stream if "stream_slack" in layout else 0
        self._devices: dict[str, _Device] = {}

    def forget(self, present: set[str]) -> None:
        """Devices no longer tracked leave nothing cached."""
        if self._devices.keys() - present:
            self._devices = {k: v for k, v in self._devices.items() if k in present}

    def _device(self, device_id: str) -> _Device:
        label = f'device="{escape(device_id)}"'
        series = {
            slot: _Series(f"{name}{{{label}}} ")
            for slot, (_, name) in self._layout.items()
            if slot not in ("finished", "slo", "stream_slack", "stream_headroom", *_HISTOGRAMS)
        }
        name = self._layout["finished"][1]
        finished = tuple(f'{name}{{{label},reason="{escape(r)}"}} ' for r in self._reasons)
        name = self._layout["slo"][1]
        slo = tuple(f'{name}{{{label},outcome="{o}"}} ' for o in OUTCOMES)
        device = self._devices[device_id] = _Device(series, finished, slo)
        return device

    def _stream(self, device: _Device, device_id: str, stream_id: str) -> tuple[str, str]:
        if len(device.streams) >= STREAM_SERIES_LIMIT:
            device.streams.clear()
        labels = f'device="{escape(device_id)}",stream="{escape(stream_id)}"'
        pair = device.streams[stream_id] = (
            f"{self._layout['stream_slack'][1]}{{{labels}}} ",
            f"{self._layout['stream_headroom'][1]}{{{labels}}} ",
        )
        return pair

    def write(self, view: DeviceView, now: float) -> list[tuple[int, str]]:
        """The device's lines read now (device time `now`): (family position, its lines) for
        each family with lines, in no particular order."""
        device_id = view.id
        device = self._devices.get(device_id) or self._device(device_id)
        pos, series = self._pos, device.series
        stats = view.stats
        get = stats.finished.get
        outcomes = stats.slo.get
        kv = view.kv
        key = (
            view.stream_count,
            stats.throttle_engagements,
            stats.underruns,
            stats.underruns_retracted,
            stats.chunks,
            stats.streams_started,
            kv,
            *[get(reason, 0) for reason in self._reasons],
            *[outcomes(outcome, 0) for outcome in OUTCOMES],
        )
        if key != device.counts_key:
            device.counts = self._counts(device, key, kv)
            device.counts_key = key
        texts = device.counts.copy()
        live = view.summary(now, self._per_stream)
        values = [
            ("streams_at_risk", live.at_risk),
            ("margin", view.margin / _MS),
            ("throttle_active", 1.0 if view.throttle_on else 0.0),
            ("clock_offset", view.clock_offset_ms / _MS),
            ("last_event", view.last_message_wall_ms / _MS),
            ("throttle_seconds", view.throttle_ms() / _MS),
            ("underrun_seconds", view.underrun_ms() / _MS),
            ("audio", stats.audio_ms / _MS),
        ]
        if live.min_headroom is not None:
            values.append(("headroom_min", live.min_headroom / _MS))
        if live.min_slack is not None:
            values.append(("slack_min", live.min_slack / _MS))
        if view.capacity is not None:
            values += capacity_values(view.capacity)
        texts += [(pos[slot], series[slot].text(value)) for slot, value in values]
        if live.lowest:
            texts.extend(self._lowest(device, device_id, live.lowest))
        histograms = (
            stats.slack_at_arrival,
            stats.chunk_gap,
            stats.time_to_first_audio,
            stats.start_silence,
            stats.longest_gap,
        )
        texts_of = device.histograms
        for i, histogram in enumerate(histograms):
            entry = texts_of[i]
            if (
                entry is None
                or entry[0] is not histogram
                or entry[2] != histogram.total
                or entry[1] != histogram.counts
            ):
                entry = texts_of[i] = (
                    histogram,
                    histogram.counts.copy(),
                    histogram.total,
                    self._histogram(i, device_id, histogram),
                )
            texts.append((pos[_HISTOGRAMS[i]], entry[3]))
        return texts

    def _counts(
        self, device: _Device, key: tuple[object, ...], kv: KVVerdict | None
    ) -> list[tuple[int, str]]:
        """The lines of the device's counts (`key`)."""
        pos, series = self._pos, device.series
        slots = (
            "streams_active",
            "engagements",
            "underruns",
            "underruns_retracted",
            "chunks",
            "started",
        )
        lines = [
            (pos[slot], _line(series[slot].prefix, value))  # type: ignore[arg-type]
            for slot, value in zip(slots, key, strict=False)
        ]
        finished = len(slots) + 1  # after the counts, the KV verdict
        outcomes = finished + len(device.finished)
        for slot, prefixes, counts in (
            ("finished", device.finished, key[finished:outcomes]),
            ("slo", device.slo, key[outcomes:]),
        ):
            lines.append(
                (
                    pos[slot],
                    "".join(
                        _line(p, n)  # type: ignore[arg-type]
                        for p, n in zip(prefixes, counts, strict=True)
                    ),
                )
            )
        if kv is not None:
            for slot, value in zip(_KV, _kv_values(kv), strict=True):
                if value is not None:
                    lines.append((pos[slot], _line(series[slot].prefix, value)))
        return lines

    def _lowest(
        self, device: _Device, device_id: str, lowest: Sequence[tuple[str, float, float]]
    ) -> list[tuple[int, str]]:
        """The per-stream series' lines (the lowest-headroom streams, lowest first)."""
        streams = device.streams
        prefixes = [
            streams.get(sid) or self._stream(device, device_id, sid) for sid, _, _ in lowest
        ]
        n = len(lowest)
        # One call for both series: the slacks, then the headrooms.
        texts = go_floats([slack / _MS for _, slack, _ in lowest] + [h / _MS for _, _, h in lowest])
        slacks = [f"{p[0]}{t}\n" for p, t in zip(prefixes, texts[:n], strict=True)]
        heads = [f"{p[1]}{t}\n" for p, t in zip(prefixes, texts[n:], strict=True)]
        return [
            (self._pos["stream_slack"], "".join(slacks)),
            (self._pos["stream_headroom"], "".join(heads)),
        ]

    def _histogram(self, i: int, device_id: str, histogram: Histogram) -> str:
        """One histogram's lines, through prometheus_client's family (written on a change)."""
        family = HistogramMetricFamily(self._layout[_HISTOGRAMS[i]][1], "", labels=("device",))
        add_histogram(family, device_id, histogram)
        return "".join(sample_line(sample) for sample in family.samples)
