"""The metrics of docs/runbook.md, read from the engine at scrape time (no stale series).

`EdgemonCollector` keeps no metric objects of its own: each scrape builds the families from
the engine's state at the current wall clock, mapped to each device's clock, so time-dependent
gauges (slack, headroom, at-risk) are right at the scrape instant and a stream's series
disappears with the stream. The engine counts in milliseconds; everything here is exported in
seconds.

One caveat comes from the exposition formats: `edgemon_slack_at_arrival_seconds` has negative
bucket bounds (slack below zero is an underrun), and a histogram whose observations can be
negative has no `_sum` (it would not be monotonic) and so, per OpenMetrics, no `_count`
either; prometheus_client drops both. Its `le="+Inf"` bucket is the count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    Info,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from edgemon.adapters.connection_state import ConnectionState
from edgemon.adapters.metrics_text import DeviceText, add_histogram, capacity_values
from edgemon.engine.service_level import OUTCOMES
from edgemon.engine.stats import FINISH_REASONS
from edgemon.engine.views import device_view, device_views

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from prometheus_client.metrics_core import Metric

    from edgemon.engine.histogram import Histogram
    from edgemon.engine.views import DeviceView
    from edgemon.monitor import Monitor

__all__ = [
    "CallbackCounter",
    "ConnectionState",
    "DeadlineLatenessCollector",
    "EdgemonCollector",
    "EdgemonRegistry",
    "build_registry",
]

_MS = 1000.0
_INF = float("inf")

#: `edgemon_messages_total{result}` series exported from the start, at 0 until counted, so
#: alerts on `increase(...)` work from the first scrape. Other results appear when counted.
KNOWN_RESULTS = (
    "accepted",
    "gap",
    "duplicate",
    "after_final",
    "unknown_stream",
    "invalid_json",
    "invalid_event",
    "oversized",
    "unknown_topic",
    "device_limit",
    "stream_limit",
    "clock_jump",
    "overloaded",
    "internal_error",
)
#: Every value of `edgemon_streams_finished_total{reason}` (`fold_reason` bounds them).
FINISHED_REASONS = (*sorted(FINISH_REASONS), "other")


class _Families:
    """One scrape's metric families, prometheus_client's (iterating yields those with
    samples, in creation order), filled by `EdgemonCollector._add_device`. The text path
    (`DeviceText`) writes the same lines, laid out by `layout`."""

    __slots__ = (
        "_all",
        "audio",
        "chunk_gap",
        "chunks",
        "clock_offset",
        "engagements",
        "engine_realtime_capacity",
        "engine_running",
        "engine_shed",
        "engine_start_wait",
        "engine_waiting",
        "finished",
        "headroom_min",
        "kv_admission_ok",
        "kv_bytes_per_token",
        "kv_max_num_seqs",
        "kv_max_seqs",
        "last_event",
        "longest_gap",
        "margin",
        "slack_at_arrival",
        "slack_min",
        "slo",
        "start_silence",
        "started",
        "stream_headroom",
        "stream_slack",
        "streams_active",
        "streams_at_risk",
        "throttle_active",
        "throttle_seconds",
        "time_to_first_audio",
        "underrun_seconds",
        "underruns",
        "underruns_retracted",
    )

    def __init__(self, *, per_stream: bool) -> None:
        dev = ("device",)
        maker = _PromMaker()
        self._all: list[Any] = []

        def gauge(name: str, doc: str, labels: tuple[str, ...] = dev) -> _Scalar:
            family = maker.gauge(f"edgemon_{name}", doc, labels)
            self._all.append(family)
            return family

        def counter(name: str, doc: str, labels: tuple[str, ...] = dev) -> _Scalar:
            family = maker.counter(f"edgemon_{name}", doc, labels)
            self._all.append(family)
            return family

        def histogram(name: str, doc: str) -> _Hist:
            family = maker.histogram(f"edgemon_{name}", doc)
            self._all.append(family)
            return family

        self.streams_active = gauge("streams_active", "Streams tracked now.")
        self.streams_at_risk = gauge("streams_at_risk", "Live streams with headroom < margin.")
        self.slack_min = gauge(
            "playback_slack_min_seconds", "Lowest playback slack among live streams."
        )
        self.headroom_min = gauge("headroom_min_seconds", "Lowest headroom among live streams.")
        self.margin = gauge("margin_seconds", "The device's safety margin.")
        self.throttle_active = gauge("throttle_active", "1 while the device is throttled.")
        self.clock_offset = gauge(
            "device_clock_offset_seconds", "Wall clock minus the device's clock (estimated)."
        )
        self.last_event = gauge(
            "device_last_event_timestamp_seconds", "Wall time of the device's last message."
        )
        self.kv_bytes_per_token = gauge("kv_bytes_per_token", "KV cache bytes per token.")
        self.kv_max_seqs = gauge(
            "kv_max_seqs_without_preemption", "Full-length sequences the KV cache holds."
        )
        self.kv_max_num_seqs = gauge("kv_max_num_seqs", "The engine's max_num_seqs.")
        self.kv_admission_ok = gauge(
            "kv_admission_ok", "1 if max_num_seqs full-length sequences fit in the KV cache."
        )
        self.engine_realtime_capacity = gauge(
            "engine_realtime_capacity", "Streams the engine can decode in real time now."
        )
        self.engine_running = gauge("engine_running", "Requests the engine runs now.")
        self.engine_waiting = gauge("engine_waiting", "Requests waiting for admission now.")
        self.engine_start_wait = gauge(
            "engine_start_wait_seconds", "Predicted wait of a new request before its first audio."
        )
        self.engine_shed = counter(
            "engine_shed_total", "Requests the engine refused (across its restarts)."
        )
        self.engagements = counter("throttle_engagements_total", "Throttle OFF→ON changes.")
        self.throttle_seconds = counter("throttle_seconds_total", "Time spent throttled.")
        self.underruns = counter("underruns_total", "Underruns confirmed (docs/semantics.md).")
        self.underruns_retracted = counter(
            "underruns_retracted_total",
            "Provisional underruns that late chunks showed never happened.",
        )
        self.underrun_seconds = counter("underrun_seconds_total", "Time spent in underrun.")
        self.chunks = counter("chunks_total", "Chunks applied.")
        self.audio = counter("audio_seconds_total", "Audio received.")
        self.started = counter("streams_started_total", "Streams begun.")
        self.finished = counter(
            "streams_finished_total", "Streams removed, by reason.", ("device", "reason")
        )
        self.slack_at_arrival = histogram(
            "slack_at_arrival_seconds", "Slack just before each chunk's audio is added."
        )
        self.chunk_gap = histogram(
            "chunk_gap_seconds", "Time between consecutive chunks of a stream."
        )
        self.time_to_first_audio = histogram(
            "time_to_first_audio_seconds", "Start event to first chunk."
        )
        self.start_silence = histogram(
            "start_silence_seconds",
            "Start event (the request) to playback start: what the listener waited.",
        )
        self.longest_gap = histogram(
            "stream_longest_gap_seconds", "Each ended stream's longest gap (one underrun)."
        )
        self.slo = counter(
            "streams_slo", "Ended streams by service-level outcome.", ("device", "outcome")
        )
        per = ("device", "stream")
        self.stream_slack = (
            gauge("stream_playback_slack_seconds", "Playback slack of a live stream.", per)
            if per_stream
            else None
        )
        self.stream_headroom = (
            gauge("stream_headroom_seconds", "Headroom of a live stream.", per)
            if per_stream
            else None
        )

    def __iter__(self) -> Iterator[Metric]:
        return (family for family in self._all if family.samples)

    def declared(self) -> Iterator[Metric]:
        """Every family, sampled or not (for `describe`)."""
        return iter(self._all)

    def layout(self) -> dict[str, tuple[int, str]]:
        """Each family by its attribute name: its position in `declared` order and its
        sample name (a counter's ends in `_total`; a histogram's is its base name)."""
        positions = {id(family): i for i, family in enumerate(self._all)}
        layout = {}
        for slot in self.__slots__:
            family: Any = None if slot == "_all" else getattr(self, slot)
            if family is not None:
                name = family.name + ("_total" if family.type == "counter" else "")
                layout[slot] = (positions[id(family)], name)
        return layout


class _Scalar(Protocol):
    def add_metric(self, labels: Sequence[str], value: float) -> None: ...


class _Hist(Protocol):
    def add_histogram(self, device: str, histogram: Histogram) -> None: ...


class _PromHistogram(HistogramMetricFamily):
    def add_histogram(self, device: str, histogram: Histogram) -> None:
        add_histogram(self, device, histogram)


class _PromMaker:
    """prometheus_client's families (a registry's `collect`, and the text's headers)."""

    @staticmethod
    def gauge(name: str, doc: str, labels: Sequence[str]) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=labels)

    @staticmethod
    def counter(name: str, doc: str, labels: Sequence[str]) -> CounterMetricFamily:
        return CounterMetricFamily(name, doc, labels=labels)

    @staticmethod
    def histogram(name: str, doc: str) -> _PromHistogram:
        return _PromHistogram(name, doc, labels=("device",))


