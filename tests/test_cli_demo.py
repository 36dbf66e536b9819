"""`edgemon demo` end to end (a subprocess, not a terminal) and the shared terminal view."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest
from rich.console import Console

from edgemon.adapters.http import streams_view
from edgemon.cli import demo_loop
from edgemon.cli.main import main
from edgemon.engine import EngineConfig
from edgemon.monitor import Monitor
from edgemon.simulate.players import Score
from edgemon.simulate.profiles import JETSON, X86_GPU
from edgemon.view import DeviceTotals, ViewError, render_view, status_line
from edgemon.view.render import VIEW_COLUMNS

from load import MachineLag

if TYPE_CHECKING:
    from pathlib import Path

    from edgemon.engine.outputs import Output

#: With the demo's defaults (RTF 0.15 for sim-0, 1.1 for sim-1, stall rate 0.01) this seed
#: lets sim-1 underrun about 2.4 s in, with a chunk 135 ms late, while sim-0's chunks all
#: arrive at least 51 ms before its player needs them (found by running the simulator model
#: through the engine on a virtual clock): both outcomes hold with room for loopback jitter.
SEED = "221"
DEMO_TIMEOUT_S = 40.0


def chunk(stream: str, t: float, seq: int, audio: float, **extra: Any) -> dict[str, Any]:
    return {"type": "chunk", "stream": stream, "t_ms": t, "seq": seq, "audio_ms": audio} | extra


def fed_monitor() -> tuple[Monitor, float]:
    """`box-a` throttled (stream `hot` at risk), `box-b` healthy (stream `calm`); wall ms."""
    monitor = Monitor(EngineConfig())
    out: list[Output] = []
    t = 1_000_000.0
    sends = [
        ("box-a", chunk("hot", t, 0, 100, eta_ms=400)),
        ("box-b", chunk("calm", t, 0, 3000, eta_ms=200)),
        ("box-b", chunk("done", t, 0, 2000, final=True)),
    ]
    for device, event in sends:
        monitor.handle(f"edgemon/v1/{device}/events", json.dumps(event).encode(), t, out)
    monitor.advance(t + 50, out)
    return monitor, t + 50


def fits(text: str) -> None:
    """Every line of a frame fits `VIEW_COLUMNS`, and no header or cell was cut short."""
    assert max(len(line) for line in text.splitlines()) <= VIEW_COLUMNS
    assert "…" not in text


def test_view_shows_devices_throttle_state_and_streams() -> None:
    """A frame from a real `streams_view`, drawn at 100 columns, names every device, shows
    box-a throttled and box-b not, lists the stream ids with the at-risk one first, uses the
    given totals, and has every column's header whole."""
    monitor, wall = fed_monitor()
    view = streams_view(monitor, wall)
    console = Console(record=True, width=VIEW_COLUMNS)
    console.print(
        render_view(
            view,
            title="edgemon test",
            totals={"box-a": DeviceTotals(underruns=7, throttle_engagements=3)},
            labels={"box-b": "RTF 0.15"},
        )
    )
    text = console.export_text()
    lines = text.splitlines()
    assert lines[0].startswith("edgemon test")
    [row_a] = [line for line in lines if "box-a" in line and "ON" in line]
    assert "7" in row_a
    assert "3" in row_a
    [row_b] = [line for line in lines if "box-b RTF 0.15" in line]
    assert "off" in row_b
    streams = [line for line in lines if any(s in line for s in ("hot", "calm", "done"))]
    assert ["hot" in streams[0], "calm" in streams[1], "done" in streams[2]] == [True] * 3
    assert "AT RISK" in streams[0]
    assert "draining" in streams[2]
    headers = ("throttle", "margin", "streams", "at risk", "underruns", "engaged", "headroom")
    assert all(header in text for header in headers)
    fits(text)


def test_view_caps_the_stream_rows_and_says_how_many_are_left_out() -> None:
    """With `max_streams=1` only the lowest-headroom stream is listed, then `… 2 more`."""
    monitor, wall = fed_monitor()
    console = Console(record=True, width=VIEW_COLUMNS)
    console.print(render_view(streams_view(monitor, wall), title="t", max_streams=1))
    text = console.export_text()
    assert "hot" in text
    assert "calm" not in text
    assert "… 2 more streams" in text


