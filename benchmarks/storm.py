"""The underrun storm: what edgemon costs, and writes to its log, when the box struggles.

Run: `.venv/bin/python benchmarks/storm.py [--quick] [--rounds N]`. Through one real Mosquitto
started here on a free loopback port, with `python -m edgemon run` as a subprocess (the
write-ahead log on, `[log] level = "info"`, every other setting its default) and the load in
its own process, through one real `edgemon.client.Reporter` (default settings):

- **zero slack**: 64 streams × 12.5 chunks/s, each chunk 80 ms of audio every 80 ms, the player
  starting at the first chunk (no start event). The buffer runs dry as each chunk is due:
  every chunk begins an underrun, which the next one retracts (it reached the player at the
  instant the buffer ran dry) or confirms and ends (a little later). This is the state a
  struggling TTS engine puts its players in.
- **healthy**: the same streams with 2 s of prebuffer (a start event with `play_start_ms`
  2 s after it): no underrun at all.

For each scenario, over the same window: edgemon's CPU (utime + stime from /proc) as a share
of one core, against a bare aiomqtt subscriber (`ingest.py`'s, which only `json.loads`) that
receives the same messages in the same run, and the ratio; the lines edgemon wrote to its
log per second, by event; and the shortest time between two `device_summary` lines of the
device. Targets: ratio ≤ 2, ≤ 10 lines/s, a device summary at most every 5 s.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _support import Edgemon, JobProcess, cpu_seconds, http_get, mosquitto, samples
from ingest import EDGE, MOSQUITTO_OPTIONS, PREFIX, Bare

from edgemon.client import Reporter

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.synchronize import Event as MpEvent

STREAMS = 64
CHUNK_MS = 80.0  # audio per chunk, and time between a stream's chunks
PREBUFFER_MS = 2000.0  # the healthy scenario's
SUMMARY_EVERY_S = 5.0  # the target: a device summary at most this often
LINES_PER_S = 10.0  # the target: the whole log
CPU_RATIO = 2.0  # the target: edgemon ÷ bare subscriber


@dataclass(frozen=True, slots=True)
class Scale:
    """How long each scenario runs."""

    warm_s: float
    window_s: float


FULL = Scale(warm_s=3.0, window_s=20.0)
QUICK = Scale(warm_s=2.0, window_s=8.0)


# ---------------------------------------------------------------------------- the players
def players_main(port: int, conn: Connection, stop: MpEvent) -> None:
    """The load process: for each job (`prebuffer_ms`, a stream name prefix) from `conn`, 64
    streams of 80 ms chunks every 80 ms through one Reporter, until `stop`; then every stream
    ends and the Reporter's counts go back. `None` ends the process."""
    conn.send("ready")
    while (job := conn.recv()) is not None:
        conn.send(_play(port, stop, job["prebuffer_ms"], job["name"]))


def _play(port: int, stop: MpEvent, prebuffer_ms: float, name: str) -> dict[str, Any]:
    reporter = Reporter(
        f"mqtt://127.0.0.1:{port}", EDGE, topic_prefix=PREFIX, client_id=f"storm-{name}"
    ).open()
    streams = [f"{name}{i}" for i in range(STREAMS)]
    rate = STREAMS * 1000.0 / CHUNK_MS  # chunks per second, all streams
    start = time.perf_counter()
    sent = 0
    while not (sent % STREAMS == 0 and stop.is_set()):
        due = start + sent / rate
        now = time.perf_counter()
        if due > now:
            time.sleep(due - now)
        stream = streams[sent % STREAMS]
        if sent < STREAMS and prebuffer_ms:
            reporter.start(stream, play_start_ms=time.time() * 1000.0 + prebuffer_ms)
        reporter.chunk(stream, audio_ms=CHUNK_MS, eta_ms=CHUNK_MS)
        sent += 1
    elapsed = time.perf_counter() - start
    for stream in streams:
        reporter.end(stream)
    flushed = reporter.flush(30)
    stats = reporter.stats
    reporter.close()
    return {
        "chunks": sent,
        "seconds": elapsed,
        "messages": stats.messages,
        "dropped": stats.dropped,
        "flushed": flushed,
    }


class Players(JobProcess):
    """The main process's handle on the load process."""

    def __init__(self, port: int) -> None:
        super().__init__(players_main, port, name="players")
        self.ready()

    def begin(self, *, prebuffer_ms: float, name: str) -> None:
        """Start the streams."""
        self.send({"prebuffer_ms": prebuffer_ms, "name": name})

    def end(self) -> dict[str, Any]:
        """Stop and end the streams: what the Reporter sent."""
        self.stop.set()
        result: dict[str, Any] = self.result(60)
        return result