class EdgemonCollector:
    """A prometheus_client collector over a `Monitor`, evaluated at each scrape.

    `wall_clock` returns edgemon's wall time in milliseconds (the clock the monitor is fed
    with); `connection` is updated by the MQTT adapter; `per_stream_series` caps the opt-in
    per-stream gauges per device (lowest headroom first; 0 turns them off).
    """

    __slots__ = (
        "_connection",
        "_monitor",
        "_per_stream",
        "_text",
        "_wall_clock",
    )

    def __init__(
        self,
        monitor: Monitor,
        *,
        wall_clock: Callable[[], float],
        connection: ConnectionState,
        per_stream_series: int,
    ) -> None:
        self._monitor = monitor
        self._wall_clock = wall_clock
        self._connection = connection
        self._per_stream = max(0, per_stream_series)
        #: The text path's writer, kept between scrapes (what it caches persists).
        self._text = DeviceText(
            _Families(per_stream=self._per_stream > 0).layout(), FINISHED_REASONS, self._per_stream
        )

    def describe(self) -> Iterator[Metric]:
        """The families this collector exposes (lets the registry detect name clashes)."""
        yield from _Families(per_stream=self._per_stream > 0).declared()
        yield from self._global_families()

    def collect(self) -> Iterator[Metric]:
        """Every family, computed now (all devices at once)."""
        wall_ms = self._wall_clock()
        families = _Families(per_stream=self._per_stream > 0)
        for view in device_views(self._monitor.engine):
            self._add_device(families, view, view.now(wall_ms))
        yield from families
        yield from self._daemon_families()

    def device_ids(self) -> list[str]:
        """The devices tracked now."""
        ids = [view.id for view in device_views(self._monitor.engine)]
        self._text.forget(set(ids))
        return ids

    def device_text(self, device_id: str) -> list[tuple[int, str]] | None:
        """One device's sample lines read now at its clock, per family (by position in
        `describe` order, families without samples left out), as exposition text; None if the
        device is no longer tracked. The same lines as `collect` gives for the device, written
        without sample objects (`edgemon.adapters.metrics_text`)."""
        view = device_view(self._monitor.engine, device_id)
        if view is None:
            return None
        return self._text.write(view, view.now(self._wall_clock()))

    def daemon_families(self) -> list[Metric]:
        """The daemon-wide families (messages by result, MQTT connection, the SLO objective)."""
        return list(self._daemon_families())

    def _daemon_families(self) -> Iterator[Metric]:
        messages, connected, reconnects, objective = self._global_families()
        results = self._monitor.results
        for result in (*KNOWN_RESULTS, *sorted(results.keys() - set(KNOWN_RESULTS))):
            messages.add_metric([result], results[result])
        connection = self._connection
        connected.add_metric([], 1.0 if connection.connected else 0.0)
        reconnects.add_metric([], connection.reconnects)
        objective.add_metric([], self._monitor.engine.config.slo.objective)  # reloads follow
        yield messages
        yield connected
        yield reconnects
        yield objective

    @staticmethod
    def _global_families() -> tuple[
        CounterMetricFamily, GaugeMetricFamily, CounterMetricFamily, GaugeMetricFamily
    ]:
        return (
            CounterMetricFamily(
                "edgemon_messages_total", "Messages and events, by result.", labels=["result"]
            ),
            GaugeMetricFamily("edgemon_mqtt_connected", "1 while connected to the broker."),
            CounterMetricFamily("edgemon_mqtt_reconnects_total", "Broker sessions re-established."),
            GaugeMetricFamily(
                "edgemon_slo_objective",
                "[slo] objective: the share of good streams the burn-rate alerts defend.",
            ),
        )

    def _add_device(self, f: _Families, device: DeviceView, now: float) -> None:
        device_id = device.id
        labels = (device_id,)
        stats = device.stats
        live = device.summary(now, self._per_stream)
        f.streams_active.add_metric(labels, device.stream_count)
        f.streams_at_risk.add_metric(labels, live.at_risk)
        if live.min_headroom is not None:
            f.headroom_min.add_metric(labels, live.min_headroom / _MS)
        if live.min_slack is not None:
            f.slack_min.add_metric(labels, live.min_slack / _MS)
        if f.stream_slack is not None and f.stream_headroom is not None:
            for stream_id, slack, head in live.lowest:
                key = (device_id, stream_id)
                f.stream_slack.add_metric(key, slack / _MS)
                f.stream_headroom.add_metric(key, head / _MS)
        f.margin.add_metric(labels, device.margin / _MS)
        f.throttle_active.add_metric(labels, 1.0 if device.throttle_on else 0.0)
        f.clock_offset.add_metric(labels, device.clock_offset_ms / _MS)
        f.last_event.add_metric(labels, device.last_message_wall_ms / _MS)
        self._add_kv(f, device)
        self._add_capacity(f, device)
        # Both views never step back (they count an ongoing period only as far as the engine
        # has settled it), so these counters need no memory here.
        f.engagements.add_metric(labels, stats.throttle_engagements)
        f.throttle_seconds.add_metric(labels, device.throttle_ms() / _MS)
        f.underruns.add_metric(labels, stats.underruns)
        f.underruns_retracted.add_metric(labels, stats.underruns_retracted)
        f.underrun_seconds.add_metric(labels, device.underrun_ms() / _MS)
        f.chunks.add_metric(labels, stats.chunks)
        f.audio.add_metric(labels, stats.audio_ms / _MS)
        f.started.add_metric(labels, stats.streams_started)
        finished = stats.finished
        for reason in FINISHED_REASONS:
            f.finished.add_metric((device_id, reason), finished[reason])
        f.slack_at_arrival.add_histogram(device_id, stats.slack_at_arrival)
        f.chunk_gap.add_histogram(device_id, stats.chunk_gap)
        f.time_to_first_audio.add_histogram(device_id, stats.time_to_first_audio)
        f.start_silence.add_histogram(device_id, stats.start_silence)
        f.longest_gap.add_histogram(device_id, stats.longest_gap)
        slo = stats.slo
        for outcome in OUTCOMES:
            f.slo.add_metric((device_id, outcome), slo[outcome])

    @staticmethod
    def _add_kv(f: _Families, device: DeviceView) -> None:
        kv = device.kv
        if kv is None:
            return
        labels = (device.id,)
        f.kv_bytes_per_token.add_metric(labels, kv.bytes_per_token)
        f.kv_max_seqs.add_metric(labels, kv.max_seqs_without_preemption)
        if kv.max_num_seqs is not None:
            f.kv_max_num_seqs.add_metric(labels, kv.max_num_seqs)
        if kv.admission_ok is not None:
            f.kv_admission_ok.add_metric(labels, 1.0 if kv.admission_ok else 0.0)

    @staticmethod
    def _add_capacity(f: _Families, device: DeviceView) -> None:
        record = device.capacity
        if record is None:
            return
        labels = (device.id,)
        for slot, value in capacity_values(record):
            getattr(f, slot).add_metric(labels, value)


