"""A fleet's cost: series and remote-write bytes per box, the central store per 1,000 boxes.

Run: `.venv/bin/python benchmarks/fleet_cost.py [--seconds S] [--synthetic-boxes N]`
(`make bench-fleet`). Real programs only, all on loopback ports, all ended at the end:

1. Three boxes, each a Mosquitto, `edgemon run` and `edgemon simulate` (one device; 1, 16 and
   64 concurrent streams at RTF 0.1), with two Prometheus agents each, both on the shipped
   deploy/fleet/box/prometheus.yml and box/prometheus.default flags (scrapes every 1 s instead
   of 15 s, so that S seconds hold 15·S seconds' worth of samples): agent A as shipped
   (per-stream series dropped) writing to a real VictoriaMetrics (shipped flags), agent B
   without the drop rule writing to a sink that counts and discards.
   - series per box = the sample lines of edgemon's /metrics (the most seen over the run),
     with and without `edgemon_stream_*`, plus the 5 series every scrape adds (`up`, ...);
   - remote-write bytes per sample, from each agent's `prometheus_remote_storage_bytes_total`
     (compressed payload) / `prometheus_remote_storage_samples_total`; bytes per second per
     box at the shipped 15 s interval = series × bytes per sample / 15.
2. The central store after that three-box run: resident memory over its idle baseline per
   active series, and disk (its data directory after a forced flush) per stored sample.
3. The same store fed N synthetic boxes (the 16-stream box's series under N `box` names,
   `--rounds` scrapes of history 15 s apart carrying the values the real box had, second by
   second, through /api/v1/import/prometheus) to see how memory and disk grow with boxes,
   well beyond three.
4. Extrapolated per 1,000 boxes of 16 streams: ingestion rate, active series, memory (from
   the synthetic slope), disk per day and per 90 days (from the synthetic bytes per sample).

Figures of one run (2026-11-30, this 2-core machine, default flags) are in docs/fleet.md.

The doubts are printed with the figures: a short run compresses worse than hours of data (VM
merges parts in the background; its bytes per sample fall with time), synthetic boxes replay
one real box's values but not its churn, and RSS includes caches VictoriaMetrics sizes from the
machine's memory (-memory.allowedPercent) and garbage the Go runtime has not collected yet.
"""

from __future__ import annotations

import argparse
import http.server
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from _support import ROOT, Edgemon, http_get, mosquitto, rss_bytes, samples, stop

from brokers import free_port

FLEET = ROOT / "deploy" / "fleet"
STREAMS = (1, 16, 64)
TYPICAL = 16
SCRAPE_SERIES = 5  # up, scrape_duration_seconds, scrape_samples_scraped,
# scrape_samples_post_metric_relabeling, scrape_series_added
SHIPPED_INTERVAL_S = 15
RETENTION_DAYS = 90


