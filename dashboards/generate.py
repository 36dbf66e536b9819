"""Generate edgemon's Grafana dashboards (JSON) from this file: the dashboards are code.

    python dashboards/generate.py           # (re)write dashboards/*.json
    python dashboards/generate.py --check   # exit 1 if a committed file differs

Plain Python and the standard library only: small helpers build targets and panels, two
functions lay out the fleet and the device dashboards of one box, a third the boxes of a fleet
on the central VictoriaMetrics (docs/fleet.md). Every panel has a description and a unit; every
expression uses the metrics of docs/runbook.md (`edgemon_*`), the recorded series of
deploy/prometheus/edgemon.rules.yml and `up`. Grafana variables in expressions: `$device`,
`$box`, `$__rate_interval`, `$__range`. The boxes dashboard uses MetricsQL's `lag` (seconds
since a series' last sample), so its data source must be VictoriaMetrics.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCHEMA_VERSION = 39  # Grafana 10.4 / 11
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24

Json = dict[str, Any]


# ---------------------------------------------------------------------------- targets
def target(expr: str, legend: str = "", *, instant: bool = False, fmt: str = "") -> Json:
    """One PromQL query; `fmt` is `table` or `heatmap` where the panel needs it."""
    query: Json = {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
    if instant:
        query.update(instant=True, range=False)
    else:
        query.update(range=True)
    if fmt:
        query["format"] = fmt
    return query


def quantiles(metric: str, selector: str) -> list[Json]:
    """p50, p90 and p99 of a histogram over the panel's rate interval."""
    rate = f"sum by (le) (rate({metric}_bucket{{{selector}}}[$__rate_interval]))"
    return [
        target(f"histogram_quantile({q}, {rate})", f"p{round(q * 100)}") for q in (0.5, 0.9, 0.99)
    ]


# ---------------------------------------------------------------------------- field config
def thresholds(*steps: tuple[float | None, str]) -> Json:
    """Grafana threshold steps, the first with value None (the base)."""
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in steps]}


def value_map(*entries: tuple[int, str, str]) -> list[Json]:
    """Map numeric states to text and colour (throttle on/off, connected, admission ok)."""
    options = {
        str(v): {"text": text, "color": color, "index": i}
        for i, (v, text, color) in enumerate(entries)
    }
    return [{"type": "value", "options": options}]


MARGIN_OVERRIDE: Json = {
    "matcher": {"id": "byRegexp", "options": ".*margin$"},
    "properties": [
        {"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}},
        {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
        {"id": "custom.fillOpacity", "value": 0},
        {"id": "custom.lineWidth", "value": 1},
    ],
}
"""Series whose legend ends in `margin` drawn as a dashed red threshold line."""

ON_OFF = value_map((0, "off", "green"), (1, "throttled", "orange"))
CONNECTED = value_map((0, "down", "red"), (1, "up", "green"))


# ---------------------------------------------------------------------------- panels
def panel(  # noqa: PLR0913 - keyword-only panel options
    kind: str,
    title: str,
    description: str,
    targets: list[Json],
    *,
    unit: str,
    w: int = 12,
    h: int = 8,
    options: Json | None = None,
    custom: Json | None = None,
    steps: Json | None = None,
    mappings: list[Json] | None = None,
    overrides: list[Json] | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    transformations: list[Json] | None = None,
) -> Json:
    """A panel of any type; `layout` assigns its id and position."""
    defaults: Json = {"unit": unit}
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    if custom:
        defaults["custom"] = custom
    if steps:
        defaults["thresholds"] = steps
    if mappings:
        defaults["mappings"] = mappings
    for ref, query in zip("ABCDEFGH", targets, strict=False):
        query["refId"] = ref
    result: Json = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": {"h": h, "w": w, "x": 0, "y": 0},
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": options or {},
        "targets": targets,
    }
    if transformations:
        result["transformations"] = transformations
    return result


def timeseries(
    title: str, description: str, targets: list[Json], *, dashed: bool = False, **kw: Any
) -> Json:
    """Lines over time, the legend a table of last and lowest values; `dashed` draws the
    thresholds as dashed lines."""
    style = {"mode": "dashed" if dashed else "off"}
    kw.setdefault(
        "custom",
        {
            "lineWidth": 1,
            "fillOpacity": 0,
            "showPoints": "never",
            "spanNulls": False,
            "thresholdsStyle": style,
        },
    )
    kw.setdefault(
        "options",
        {
            "legend": {
                "displayMode": "table",
                "placement": "right",
                "calcs": ["lastNotNull", "min"],
            },
            "tooltip": {"mode": "multi", "sort": "asc"},
        },
    )
    return panel("timeseries", title, description, targets, **kw)


def stat(title: str, description: str, targets: list[Json], **kw: Any) -> Json:
    """One big number per series, coloured by its thresholds."""
    kw.setdefault(
        "options",
        {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "textMode": "auto",
        },
    )
    kw.setdefault("w", 6)
    kw.setdefault("h", 4)
    return panel("stat", title, description, targets, **kw)


def state_timeline(title: str, description: str, targets: list[Json], **kw: Any) -> Json:
    """Discrete states over time, one band per series."""
    kw.setdefault(
        "options",
        {
            "mergeValues": True,
            "showValue": "never",
            "alignValue": "left",
            "rowHeight": 0.9,
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
        },
    )
    kw.setdefault("custom", {"fillOpacity": 80, "lineWidth": 0})
    return panel("state-timeline", title, description, targets, **kw)


def heatmap(title: str, description: str, query: Json, *, y_unit: str, **kw: Any) -> Json:
    """Prometheus histogram buckets as a heatmap (no Grafana-side bucketing)."""
    query["format"] = "heatmap"
    query["legendFormat"] = "{{le}}"
    kw.setdefault(
        "options",
        {
            "calculate": False,
            "yAxis": {"axisPlacement": "left", "unit": y_unit},
            "rowsFrame": {"layout": "le"},
            "color": {
                "mode": "scheme",
                "scheme": "Oranges",
                "exponent": 0.5,
                "steps": 64,
                "fill": "dark-orange",
                "reverse": False,
            },
            "cellGap": 1,
            "tooltip": {"mode": "single", "yHistogram": True},
            "legend": {"show": True},
        },
    )
    return panel("heatmap", title, description, [query], **kw)


def row(title: str) -> Json:
    """A (not collapsible) row header; `layout` places it full width."""
    return {
        "type": "row",
        "title": title,
        "collapsed": False,
        "panels": [],
        "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": 0},
    }


