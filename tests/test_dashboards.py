"""dashboards/: the committed JSON is what dashboards/generate.py produces, every panel is
described and has a unit, and every PromQL expression names only series that exist: metrics
edgemon exports (taken from a real exposition of a simulated fleet), series recorded by
deploy/prometheus/edgemon.rules.yml, and Prometheus' own `up`."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from edgemon.adapters.metrics import ConnectionState, EdgemonCollector
from edgemon.simulate import Simulation

from fleets import SimulatedFleet

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import ModuleType


ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = ROOT / "dashboards"
RULES = ROOT / "deploy" / "prometheus" / "edgemon.rules.yml"
GENERATE = DASHBOARDS / "generate.py"
FILES = ("edgemon-fleet.json", "edgemon-device.json", "edgemon-boxes.json")
#: Series Prometheus makes itself that a dashboard may use.
PROMETHEUS_SERIES = {"up"}


@pytest.fixture(scope="module")
def generate() -> ModuleType:
    """dashboards/generate.py imported as a module (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location("edgemon_dashboards_generate", GENERATE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load(name: str) -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads((DASHBOARDS / name).read_text(encoding="utf-8"))
    return dashboard


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel that is not a row, including those nested in collapsed rows."""
    for item in dashboard["panels"]:
        if item["type"] == "row":
            yield from item.get("panels", [])
        else:
            yield item


def exprs(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, expression) of every target of every panel."""
    for item in panels(dashboard):
        for query in item["targets"]:
            yield item["title"], query["expr"]


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w.$])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "group_left", "group_right", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression selects: identifiers left once strings, label
    matchers, ranges and grouping clauses are removed, less functions (followed by `(`) and
    keywords."""
    for pattern in (_STRINGS, _MATCHERS, _RANGES, _GROUPING):
        expr = pattern.sub(" ", expr)
    return {
        match.group(1)
        for match in _IDENTIFIER.finditer(expr)
        if match.group(2) is None and match.group(1).lower() not in _KEYWORDS
    }


def test_metric_names_reads_promql() -> None:
    """The name extractor finds series names and skips functions, labels, ranges, variables
    and keywords."""
    expr = (
        'histogram_quantile(0.9, sum by (le) (rate(edgemon_chunk_gap_seconds_bucket{device="$d"}'
        "[$__rate_interval]))) / on (device) group_left device:x:rate5m * 60 "
        'and up{job="edgemon"} > bool 1e3'
    )
    assert metric_names(expr) == {"edgemon_chunk_gap_seconds_bucket", "device:x:rate5m", "up"}


def exported_names() -> set[str]:
    """Every sample name in a real exposition of a Monitor fed a simulated fleet (one healthy,
    one overloaded device, engine objects, live streams at the scrape), checked complete
    against the families the collector declares."""
    fleet = SimulatedFleet(
        Simulation(devices=2, streams=2, rtf=[0.1, 1.2], stall_rate=0.0, seed=1, start_ms=0),
        0.0,
        per_stream_series=20,
    )
    for _ in fleet.feed(20_000.0):
        pass
    monitor, registry = fleet.monitor, fleet.registry
    text = generate_latest(registry).decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    collector = EdgemonCollector(
        monitor, wall_clock=lambda: 0.0, connection=ConnectionState(), per_stream_series=20
    )
    declared = {family.name for family in collector.describe()}
    missing = declared - families.keys()
    assert not missing, f"the simulated fleet did not produce {sorted(missing)}"
    return {sample.name for family in families.values() for sample in family.samples}


def recorded_names() -> dict[str, str]:
    """The series the recording rules define, with their expressions."""
    text = RULES.read_text(encoding="utf-8")
    found = re.findall(r"- record: (\S+)\n\s+expr: (\|\n(?:\s{10,}.*\n)+|.*\n)", text)
    return {name: expr.removeprefix("|") for name, expr in found}


def test_committed_json_is_generated(generate: ModuleType) -> None:
    """Each committed dashboard is byte for byte what generate.py renders."""
    for name, build in generate.DASHBOARDS.items():
        assert (DASHBOARDS / name).read_text(encoding="utf-8") == generate.render(build), name
    assert set(generate.DASHBOARDS) == set(FILES)


@pytest.mark.integration  # starts a process
def test_generate_check_flags_stale_json(tmp_path: Path) -> None:
    """`generate.py --check` exits 0 on the repository and 1 when a file differs; without
    --check it writes the files that --check then accepts."""
    check = [sys.executable, str(GENERATE), "--check"]
    assert subprocess.run(check, capture_output=True, check=False).returncode == 0
    subprocess.run([sys.executable, str(GENERATE), "--out", str(tmp_path)], check=True)
    assert subprocess.run([*check, "--out", str(tmp_path)], check=False).returncode == 0
    stale = tmp_path / FILES[0]
    stale.write_text(stale.read_text(encoding="utf-8").replace("Fleet", "Flet"), encoding="utf-8")
    done = subprocess.run([*check, "--out", str(tmp_path)], capture_output=True, check=False)
    assert done.returncode == 1
    assert FILES[0] in done.stderr.decode()


@pytest.mark.parametrize("name", FILES)
def test_dashboard_metadata(name: str) -> None:
    """Stable uid, the `datasource` variable and the `device` variable (the `box` variable on
    the boxes dashboard), every panel on the datasource variable with a description and a
    unit, ids unique."""
    dashboard = load(name)
    assert dashboard["uid"] == name.removesuffix(".json")
    assert dashboard["id"] is None
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    if name == "edgemon-boxes.json":
        assert variables["box"]["definition"] == 'label_values(up{job="edgemon"}, box)'
        assert variables["box"]["multi"]
    else:
        assert variables["device"]["definition"] == "label_values(edgemon_streams_active, device)"
    ids = [item["id"] for item in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for item in panels(dashboard):
        title = item["title"]
        assert item["description"].strip(), f"{title}: no description"
        assert item["fieldConfig"]["defaults"].get("unit"), f"{title}: no unit"
        assert item["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
        assert item["targets"], f"{title}: no query"
        for query in item["targets"]:
            assert query["datasource"]["uid"] == "${datasource}", title


def test_required_panels_exist() -> None:
    """The required panels: fleet (headroom, slack, throttle timeline, underruns,
    streams, rejections, broker, KV table) and device (slack heatmap, percentiles, worst
    streams, clock offset); and on the boxes dashboard (worst boxes by
    underrun and throttle, KV admission, down or stale), each query filtered by `$box` and
    kept per box."""
    fleet = {item["title"]: item["type"] for item in panels(load("edgemon-fleet.json"))}
    device = {item["title"]: item["type"] for item in panels(load("edgemon-device.json"))}
    assert fleet["Throttle state"] == "state-timeline"
    assert fleet["KV cache admission"] == "table"
    for title in (
        "Worst headroom per device",
        "Worst playback slack per device",
        "Underruns per minute",
        "Time in underrun",
        "Streams active",
        "Streams at risk",
        "Input rejections by reason",
        "Broker connection and scrape",
    ):
        assert title in fleet
    assert device["Slack at chunk arrival"] == "heatmap"
    assert device["Good streams"] == "timeseries"  # the service level (docs/semantics.md)
    assert device["Longest gap per stream"] == "heatmap"
    boxes = {item["title"]: item for item in panels(load("edgemon-boxes.json"))}
    for title in (
        "Worst boxes by time in underrun",
        "Worst boxes by throttle share",
        "Boxes whose KV admission would preempt",
        "Boxes down or stale",
        "edgemon up per box",
        "Seconds since each box's last sample",
    ):
        assert title in boxes
    for item in boxes.values():
        for query in item["targets"]:
            assert 'box=~"$box"' in query["expr"], (item["title"], query["expr"])
            assert "by (box)" in query["expr"], (item["title"], query["expr"])
    for title in (
        "Chunk gap percentiles",
        "Time to first audio percentiles",
        "Headroom of the worst streams",
        "Device clock offset",
    ):
        assert title in device


def test_expressions_use_only_existing_series() -> None:
    """Every name a dashboard expression selects is exported by edgemon, recorded by the
    shipped rules, or `up`; and the recording rules themselves select only exported names."""
    exported = exported_names()
    recorded = recorded_names()
    assert len(recorded) >= 5
    for name, expr in recorded.items():
        unknown = metric_names(expr) - exported
        assert not unknown, f"recording rule {name} uses {sorted(unknown)}"
    known = exported | recorded.keys() | PROMETHEUS_SERIES
    used: set[str] = set()
    for name in FILES:
        for title, expr in exprs(load(name)):
            names = metric_names(expr)
            assert names, f"{name} / {title}: no series in {expr!r}"
            assert names <= known, f"{name} / {title}: {sorted(names - known)} do not exist"
            used |= names
    assert {"edgemon_stream_headroom_seconds", "edgemon_slack_at_arrival_seconds_bucket"} <= used