class Sink(http.server.ThreadingHTTPServer):
    """A remote-write endpoint that counts request bytes and answers 204."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _SinkHandler)
        self.bytes = 0
        self.lock = threading.Lock()


class _SinkHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        server = self.server
        assert isinstance(server, Sink)
        with server.lock:
            server.bytes += length
        self.send_response(204)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        return


def shipped_args(name: str, overrides: dict[str, str]) -> list[str]:
    """ARGS of a shipped /etc/default file, flags named in `overrides` replaced."""
    text = (FLEET / name).read_text(encoding="utf-8")
    match = re.search(r'^ARGS="(.*)"$', text, flags=re.MULTILINE)
    assert match is not None
    args = []
    for arg in shlex.split(match.group(1)):
        flag = arg.split("=", 1)[0]
        args.append(f"{flag}={overrides.pop(flag)}" if flag in overrides else arg)
    assert not overrides, f"{name} lacks {overrides}"
    return args


def agent_config(edgemon_port: int, write_url: str, *, drop_streams: bool) -> str:
    text = (FLEET / "box" / "prometheus.yml").read_text(encoding="utf-8")
    for old, new in (
        ("scrape_interval: 15s", "scrape_interval: 1s"),
        ("scrape_timeout: 10s", "scrape_timeout: 900ms"),
        ('"localhost:9857"', f'"127.0.0.1:{edgemon_port}"'),
        ("https://metrics.example.net/api/v1/write", write_url),
        ("batch_send_deadline: 5s", "batch_send_deadline: 1s"),
    ):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    if not drop_streams:
        rule = "      - source_labels: [__name__]\n        regex: edgemon_stream_.*\n"
        rule += "        action: drop\n"
        assert text.count(rule) == 1
        text = text.replace(rule, "").replace(
            "metric_relabel_configs:", "metric_relabel_configs: []"
        )
    return text


def start(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)


def wait_ok(url: str, process: subprocess.Popen[bytes], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while http_get(url, 1)[0] != 200:
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up")
        time.sleep(0.1)


def exposition_counts(edgemon: Edgemon) -> tuple[int, int, int, str]:
    """(sample lines, those without edgemon_stream_*, those of them with a `device` label,
    the page without edgemon_stream_*)."""
    status, text = http_get(f"http://127.0.0.1:{edgemon.http_port}/metrics")
    assert status == 200
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    kept = [line for line in lines if not line.startswith("edgemon_stream_")]
    per_device = sum('device="' in line for line in kept)
    return len(lines), len(kept), per_device, "\n".join(kept)


def metric_sum(text: str, name: str, label: str = "") -> float:
    return sum(value for labels, value in samples(text, name).items() if label in labels)


class Store:
    """The central VictoriaMetrics: its process, URL and data directory."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data = directory / "vm"
        args = shipped_args(
            "central/victoria-metrics.default",
            {
                "-storageDataPath": str(self.data),
                "-httpListenAddr": f"127.0.0.1:{self.port}",
                "-selfScrapeInterval": "0s",  # its own series would blur the count
            },
        )
        self.process = start(["victoria-metrics", *args], directory / "vm.log")
        wait_ok(f"{self.url}/health", self.process, "victoria-metrics")

    def flushed(self) -> dict[str, float]:
        """Force a flush, then: RSS, disk bytes (the data directory, its samples' part, its
        index part), stored samples, series created so far."""
        urllib.request.urlopen(f"{self.url}/internal/force_flush", timeout=30).read()
        time.sleep(2)
        _, text = http_get(f"{self.url}/metrics")
        disk = sum(f.stat().st_size for f in self.data.rglob("*") if f.is_file())
        return {
            "rss": rss_bytes(self.process.pid),
            "disk": disk,
            "data": metric_sum(text, "vm_data_size_bytes", 'type="storage/'),
            "index": metric_sum(text, "vm_data_size_bytes", 'type="indexdb'),
            "rows": metric_sum(text, "vm_rows", 'type="storage/'),
            "series": metric_sum(text, "vm_new_timeseries_created_total"),
        }


def parse(page: str) -> list[tuple[str, str, str]]:
    """(name, labels followed by a comma or empty, value) of each sample line, plus the series
    a scrape adds."""
    lines = []
    for line in page.splitlines():
        series, value = line.rsplit(" ", 1)
        name, _, labels = series.removesuffix("}").partition("{")
        lines.append((name, f"{labels}," if labels else "", value))
    lines += [(n, 'job="edgemon",', "1") for n in ("up", "scrape_duration_seconds",
              "scrape_samples_scraped", "scrape_samples_post_metric_relabeling",
              "scrape_series_added")]  # fmt: skip
    return lines


def synthetic(store: Store, pages: list[str], boxes: int, rounds: int) -> None:
    """`boxes` copies of one box's series (`box="syn-<n>"`), `rounds` scrapes 15 s apart ending
    now, imported as Prometheus text with timestamps. Round r carries the values of the real
    page r (cycling), so counters rise and gauges move as on the real box."""
    parsed = [parse(page) for page in pages]
    now_ms = int(time.time() * 1000)
    for r in range(rounds):
        t = now_ms - (rounds - r) * SHIPPED_INTERVAL_S * 1000
        lines = parsed[r % len(parsed)]
        body = "\n".join(
            f'{name}{{{labels}box="syn-{b}"}} {value} {t}'
            for b in range(boxes)
            for name, labels, value in lines
        )
        request = urllib.request.Request(
            f"{store.url}/api/v1/import/prometheus", data=body.encode(), method="POST"
        )
        urllib.request.urlopen(request, timeout=120).read()