def layout(items: list[Json]) -> list[Json]:
    """Number the panels and place them left to right, wrapping at the grid's width."""
    x = y = line_height = 0
    for number, item in enumerate(items, start=1):
        grid = item["gridPos"]
        if item["type"] == "row" or x + grid["w"] > GRID_WIDTH:
            x, y, line_height = 0, y + line_height, 0
        grid["x"], grid["y"] = x, y
        item["id"] = number
        x += grid["w"]
        line_height = max(line_height, grid["h"])
        if item["type"] == "row":
            x, y, line_height = 0, y + grid["h"], 0
    return items


# ---------------------------------------------------------------------------- dashboards
def datasource_variable() -> Json:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
        "regex": "",
        "options": [],
    }


def device_variable(*, multi: bool) -> Json:
    query = "label_values(edgemon_streams_active, device)"
    variable: Json = {
        "name": "device",
        "label": "Device",
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": "StandardVariableQuery"},
        "refresh": 2,
        "sort": 1,
        "hide": 0,
        "multi": multi,
        "includeAll": multi,
        "current": {},
        "options": [],
        "regex": "",
    }
    if multi:
        variable["allValue"] = ".*"
    return variable


def dashboard(
    uid: str, title: str, description: str, panels: list[Json], variables: list[Json]
) -> Json:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["edgemon"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "id": None,
        "annotations": {"list": []},
        "links": [
            {
                "title": "edgemon dashboards",
                "type": "dashboards",
                "tags": ["edgemon"],
                "asDropdown": False,
                "includeVars": True,
                "keepTime": True,
            },
        ],
        "templating": {"list": variables},
        "panels": layout(panels),
    }