# ---------------------------------------------------------------------------- measuring
def _read_lines(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The JSON lines written to `path` after byte `offset`, and the new offset."""
    with path.open("rb") as log:
        log.seek(offset)
        data = log.read()
    complete = data[: data.rfind(b"\n") + 1]
    lines = []
    for raw in complete.splitlines():
        with contextlib.suppress(ValueError):
            lines.append(json.loads(raw))
    return lines, offset + len(complete)


def _wal_commits(edgemon: Edgemon) -> float:
    status, text = http_get(f"http://127.0.0.1:{edgemon.http_port}/metrics")
    if status != 200:
        raise RuntimeError(f"/metrics answered {status}")
    return sum(samples(text, "edgemon_wal_commit_seconds_count").values())


@dataclass(frozen=True, slots=True)
class Result:
    """One scenario's window."""

    name: str
    share: float
    bare_share: float
    lines_per_s: float
    events: Counter[str]
    summary_gap_s: float | None
    commits_per_s: float
    chunks_per_s: float
    messages_per_s: float
    dropped: int

    @property
    def ratio(self) -> float:
        """edgemon's CPU ÷ the bare subscriber's."""
        return self.share / self.bare_share

    def report(self) -> str:
        """The scenario's lines."""
        top = ", ".join(f"{event} {count}" for event, count in self.events.most_common(8))
        gap = "none" if self.summary_gap_s is None else f"{self.summary_gap_s:.1f} s"
        return (
            f"  {self.chunks_per_s:,.0f} chunks/s in {self.messages_per_s:,.0f} messages/s "
            f"({self.dropped} dropped); WAL commits {self.commits_per_s:,.0f}/s\n"
            f"  edgemon CPU {self.share:.2f} % of one core, bare subscriber {self.bare_share:.2f}"
            f" %: ratio {self.ratio:.2f}\n"
            f"  log: {self.lines_per_s:.1f} lines/s ({top or 'none'}); shortest time between "
            f"two device summaries: {gap}"
        )


def _summary_gap(lines: list[dict[str, Any]]) -> float | None:
    """The shortest time between two `device_summary` lines of the device, in seconds."""
    stamps = [
        datetime.fromisoformat(line["timestamp"]).timestamp()
        for line in lines
        if line.get("event") == "device_summary" and line.get("device") == EDGE
    ]
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return min(gaps) if gaps else None


def scenario(
    name: str,
    scale: Scale,
    players: Players,
    edgemon: Edgemon,
    bare: Bare,
    *,
    prebuffer_ms: float,
) -> Result:
    """Run one scenario and measure it over `scale.window_s` after `scale.warm_s`."""
    players.begin(prebuffer_ms=prebuffer_ms, name=name[0])
    time.sleep(scale.warm_s)
    _, offset = _read_lines(edgemon.log_path, 0)
    commits0 = _wal_commits(edgemon)
    cpu0, bare0, wall0 = edgemon.cpu(), cpu_seconds(bare.pid), time.perf_counter()
    time.sleep(scale.window_s)
    cpu1, bare1, wall1 = edgemon.cpu(), cpu_seconds(bare.pid), time.perf_counter()
    lines, _ = _read_lines(edgemon.log_path, offset)
    commits1 = _wal_commits(edgemon)
    sent = players.end()
    wall = wall1 - wall0
    return Result(
        name=name,
        share=(cpu1 - cpu0) / wall * 100.0,
        bare_share=(bare1 - bare0) / wall * 100.0,
        lines_per_s=len(lines) / wall,
        events=Counter(str(line.get("event")) for line in lines),
        summary_gap_s=_summary_gap(lines),
        commits_per_s=(commits1 - commits0) / wall,
        chunks_per_s=sent["chunks"] / sent["seconds"],
        messages_per_s=sent["messages"] / sent["seconds"],
        dropped=sent["dropped"],
    )


def main() -> None:
    """Measure and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="shorter windows")
    parser.add_argument("--rounds", type=int, default=1, help="runs of both scenarios")
    parser.add_argument(
        "--no-wal", action="store_true", help="`[state] wal = false` (the log's share, compared)"
    )
    parser.add_argument(
        "--only", choices=("zero", "healthy"), help="run one scenario only (e.g. to profile it)"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help="run edgemon under cProfile and write its stats to FILE (figures are then inflated)",
    )
    args = parser.parse_args()
    scale = QUICK if args.quick else FULL
    load = os.getloadavg()
    wal = "off" if args.no_wal else "on"
    print(
        f"edgemon underrun storm ({'quick' if args.quick else 'full'}: {scale.window_s:.0f} s "
        f"windows, write-ahead log {wal}), {os.cpu_count()} CPUs, load average {load[0]:.2f} "
        f"{load[1]:.2f} {load[2]:.2f}"
    )
    results: list[Result] = []
    with (
        tempfile.TemporaryDirectory(prefix="edgemon-storm-") as tmp,
        mosquitto(Path(tmp), options=MOSQUITTO_OPTIONS) as port,
    ):
        profile = args.profile and args.profile.resolve()
        edgemon = Edgemon(
            Path(tmp),
            port,
            log_level="info",
            profile=profile,
            config="wal = false\n" if args.no_wal else "",
        )
        bare = Bare(port)
        players = Players(port)
        try:
            bare.ready()
            edgemon.ready()
            for r in range(args.rounds):
                for name, prebuffer in (("zero slack", 0.0), ("healthy", PREBUFFER_MS)):
                    if args.only is not None and not name.startswith(args.only):
                        continue
                    result = scenario(
                        f"{name}", scale, players, edgemon, bare, prebuffer_ms=prebuffer
                    )
                    print(f"\nround {r + 1}, {name} (prebuffer {prebuffer:.0f} ms)")
                    print(result.report())
                    results.append(result)
        finally:
            players.close()
            bare.close()
            code = edgemon.close()
    load = os.getloadavg()
    print("\nSUMMARY (ratios against the bare subscriber of the same window)")
    for result in results:
        gap = result.summary_gap_s
        ok = (
            result.ratio <= CPU_RATIO
            and result.lines_per_s <= LINES_PER_S
            and (gap is None or gap >= SUMMARY_EVERY_S)
        )
        print(f"  {result.name:<11} CPU {result.share:5.2f} % vs bare {result.bare_share:5.2f} % "
              f"= {result.ratio:4.2f}× (target ≤ {CPU_RATIO:.0f}×), {result.lines_per_s:6.1f} "
              f"log lines/s (≤ {LINES_PER_S:.0f}), summary gap "
              f"{'none' if gap is None else f'{gap:.1f} s'} (≥ {SUMMARY_EVERY_S:.0f} s): "
              f"{'met' if ok else 'NOT MET'}")  # fmt: skip
    print(f"  edgemon exit code {code}; load average after {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