def test_view_shows_what_each_engine_does_with_prefills() -> None:
    """With `prefills`, the devices table gets a column: held, admitting, or an engine that
    is not gated by the throttle, still within 100 columns with a labelled device; the status
    line carries the same word."""
    monitor, wall = fed_monitor()
    view = streams_view(monitor, wall)
    console = Console(record=True, width=VIEW_COLUMNS)
    prefills = {"box-a": "held", "box-b": "ignored"}
    labels = {"box-a": "RTF 0.15", "box-b": "RTF 0.15"}
    console.print(render_view(view, title="t", prefills=prefills, labels=labels))
    text = console.export_text()
    lines = text.splitlines()
    assert any("prefills" in line for line in lines)
    [row_a] = [line for line in lines if "box-a" in line and "ON" in line]
    assert "■ held" in row_a
    [row_b] = [line for line in lines if "box-b" in line and "off" in line]
    assert "not gated" in row_b
    fits(text)
    line = status_line(view, prefills={"box-a": "held"})
    assert line.startswith("box-a THROTTLED streams=1 at_risk=1 underruns=0 prefills=held | ")
    assert "box-b ok streams=2 at_risk=0 underruns=0" in line
    assert line.count("prefills=") == 1


def test_status_line_is_one_line_per_frame() -> None:
    """Without a terminal a frame is one line: each device, its throttle state and counts."""
    monitor, wall = fed_monitor()
    line = status_line(streams_view(monitor, wall))
    assert line == (
        "box-a THROTTLED streams=1 at_risk=1 underruns=0 | box-b ok streams=2 at_risk=0 underruns=0"
    )


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"devices": {}},
        {"devices": [{"name": "x"}]},
        {"devices": [{"device": "d", "streams": 3}]},
    ],
    ids=["not-an-object", "devices-not-a-list", "no-device-name", "streams-not-a-list"],
)
def test_view_rejects_what_is_not_a_streams_body(body: Any) -> None:
    """A body of the wrong shape is a `ViewError` naming the problem, not a KeyError."""
    with pytest.raises(ViewError):
        render_view(body, title="t")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--duration", "0"], "--duration"),
        (["--devices", "0"], "--devices"),
        (["--streams", "100000"], "--streams"),
        (["--listen", "nowhere"], "--listen"),
        (["--stall-rate", "2"], "--stall-rate"),
        (["--load", "0"], "--load"),
        (["--load", "nan"], "--load"),
        (["--profile", "nope"], "--profile"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every bad flag is refused before anything starts: exit 2, one line naming it."""
    assert main(["demo", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("edgemon demo: ")
    assert message in err


@pytest.mark.integration  # starts a process
def test_demo_runs_stops_and_summarises(tmp_path: Path) -> None:
    """Not on a terminal, a 7 s demo prints status lines and a summary, then exits 0: the
    overloaded device (RTF 1.1) underran and throttled, the healthy one neither underran nor
    throttled (its players prebuffer past the margin; the demo runs in real time, so each time
    this machine stalled a separate process may have cost each stream one underrun and the
    device one engagement, and no more), nothing was rejected, and the last line is JSON with the
    streams, underruns and the /metrics URL. (7 s: the overloaded device's players prebuffer
    past the margin too, so its first underrun comes 4-5 s in.)"""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    command = [sys.executable, "-m", "edgemon", "demo", "--duration", "7", "--devices", "2"]
    command += ["--streams", "2", "--listen", "127.0.0.1:0", "--seed", SEED]
    began = time.monotonic()
    with MachineLag() as lag:
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=DEMO_TIMEOUT_S, check=False
        )
    took = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    summary = json.loads(lines[-1])
    assert summary["kind"] == "summary"
    assert summary["rtf"] == {"sim-0": 0.15, "sim-1": 1.1}
    assert summary["underruns"]["sim-1"] > 0
    assert summary["streams"] >= 2
    assert summary["rejected"] == 0
    assert summary["throttle_engagements"]["sim-1"] >= 1
    url = summary["metrics_url"]
    assert url.startswith("http://127.0.0.1:")
    assert url.endswith("/metrics")
    assert not url.endswith(":0/metrics")
    assert any("sim-1 THROTTLED" in line for line in lines[:-1])  # a status line
    assert any(f"served at {url}" in line for line in lines)
    assert any("underruns" in line for line in lines[:-1])
    assert str(tmp_path) in summary["log"]
    assert took >= 7.0  # it ran its duration (a loaded machine only makes it longer)
    # The loop: three engines served the same seeded requests, each its policy; players
    # reported through real Reporters (edgemon saw their streams), and the status lines say
    # what each engine does with prefills.
    loop = summary["loop"]
    assert loop["profile"] == "jetson"
    assert loop["policies"] == {
        "loop-open": "open",
        "loop-static": "queued:12:12",
        "loop-edgemon": "edgemon",
    }
    boxes = ("loop-open", "loop-static", "loop-edgemon")
    assert len({loop[device]["requests"] for device in boxes}) == 1
    assert loop["loop-open"]["requests"] > 0
    for device in boxes:
        box = loop[device]
        outcomes = sum(box[k] for k in ("good", "late", "gappy", "shed", "unfinished"))
        assert outcomes == box["offered"] == box["requests"]
        assert box["goodput"] == pytest.approx(box["good"] / box["offered"], abs=1e-4)
        assert summary["streams_by_device"][device] > 0
    assert any(line.startswith("  goodput: the share of requests") for line in lines)
    assert any(line.startswith("  edgemon against vLLM's own flags") for line in lines)
    assert any(
        "loop-edgemon" in line and ("prefills=admitting" in line or "prefills=held" in line)
        for line in lines[:-1]
    )
    assert any(line.startswith("  the loop, same requests") for line in lines)
    # The summary for people fits the live view's width (the log's path aside).
    [start] = [i for i, line in enumerate(lines) if re.match(r"edgemon demo: [\d.]+ s, seed", line)]
    people = [line for line in lines[start:-1] if not line.startswith("  daemon log: ")]
    assert len(people) > 10
    assert max(len(line) for line in people) <= VIEW_COLUMNS
    # The healthy device (RTF 0.15, seconds of audio ahead) has no underrun in real time but
    # where this machine stalled the demo's process (2 streams).
    assert summary["underruns"]["sim-0"] <= 2 * lag.stalls, (summary, lag.oversleeps_s)
    assert summary["throttle_engagements"]["sim-0"] <= lag.stalls, (summary, lag.oversleeps_s)


def test_the_summary_says_what_edgemon_adds_over_vllms_own_flags() -> None:
    """Each box's goodput and policy in a line, and the verdict: edgemon's goodput against
    the static configuration's, in points, for this seed."""
    plan = demo_loop.LoopPlan(profile=JETSON, load=1.0, seed=7)

    def score(good: int) -> Score:
        return Score(
            requests=100, streams=100, completed=100, stream_minutes=10.0, underruns=0,
            underrun_s=0.0, ttfa_p50_ms=1.0, ttfa_p99_ms=1.0, good=good, gappy=100 - good,
        )  # fmt: skip

    scores = {"loop-open": score(40), "loop-static": score(70), "loop-edgemon": score(78)}
    lines = demo_loop.summary_lines(plan, scores, held_s=0.0)
    assert any("loop-static" in line and "--max-num-queued-reqs 12" in line for line in lines)
    assert lines[-1] == (
        "  edgemon against vLLM's own flags: goodput 70% → 78% (+8 points) for this seed"
    )
    held = demo_loop.summary_lines(plan, scores, held_s=12.3)
    assert held[-2:] == ["  edgemon's gate held admissions 12.3 s", lines[-1]]


def test_the_loops_summary_fits_100_columns() -> None:
    """Every line of the loop's summary fits the live view's 100 columns, with a 10-digit
    seed, the largest profile's flags and a held gate."""
    plan = demo_loop.LoopPlan(profile=X86_GPU, load=1.2, seed=4_294_967_295)
    score = Score(
        requests=100_000, streams=100_000, completed=100_000, stream_minutes=10.0,
        underruns=0, underrun_s=0.0, ttfa_p50_ms=1.0, ttfa_p99_ms=99_999.0, good=100_000,
        gappy=0,
    )  # fmt: skip
    lines = demo_loop.summary_lines(plan, dict.fromkeys(demo_loop.DEVICES, score), 999.9)
    assert any(line.startswith("  loop-edgemon") for line in lines)
    assert max(len(line) for line in lines) <= VIEW_COLUMNS