class DeadlineLatenessCollector:
    """`edgemon_deadline_lateness_seconds`: how late the deadline task fired (docs/runbook.md).

    `histogram` is the deadline timer's (milliseconds), read at each scrape.
    """

    __slots__ = ("_histogram",)

    def __init__(self, histogram: Histogram) -> None:
        self._histogram = histogram

    def collect(self) -> Iterator[Metric]:
        """The histogram now."""
        family = HistogramMetricFamily(
            "edgemon_deadline_lateness_seconds",
            "How late the deadline task fired each transition.",
            labels=(),
        )
        histogram = self._histogram
        buckets = [
            ("+Inf" if le == _INF else repr(le / _MS), float(n)) for le, n in histogram.cumulative()
        ]
        family.add_metric([], buckets, histogram.total / _MS)
        yield family


class CallbackCounter:
    """A counter whose total is kept elsewhere and read at each scrape (`read()`)."""

    __slots__ = ("_doc", "_name", "_read")

    def __init__(self, name: str, doc: str, read: Callable[[], float]) -> None:
        self._name = name
        self._doc = doc
        self._read = read

    def collect(self) -> Iterator[Metric]:
        """The total now."""
        yield CounterMetricFamily(self._name, self._doc, value=self._read())


class EdgemonRegistry(CollectorRegistry):
    """A registry whose engine families come first, from `edgemon` (not registered).

    `collect()` reads every device at once, as any registry does; a caller on the event loop
    reads `edgemon` a device at a time, then `collect_others()` (`adapters/exposition`).
    """

    def __init__(self, edgemon: EdgemonCollector) -> None:
        super().__init__()
        self.edgemon = edgemon

    def collect(self) -> Iterator[Metric]:
        """The engine's families, then every registered collector's."""
        yield from self.edgemon.collect()
        yield from super().collect()

    def collect_others(self) -> Iterator[Metric]:
        """The registered collectors' families (build, process, deadline lateness)."""
        yield from super().collect()


def build_registry(
    monitor: Monitor,
    *,
    wall_clock: Callable[[], float],
    connection: ConnectionState,
    per_stream_series: int,
    version: str,
) -> EdgemonRegistry:
    """A new registry (never the global one) with edgemon's, build and process metrics."""
    registry = EdgemonRegistry(
        EdgemonCollector(
            monitor,
            wall_clock=wall_clock,
            connection=connection,
            per_stream_series=per_stream_series,
        )
    )
    Info("edgemon_build", "edgemon's version.", registry=registry).info({"version": version})
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)  # registers nothing where the interpreter has no gc stats
    return registry