def fleet() -> Json:
    """Every device at a glance: is anyone close to or in underrun, throttled, rejected."""
    dev = 'device=~"$device"'
    headroom_steps = thresholds((None, "red"), (0, "orange"), (0.08, "green"))
    panels = [
        row("Playback"),
        timeseries(
            "Worst headroom per device",
            "Lowest headroom (slack minus the wait for the next chunk) among each device's live "
            "streams. Below the device's margin (dashed red `<device> margin` lines) the throttle "
            "engages; below 0 audio runs out before the next chunk can arrive. Dashed grey lines: "
            "0 and the default margin (80 ms). No value while a device has no live stream.",
            [
                target(f"min by (device) (edgemon_headroom_min_seconds{{{dev}}})", "{{device}}"),
                target(f"max by (device) (edgemon_margin_seconds{{{dev}}})", "{{device}} margin"),
            ],
            unit="s",
            dashed=True,
            steps=headroom_steps,
            overrides=[MARGIN_OVERRIDE],
        ),
        timeseries(
            "Worst playback slack per device",
            "Lowest playback slack (audio buffered ahead of the player) among each device's "
            "live streams, with each device's margin as a dashed red line. Below 0 a stream is "
            "in underrun.",
            [
                target(
                    f"min by (device) (edgemon_playback_slack_min_seconds{{{dev}}})", "{{device}}"
                ),
                target(f"max by (device) (edgemon_margin_seconds{{{dev}}})", "{{device}} margin"),
            ],
            unit="s",
            dashed=True,
            steps=headroom_steps,
            overrides=[MARGIN_OVERRIDE],
        ),
        state_timeline(
            "Throttle state",
            "When each device's prefill throttle was on (edgemon_throttle_active). Short "
            "bursts are the throttle working; a band that stays orange for minutes is the "
            "EdgemonThrottleStuck alert.",
            [target(f"max by (device) (edgemon_throttle_active{{{dev}}})", "{{device}}")],
            unit="bool_on_off",
            mappings=ON_OFF,
            w=16,
            steps=thresholds((None, "green"), (1, "orange")),
        ),
        timeseries(
            "Time throttled",
            "Share of the last 5 minutes each device spent throttled "
            "(recorded as device:edgemon_throttle_seconds:rate5m).",
            [
                target(
                    f"sum by (device) (device:edgemon_throttle_seconds:rate5m{{{dev}}})",
                    "{{device}}",
                )
            ],
            unit="percentunit",
            minimum=0,
            w=8,
        ),
        row("Underruns"),
        timeseries(
            "Underruns per minute",
            "Underruns begun per minute, averaged over 5 minutes "
            "(device:edgemon_underruns:rate5m × 60). Any value above 0 is audible; the "
            "EdgemonUnderruns alert fires on it.",
            [
                target(
                    f"sum by (device) (device:edgemon_underruns:rate5m{{{dev}}}) * 60", "{{device}}"
                )
            ],
            unit="cpm",
            minimum=0,
            dashed=True,
            steps=thresholds((None, "green"), (0.001, "red")),
        ),
        timeseries(
            "Time in underrun",
            "Stream-seconds of underrun per second, over 5 minutes "
            "(device:edgemon_underrun_seconds:rate5m): 25% means a quarter of a stream was "
            "silent on average; it exceeds 100% when several streams underrun at once.",
            [
                target(
                    f"sum by (device) (device:edgemon_underrun_seconds:rate5m{{{dev}}})",
                    "{{device}}",
                )
            ],
            unit="percentunit",
            minimum=0,
        ),
        row("Streams"),
        timeseries(
            "Streams active",
            "Streams edgemon tracks per device now (started, not yet ended or expired).",
            [target(f"sum by (device) (edgemon_streams_active{{{dev}}})", "{{device}}")],
            unit="short",
            minimum=0,
        ),
        timeseries(
            "Streams at risk",
            "Live streams whose headroom is below their margin, per device. These are the "
            "streams the throttle is protecting right now.",
            [target(f"sum by (device) (edgemon_streams_at_risk{{{dev}}})", "{{device}}")],
            unit="short",
            minimum=0,
        ),
        row("Input and broker"),
        timeseries(
            "Input rejections by reason",
            "Messages and events edgemon rejected, per second by reason "
            "(result:edgemon_messages:rate5m without accepted and gap). See the "
            "EdgemonInputRejected section of the runbook for what each reason means.",
            [
                target(
                    "sum by (result) "
                    '(result:edgemon_messages:rate5m{result!~"accepted|gap|deleted"})',
                    "{{result}}",
                )
            ],
            unit="mps",
            minimum=0,
            w=9,
        ),
        stat(
            "Rejected share",
            "Share of input rejected over the last 5 minutes, per edgemon "
            "(instance:edgemon_messages_rejected:ratio_rate5m). Red above 5%, where "
            "EdgemonInputRejected fires. Empty while no message arrives.",
            [target("instance:edgemon_messages_rejected:ratio_rate5m", "{{instance}}")],
            unit="percentunit",
            w=5,
            h=8,
            steps=thresholds((None, "green"), (0.01, "orange"), (0.05, "red")),
        ),
        state_timeline(
            "Broker connection and scrape",
            "edgemon's MQTT session to the broker (edgemon_mqtt_connected) and whether "
            "Prometheus can scrape edgemon (up). While either is down, nothing is monitored.",
            [
                target("max by (instance) (edgemon_mqtt_connected)", "{{instance}} broker"),
                target('max by (instance) (up{job="edgemon"})', "{{instance}} scrape"),
            ],
            unit="bool_on_off",
            mappings=CONNECTED,
            w=10,
            steps=thresholds((None, "red"), (1, "green")),
        ),
        row("KV admission"),
        panel(
            "table",
            "KV cache admission",
            "Per device, from its engine object: whether max_num_seqs full-length sequences "
            "fit in the KV cache (admission), the engine's max_num_seqs, how many fit without "
            "preemption, and the KV bytes per token. Devices without an engine object are not "
            "listed. UNSAFE is the EdgemonKvAdmissionUnsafe alert.",
            [
                target(
                    f"max by (device) (edgemon_kv_admission_ok{{{dev}}})", instant=True, fmt="table"
                ),
                target(
                    f"max by (device) (edgemon_kv_max_num_seqs{{{dev}}})", instant=True, fmt="table"
                ),
                target(
                    f"max by (device) (edgemon_kv_max_seqs_without_preemption{{{dev}}})",
                    instant=True,
                    fmt="table",
                ),
                target(
                    f"max by (device) (edgemon_kv_bytes_per_token{{{dev}}})",
                    instant=True,
                    fmt="table",
                ),
            ],
            unit="short",
            w=24,
            h=7,
            options={
                "showHeader": True,
                "cellHeight": "sm",
                "sortBy": [{"displayName": "admission", "desc": False}],
            },
            transformations=[
                {"id": "merge", "options": {}},
                {
                    "id": "organize",
                    "options": {
                        "excludeByName": {"Time": True},
                        "renameByName": {
                            "Value #A": "admission",
                            "Value #B": "max_num_seqs",
                            "Value #C": "max seqs without preemption",
                            "Value #D": "KV bytes per token",
                        },
                    },
                },
            ],
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "admission"},
                    "properties": [
                        {
                            "id": "mappings",
                            "value": value_map((0, "UNSAFE", "red"), (1, "ok", "green")),
                        },
                        {"id": "custom.cellOptions", "value": {"type": "color-background"}},
                    ],
                },
                {
                    "matcher": {"id": "byName", "options": "KV bytes per token"},
                    "properties": [{"id": "unit", "value": "bytes"}],
                },
            ],
        ),
    ]
    return dashboard(
        "edgemon-fleet",
        "edgemon / Fleet",
        "Every device an edgemon watches: headroom and slack against the margin, throttle, "
        "underruns, streams, rejected input, broker connection, KV admission.",
        panels,
        [datasource_variable(), device_variable(multi=True)],
    )