@dataclass(slots=True)
class BoxRun:
    """One real box of the run: its edgemon, its two agents' web ports, what was seen."""

    streams: int
    directory: Path
    edgemon: Edgemon
    agents: dict[str, int] = field(default_factory=dict)
    series_all: int = 0  # sample lines of /metrics, the most seen
    series_kept: int = 0  # of them, without edgemon_stream_*
    series_device: int = 0  # of those kept, with a `device` label


def start_box(stack: ExitStack, root: Path, streams: int, store: Store, sink: Sink) -> BoxRun:
    """Mosquitto, edgemon, the simulator and the two agents of one box, ended by `stack`."""
    box = root / f"s{streams}"
    box.mkdir()
    port = stack.enter_context(mosquitto(box))
    edgemon = Edgemon(box, port)
    stack.callback(edgemon.close)
    edgemon.ready()
    simulate = start(
        [sys.executable, "-m", "edgemon", "simulate", "--broker", f"mqtt://127.0.0.1:{port}",
         "--devices", "1", "--streams", str(streams), "--rtf", "0.1", "--seed", "1"],
        box / "simulate.log",
    )  # fmt: skip
    stack.callback(stop, simulate)
    run = BoxRun(streams, box, edgemon)
    for kind, url, drop in (
        ("shipped", f"{store.url}/api/v1/write", True),
        ("per-stream", f"http://127.0.0.1:{sink.server_address[1]}/api/v1/write", False),
    ):
        config = box / f"agent-{kind}.yml"
        config.write_text(agent_config(edgemon.http_port, url, drop_streams=drop), "utf-8")
        web = free_port()
        flags = {
            "--config.file": str(config),
            "--storage.agent.path": str(box / f"wal-{kind}"),
            "--web.listen-address": f"127.0.0.1:{web}",
        }
        argv = ["prometheus", *shipped_args("box/prometheus.default", flags), "--log.level=warn"]
        agent = start(argv, box / f"agent-{kind}.log", env={"EDGEMON_BOX": f"s{streams}"})
        stack.callback(stop, agent)
        wait_ok(f"http://127.0.0.1:{web}/-/ready", agent, f"agent {kind}")
        run.agents[kind] = web
    return run


def observe(boxes: list[BoxRun], seconds: float) -> list[str]:
    """Scrape each edgemon once a second for `seconds`, keeping the largest series counts;
    the typical box's pages without per-stream series, one a second."""
    pages = []
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        for run in boxes:
            total, kept, per_device, page = exposition_counts(run.edgemon)
            if total >= run.series_all:
                run.series_all, run.series_kept, run.series_device = total, kept, per_device
            if run.streams == TYPICAL:
                pages.append(page)
        time.sleep(1)
    return pages