def engine_capacity(dev: str) -> list[Json]:
    """The device's engine capacity (its capacity objects, docs/protocol.md): what a load
    balancer weighs the box by."""
    spare = (
        f"clamp_min(max(edgemon_engine_realtime_capacity{{{dev}}}) - "
        f"max(edgemon_engine_running{{{dev}}}), 0)"
    )
    return [
        row("Engine capacity"),
        stat(
            "Spare real-time streams",
            "Streams the engine can still decode in real time: its real-time capacity minus "
            "what it runs, at least 0 (edgemon_engine_realtime_capacity − edgemon_engine_running; "
            "the agent check weighs the box by its share). Empty until the engine publishes "
            "a capacity object.",
            [target(spare)],
            unit="short",
            w=4,
            steps=thresholds((None, "red"), (1, "green")),
        ),
        timeseries(
            "Capacity, running, waiting",
            "Streams the engine measures it can decode in real time (dashed), the requests it "
            "runs and those waiting for admission (edgemon_engine_realtime_capacity, "
            "edgemon_engine_running, edgemon_engine_waiting).",
            [
                target(f"max(edgemon_engine_realtime_capacity{{{dev}}})", "real-time capacity"),
                target(f"max(edgemon_engine_running{{{dev}}})", "running"),
                target(f"max(edgemon_engine_waiting{{{dev}}})", "waiting"),
            ],
            unit="short",
            minimum=0,
            w=8,
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "real-time capacity"},
                    "properties": [
                        {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}
                    ],
                }
            ],
        ),
        timeseries(
            "Predicted start wait",
            "The engine's prediction of how long a new request would wait for its first "
            "audio (edgemon_engine_start_wait_seconds). Past the start SLO the engine sheds "
            "new requests instead of queueing them.",
            [target(f"max(edgemon_engine_start_wait_seconds{{{dev}}})", "start wait")],
            unit="s",
            minimum=0,
            w=6,
        ),
        timeseries(
            "Requests shed",
            "Requests the engine refused (HTTP 503 with Retry-After) per second "
            "(edgemon_engine_shed_total, counted across engine restarts). A load balancer "
            "retries them on another box.",
            [target(f"sum(rate(edgemon_engine_shed_total{{{dev}}}[$__rate_interval]))", "shed/s")],
            unit="reqps",
            minimum=0,
            w=6,
        ),
    ]


def device() -> Json:
    """One device in depth: its streams, timings and clock."""
    dev = 'device="$device"'
    panels = [
        row("Now"),
        stat(
            "Streams active",
            "Streams edgemon tracks on this device now.",
            [target(f"sum(edgemon_streams_active{{{dev}}})")],
            unit="short",
            w=4,
        ),
        stat(
            "Streams at risk",
            "Live streams with headroom below the margin now.",
            [target(f"sum(edgemon_streams_at_risk{{{dev}}})")],
            unit="short",
            w=4,
            steps=thresholds((None, "green"), (1, "orange")),
        ),
        stat(
            "Throttle",
            "The device's prefill throttle now.",
            [target(f"max(edgemon_throttle_active{{{dev}}})")],
            unit="bool_on_off",
            w=4,
            mappings=ON_OFF,
            steps=thresholds((None, "green"), (1, "orange")),
        ),
        stat(
            "Margin",
            "The margin this device's streams are held to (edgemon_margin_seconds).",
            [target(f"max(edgemon_margin_seconds{{{dev}}})")],
            unit="s",
            w=4,
        ),
        stat(
            "Since last message",
            "Time since edgemon last received a message from this device. A device that "
            "generates nothing is silent, so this grows when idle too.",
            [target(f"time() - max(edgemon_device_last_event_timestamp_seconds{{{dev}}})")],
            unit="s",
            w=4,
            steps=thresholds((None, "green"), (60, "orange")),
        ),
        stat(
            "KV admission",
            "Whether max_num_seqs full-length sequences fit in the KV cache "
            "(from the engine object; empty without one).",
            [target(f"max(edgemon_kv_admission_ok{{{dev}}})")],
            unit="bool_on_off",
            w=4,
            mappings=value_map((0, "UNSAFE", "red"), (1, "ok", "green")),
        ),
        row("Slack"),
        timeseries(
            "Headroom and slack against the margin",
            "The device's lowest headroom and lowest playback slack among live streams, and "
            "its margin (dashed red). Headroom below the margin engages the throttle; slack "
            "below 0 is an underrun.",
            [
                target(f"min(edgemon_headroom_min_seconds{{{dev}}})", "headroom"),
                target(f"min(edgemon_playback_slack_min_seconds{{{dev}}})", "slack"),
                target(f"max(edgemon_margin_seconds{{{dev}}})", "margin"),
            ],
            unit="s",
            dashed=True,
            overrides=[MARGIN_OVERRIDE],
            steps=thresholds((None, "red"), (0, "transparent")),
        ),
        heatmap(
            "Slack at chunk arrival",
            "Distribution of playback slack just before each chunk's audio was added "
            "(edgemon_slack_at_arrival_seconds buckets, per rate interval). Mass near or below "
            "0 means chunks arrive just in time or late.",
            target(
                f"sum by (le) (increase(edgemon_slack_at_arrival_seconds_bucket{{{dev}}}"
                "[$__rate_interval]))"
            ),
            y_unit="s",
            unit="short",
        ),
        timeseries(
            "Headroom of the worst streams",
            "Headroom of the 10 live streams closest to underrun "
            "(edgemon_stream_headroom_seconds; exported only with [limits] per_stream_series > "
            "0, the lowest first). A series ends with its stream.",
            [
                target(f"bottomk(10, edgemon_stream_headroom_seconds{{{dev}}})", "{{stream}}"),
                target(f"max(edgemon_margin_seconds{{{dev}}})", "margin"),
            ],
            unit="s",
            overrides=[MARGIN_OVERRIDE],
            dashed=True,
            steps=thresholds((None, "red"), (0, "transparent")),
        ),
        timeseries(
            "Slack of the worst streams",
            "Playback slack of the 10 live streams with the least of it "
            "(edgemon_stream_playback_slack_seconds, opt-in like the headroom panel).",
            [target(f"bottomk(10, edgemon_stream_playback_slack_seconds{{{dev}}})", "{{stream}}")],
            unit="s",
            dashed=True,
            steps=thresholds((None, "red"), (0, "transparent")),
        ),
        *engine_capacity(dev),
        row("Timing"),
        timeseries(
            "Chunk gap percentiles",
            "Time between consecutive chunks of a stream: p50, p90, p99 over the rate interval "
            "(edgemon_chunk_gap_seconds). A chunk gap longer than the audio in the chunk "
            "drains slack.",
            quantiles("edgemon_chunk_gap_seconds", dev),
            unit="s",
            minimum=0,
            w=8,
        ),
        timeseries(
            "Time to first audio percentiles",
            "From a stream's start event to its first chunk: p50, p90, p99 over the rate "
            "interval (edgemon_time_to_first_audio_seconds). Empty while no stream starts.",
            quantiles("edgemon_time_to_first_audio_seconds", dev),
            unit="s",
            minimum=0,
            w=8,
        ),
        timeseries(
            "Device clock offset",
            "Estimated wall clock minus the device's clock (edgemon_device_clock_offset_seconds). "
            "edgemon maps the device's timestamps through it; a jump means the device's clock "
            "was stepped.",
            [target(f"edgemon_device_clock_offset_seconds{{{dev}}}", "{{instance}}")],
            unit="s",
            w=8,
        ),
        row("Service level"),
        timeseries(
            "Good streams",
            "The share of streams ended over the rate interval that were good: started "
            "within [slo] start_ms and never silent longer than [slo] gap_ms "
            "(edgemon_streams_slo_total, docs/semantics.md). The dashed line is the objective "
            "the burn-rate alerts defend (edgemon_slo_objective). Empty while no stream ends.",
            [
                target(
                    f'sum(rate(edgemon_streams_slo_total{{{dev},outcome="good"}}'
                    f"[$__rate_interval])) / sum(rate(edgemon_streams_slo_total{{{dev}}}"
                    "[$__rate_interval]))",
                    "good",
                ),
                target("max(edgemon_slo_objective)", "objective"),
            ],
            unit="percentunit",
            minimum=0,
            maximum=1,
            w=8,
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "objective"},
                    "properties": [
                        {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                        {"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}},
                    ],
                }
            ],
        ),
        timeseries(
            "Streams by outcome",
            "Streams ended per rate interval by outcome: good, late (start SLO missed), gappy "
            "(start met, a gap longer than the gap SLO), unfinished (expired, never played, or "
            "ended other than completed before its audio played out).",
            [
                target(
                    "sum by (outcome) (increase(edgemon_streams_slo_total"
                    f"{{{dev}}}[$__rate_interval]))",
                    "{{outcome}}",
                )
            ],
            unit="short",
            minimum=0,
            w=8,
        ),
        heatmap(
            "Longest gap per stream",
            "Distribution of each ended stream's longest gap, its longest single underrun "
            "(edgemon_stream_longest_gap_seconds buckets, per rate interval). The le=0 row "
            "holds the streams without any; mass above 0.1 s misses the default gap SLO.",
            target(
                f"sum by (le) (increase(edgemon_stream_longest_gap_seconds_bucket{{{dev}}}"
                "[$__rate_interval]))"
            ),
            y_unit="s",
            unit="short",
            w=8,
        ),
        row("Outcomes"),
        state_timeline(
            "Throttle state",
            "When this device's prefill throttle was on.",
            [target(f"max(edgemon_throttle_active{{{dev}}})", "throttle")],
            unit="bool_on_off",
            mappings=ON_OFF,
            h=5,
            w=24,
            steps=thresholds((None, "green"), (1, "orange")),
        ),
        timeseries(
            "Underruns",
            "Underruns begun per rate interval, and the stream-seconds spent in underrun per "
            "second (right axis).",
            [
                target(
                    f"sum(increase(edgemon_underruns_total{{{dev}}}[$__rate_interval]))",
                    "underruns",
                ),
                target(
                    f"sum(rate(edgemon_underrun_seconds_total{{{dev}}}[$__rate_interval]))",
                    "time in underrun",
                ),
            ],
            unit="short",
            minimum=0,
            w=8,
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "time in underrun"},
                    "properties": [
                        {"id": "unit", "value": "percentunit"},
                        {"id": "custom.axisPlacement", "value": "right"},
                    ],
                }
            ],
        ),
        timeseries(
            "Start silence percentiles",
            "From a stream's start event (the request) to its playback start, prebuffer "
            "included: what a listener waited before hearing anything (p50, p90, p99 over "
            "the rate interval, edgemon_start_silence_seconds). Next to the time in "
            "underrun: holding prefills moves silence from mid-sentence gaps to here. Empty "
            "while no stream starts with a start event.",
            quantiles("edgemon_start_silence_seconds", dev),
            unit="s",
            minimum=0,
            w=8,
        ),
        timeseries(
            "Streams started and finished",
            "Streams begun, and streams removed by reason (completed, cancelled, error, "
            "expired, other), per rate interval. Many expired streams: a device stops sending "
            "without ending its streams.",
            [
                target(
                    f"sum(increase(edgemon_streams_started_total{{{dev}}}[$__rate_interval]))",
                    "started",
                ),
                target(
                    "sum by (reason) (increase(edgemon_streams_finished_total"
                    f"{{{dev}}}[$__rate_interval]))",
                    "{{reason}}",
                ),
            ],
            unit="short",
            minimum=0,
            w=8,
        ),
        timeseries(
            "Audio and chunks received",
            "Seconds of audio received per second (summed over streams: 2 means two streams' "
            "worth of real time) and chunks per second (right axis).",
            [
                target(
                    f"sum(rate(edgemon_audio_seconds_total{{{dev}}}[$__rate_interval]))",
                    "audio s/s",
                ),
                target(f"sum(rate(edgemon_chunks_total{{{dev}}}[$__rate_interval]))", "chunks/s"),
            ],
            unit="short",
            minimum=0,
            w=8,
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "chunks/s"},
                    "properties": [
                        {"id": "unit", "value": "eps"},
                        {"id": "custom.axisPlacement", "value": "right"},
                    ],
                }
            ],
        ),
    ]
    return dashboard(
        "edgemon-device",
        "edgemon / Device",
        "One device in depth: headroom and slack, slack at chunk arrival, the worst streams, "
        "the engine's capacity, chunk gaps, time to first audio, clock offset, service level, "
        "outcomes.",
        panels,
        [datasource_variable(), device_variable(multi=False)],
    )