def report_boxes(boxes: list[BoxRun], seconds: float) -> dict[int, tuple[int, float]]:
    """Print series, remote-write and WAL bytes per box; (series sent, wire bytes per sample)
    of each box as shipped."""
    print(f"1. series per box and remote-write bytes (one device; {seconds:.0f} s at 1 s "
          "scrapes; bytes at the shipped 15 s interval)")  # fmt: skip
    print(f"{'streams':>8} {'series':>7} {'B/sample':>9} {'B/s':>7} | {'series':>7} "
          f"{'B/sample':>9} {'B/s':>7}   "
          "(shipped: per-stream dropped | with per-stream)")  # fmt: skip
    shipped: dict[int, tuple[int, float]] = {}
    wal: dict[int, float] = {}
    for run in boxes:
        figures = []
        for kind, series in (("shipped", run.series_kept), ("per-stream", run.series_all)):
            _, text = http_get(f"http://127.0.0.1:{run.agents[kind]}/metrics")
            sent = metric_sum(text, "prometheus_remote_storage_samples_total")
            wire = metric_sum(text, "prometheus_remote_storage_bytes_total")
            n = series + SCRAPE_SERIES
            per_sample = wire / sent if sent else float("nan")
            figures.append((n, per_sample, n * per_sample / SHIPPED_INTERVAL_S))
            if kind == "shipped":
                files = (run.directory / "wal-shipped").rglob("*")
                wal[run.streams] = sum(f.stat().st_size for f in files if f.is_file()) / sent
        shipped[run.streams] = figures[0][:2]
        print(
            f"{run.streams:>8} " + " | ".join(f"{n:>7} {b:>9.2f} {r:>7.1f}" for n, b, r in figures)
        )
    typical = next(run for run in boxes if run.streams == TYPICAL)
    print(f"   of the {shipped[TYPICAL][0]} series of a {TYPICAL}-stream box, "
          f"{typical.series_device} are per device (a second device adds as many), the rest "
          "per box (edgemon's own, process, scrape)")  # fmt: skip
    print("   the agent's WAL (compressed, as shipped) per hour of uplink outage at 15 s: "
          + ", ".join(f"{s} streams {shipped[s][0] * 240 * b / 1e6:.2f} MB ({b:.1f} B/sample)"
                      for s, b in wal.items()))  # fmt: skip
    return shipped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60, help="the three-box run (default 60)")
    parser.add_argument("--synthetic-boxes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=120, help="synthetic scrapes per box")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleet-cost-") as tmp, ExitStack() as stack:
        root = Path(tmp)
        store = Store(root)
        stack.callback(stop, store.process)
        time.sleep(3)
        baseline = store.flushed()
        sink = Sink()
        threading.Thread(target=sink.serve_forever, daemon=True).start()
        stack.callback(sink.shutdown)
        boxes = [start_box(stack, root, streams, store, sink) for streams in STREAMS]
        pages = observe(boxes, args.seconds)
        per_box = report_boxes(boxes, args.seconds)
        three = store.flushed()
        active = three["series"] - baseline["series"]
        rss_per_series = (three["rss"] - baseline["rss"]) / active
        disk_per_sample = three["disk"] / three["rows"]
        print(f"\n2. central VictoriaMetrics after the three-box run: {active:.0f} active series, "
              f"{three['rows']:.0f} samples; RSS {baseline['rss'] / 2**20:.0f} MiB idle → "
              f"{three['rss'] / 2**20:.0f} MiB ({rss_per_series:.0f} B per series); disk "
              f"{three['disk'] / 2**20:.1f} MiB ({disk_per_sample:.2f} B per sample)")  # fmt: skip
        synthetic(store, pages, args.synthetic_boxes, args.rounds)
        big = store.flushed()
        added_series = big["series"] - three["series"]
        rss_per_box = (big["rss"] - three["rss"]) / args.synthetic_boxes
        added_rows = big["rows"] - three["rows"]
        data_per_sample = (big["data"] - three["data"]) / added_rows
        index_per_series = (big["index"] - three["index"]) / added_series
        print(f"\n3. + {args.synthetic_boxes} synthetic {TYPICAL}-stream boxes × {args.rounds} "
              f"scrapes: +{added_series:.0f} series, +{added_rows:.0f} samples; RSS "
              f"{big['rss'] / 2**20:.0f} MiB (+{rss_per_box / 2**10:.0f} KiB per box, "
              f"{(big['rss'] - three['rss']) / added_series:.0f} B per series); disk "
              f"+{(big['disk'] - three['disk']) / 2**20:.1f} MiB: samples "
              f"{data_per_sample:.2f} B each, index {index_per_series:.0f} B per series"
        )  # fmt: skip
        series, wire_per_sample = per_box[TYPICAL]
        samples_per_s = 1000 * series / SHIPPED_INTERVAL_S
        # VictoriaMetrics indexes each series once per day it has samples (its per-day index).
        day = samples_per_s * 86400 * data_per_sample + 1000 * series * index_per_series
        print(f"\n4. per 1,000 boxes of {TYPICAL} streams at 15 s (extrapolated): "
              f"{1000 * series:,} active series, {samples_per_s:,.0f} samples/s, "
              f"{samples_per_s * wire_per_sample / 1e3:,.0f} kB/s remote write in; memory "
              f"≈ {baseline['rss'] / 2**20 + 1000 * rss_per_box / 2**20:,.0f} MiB (idle + "
              f"1,000 × the synthetic per-box slope); disk ≈ {day / 2**30:.2f} GiB/day "
              f"(samples × {data_per_sample:.2f} B + series × {index_per_series:.0f} B of "
              f"index), {RETENTION_DAYS * day / 2**30:.0f} GiB for {RETENTION_DAYS} days"
        )  # fmt: skip
        print("   doubts: short runs compress worse than VictoriaMetrics' merged steady state "
              "(disk is an upper bound); synthetic boxes replay one real box's values and have no "
              "churn; RSS includes caches sized from this machine's memory and garbage the Go "
              "runtime has not collected yet.")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