# ---------------------------------------------------------------------------- boxes
def box_variable() -> Json:
    """The boxes of a fleet: the `box` label every box's Prometheus agent adds."""
    query = 'label_values(up{job="edgemon"}, box)'
    return {
        "name": "box",
        "label": "Box",
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": "StandardVariableQuery"},
        "refresh": 2,
        "sort": 1,
        "hide": 0,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {},
        "options": [],
        "regex": "",
    }


def ranking(title: str, description: str, expr: str, *, unit: str, steps: Json) -> Json:
    """A horizontal bar per box, worst first, over the dashboard's time range."""
    return panel(
        "bargauge",
        title,
        description,
        [target(expr, "{{box}}", instant=True)],
        unit=unit,
        w=8,
        h=9,
        minimum=0,
        steps=steps,
        options={
            "orientation": "horizontal",
            "displayMode": "basic",
            "showUnfilled": True,
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        },
    )


STALE_AFTER_S = 300
"""Seconds without a sample after which a box's uplink counts as stale (EdgemonUplinkStale)."""


def boxes() -> Json:
    """A fleet of boxes on the central store: the worst boxes, and those not reporting."""
    box = 'box=~"$box"'
    up = f'up{{job="edgemon",{box}}}'
    panels = [
        row("Worst boxes"),
        ranking(
            "Worst boxes by time in underrun",
            "Stream-seconds of underrun on each box over the dashboard's time range, summed "
            "over its devices, the ten worst boxes first. Any bar above 0 was audible.",
            f"topk(10, sum by (box) (increase(edgemon_underrun_seconds_total{{{box}}}[$__range])))",
            unit="s",
            steps=thresholds((None, "green"), (0.001, "red")),
        ),
        ranking(
            "Worst boxes by throttle share",
            "Share of the dashboard's time range each box's devices spent with their prefill "
            "throttled (averaged over its devices), the ten highest first. A box near 100% is "
            "overloaded for good: it needs fewer streams or a faster engine.",
            f"topk(10, avg by (box) (rate(edgemon_throttle_seconds_total{{{box}}}[$__range])))",
            unit="percentunit",
            steps=thresholds((None, "green"), (0.05, "orange"), (0.5, "red")),
        ),
        ranking(
            "Boxes whose KV admission would preempt",
            "Devices per box whose engine object says max_num_seqs full-length sequences do "
            "not fit in the KV cache (edgemon_kv_admission_ok = 0): under full load their "
            "engine preempts and recomputes. 0 on a box whose every device fits.",
            f"sort_desc(sum by (box) (1 - edgemon_kv_admission_ok{{{box}}}))",
            unit="short",
            steps=thresholds((None, "green"), (1, "red")),
        ),
        row("Boxes not reporting"),
        panel(
            "table",
            "Boxes down or stale",
            "Per box: whether its agent could scrape edgemon at its last report (down: the "
            "EdgemonDown alert), and seconds since the central store received its last sample "
            f"(over {STALE_AFTER_S} s: EdgemonUplinkStale; its uplink, agent or the box is "
            "down). Boxes silent for more than a day are not listed. Needs VictoriaMetrics "
            "(MetricsQL `lag`) as the data source.",
            [
                target(f"min by (box) (last_over_time({up}[1d]))", instant=True, fmt="table"),
                target(f"min by (box) (lag({up}[1d]))", instant=True, fmt="table"),
            ],
            unit="short",
            w=10,
            h=9,
            options={
                "showHeader": True,
                "cellHeight": "sm",
                "sortBy": [{"displayName": "seconds since last sample", "desc": True}],
            },
            transformations=[
                {"id": "merge", "options": {}},
                {
                    "id": "organize",
                    "options": {
                        "excludeByName": {"Time": True},
                        "renameByName": {
                            "Value #A": "edgemon",
                            "Value #B": "seconds since last sample",
                        },
                    },
                },
            ],
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "edgemon"},
                    "properties": [
                        {"id": "mappings", "value": CONNECTED},
                        {"id": "custom.cellOptions", "value": {"type": "color-background"}},
                    ],
                },
                {
                    "matcher": {"id": "byName", "options": "seconds since last sample"},
                    "properties": [
                        {"id": "unit", "value": "s"},
                        {
                            "id": "thresholds",
                            "value": thresholds((None, "green"), (STALE_AFTER_S, "red")),
                        },
                        {"id": "custom.cellOptions", "value": {"type": "color-text"}},
                    ],
                },
            ],
        ),
        state_timeline(
            "edgemon up per box",
            "Whether each box's agent could scrape its edgemon (up). Red: edgemon is down on "
            "that box. A gap: nothing arrived from the box (see the next panel).",
            [target(f"min by (box) ({up})", "{{box}}")],
            unit="bool_on_off",
            mappings=CONNECTED,
            w=14,
            h=9,
            steps=thresholds((None, "red"), (1, "green")),
        ),
        timeseries(
            "Seconds since each box's last sample",
            "How far behind the central store is on each box (MetricsQL `lag`): a few "
            f"seconds normally, rising while its uplink is cut; past {STALE_AFTER_S} s "
            "(dashed red) EdgemonUplinkStale fires. When the uplink returns the agent replays "
            "its WAL and the gap is filled in.",
            [target(f"min by (box) (lag({up}[1h]))", "{{box}}")],
            unit="s",
            minimum=0,
            dashed=True,
            w=24,
            steps=thresholds((None, "green"), (STALE_AFTER_S, "red")),
        ),
        row("Per box over time"),
        timeseries(
            "Time in underrun per box",
            "Stream-seconds of underrun per second on each box (summed over its devices).",
            [
                target(
                    "sum by (box) "
                    f"(rate(edgemon_underrun_seconds_total{{{box}}}[$__rate_interval]))",
                    "{{box}}",
                )
            ],
            unit="percentunit",
            minimum=0,
            w=8,
        ),
        timeseries(
            "Throttle share per box",
            "Share of time each box's devices spent throttled (averaged over its devices).",
            [
                target(
                    "avg by (box) "
                    f"(rate(edgemon_throttle_seconds_total{{{box}}}[$__rate_interval]))",
                    "{{box}}",
                )
            ],
            unit="percentunit",
            minimum=0,
            w=8,
        ),
        timeseries(
            "Streams active per box",
            "Streams edgemon tracks on each box now (summed over its devices).",
            [target(f"sum by (box) (edgemon_streams_active{{{box}}})", "{{box}}")],
            unit="short",
            minimum=0,
            w=8,
        ),
    ]
    return dashboard(
        "edgemon-boxes",
        "edgemon / Boxes",
        "A fleet of edge boxes on the central VictoriaMetrics: the worst boxes by underrun "
        "and throttle, boxes whose KV admission would preempt, boxes whose edgemon is down or "
        "whose uplink is stale.",
        panels,
        [datasource_variable(), box_variable()],
    )


DASHBOARDS = {
    "edgemon-fleet.json": fleet,
    "edgemon-device.json": device,
    "edgemon-boxes.json": boxes,
}


def render(build: Any) -> str:
    """The committed text of one dashboard: stable key order, 2-space indent, final newline."""
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if a committed dashboard differs from the generated one",
    )
    parser.add_argument("--out", type=Path, default=HERE, help="directory (default: dashboards/)")
    args = parser.parse_args(argv)
    stale = []
    for name, build in DASHBOARDS.items():
        path = args.out / name
        text = render(build)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print(
            f"out of date: {', '.join(stale)}; run python dashboards/generate.py", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
