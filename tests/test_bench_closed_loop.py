"""`benchmarks/closed_loop.py --virtual`: its JSON contract, its flags, its dump.

Short runs of the virtual loop in this venv (no vLLM). The dump is checked against a simple
reference: silence recomputed from each request's chunk arrivals alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "closed_loop.py"
CONTRACT = {
    "policy", "scenario", "load", "seed", "requests", "completed",
    "start_silence_s", "start_silence_p50_ms", "start_silence_p99_ms", "ttfa_p50_ms",
    "ttfa_p99_ms", "gap_silence_s", "gaps", "total_silence_s",
    "offered", "good", "late", "gappy", "shed", "unfinished", "goodput", "shed_p99_ms",
    "start_slo_ms", "gap_slo_ms",
}  # fmt: skip
DUMP = {"policy", "scenario", "seed", "request", "requested_ms", "play_start_ms", "chunks",
        "final", "end_ms", "start_ms", "longest_gap_ms", "shed_ms", "outcome"}  # fmt: skip


pytestmark = pytest.mark.integration  # every test runs the benchmark as a process


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the benchmark with `args`; its output, whatever its exit status."""
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of `text`, each parsed as one JSON object."""
    return [json.loads(line) for line in text.splitlines()]


def test_one_json_object_per_run_with_every_contract_field() -> None:
    """`--json`: only JSON lines, one per policy × load × seed (seeds as a range and a list),
    each with every contract field and its parameters."""
    done = bench(
        "--virtual", "--json", "--duration", "20", "--seeds", "1-2,5", "--load", "0.8,0.9",
        "--policy", "open", "--policy", "cap:11", "--policy", "gate:80:2000",
        "--scenario", "slowdown", "--slowdown", "1.5:5:10",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = json_lines(done.stdout)
    assert len(rows) == 3 * 2 * 3
    for row in rows:
        assert set(row) >= CONTRACT
        assert row["mode"] == "virtual"
        assert row["scenario"] == "slowdown"
        assert row["scenario_params"] == "slowdown 1.5:5:10"
        assert row["requests"] >= row["completed"] > 0
        assert row["total_silence_s"] == pytest.approx(
            row["start_silence_s"] + row["gap_silence_s"], abs=0.002
        )
    assert {(r["policy"], r["load"], r["seed"]) for r in rows} == {
        (p, load, s)
        for p in ("open", "cap:11", "gate:80:2000")
        for load in (0.8, 0.9)
        for s in (1, 2, 5)
    }


def test_the_same_point_gives_the_same_row() -> None:
    """Deterministic: a point run twice, alone or among others, gives the same row."""
    alone = json_lines(bench("--virtual", "--json", "--duration", "15", "--seeds", "3").stdout)
    done = bench(
        "--virtual", "--json", "--duration", "15", "--seeds", "2,3",
        "--policy", "open", "--policy", "edgemon",
    )  # fmt: skip
    among = json_lines(done.stdout)
    assert alone == [r for r in among if r["policy"] == "edgemon" and r["seed"] == 3]


def reference(line: dict[str, Any]) -> tuple[float, float, int]:
    """Start silence, gap silence and gaps of one dumped request, from its chunks alone.

    The player plays from `play_start_ms`; before each arrival it holds the audio of the
    chunks before it; at any instant it is silent mid-stream when it has played all of that.
    """
    end, requested, play = line["end_ms"], line["requested_ms"], line["play_start_ms"]
    start = end if play is None else min(play, end)
    if line["shed_ms"] is not None:
        start = requested  # refused: its listener was told at once
    gap, gaps, silent = 0.0, 0, False
    if play is not None:
        held = 0.0
        chunks = line["chunks"]
        for i, (arrival, audio) in enumerate(chunks):
            held += audio
            last = i == len(chunks) - 1
            until = end if last else chunks[i + 1][0]
            if last and line["final"]:
                break
            dry = max(play + held, arrival)
            if until > dry:
                gap += until - dry
                gaps += 0 if silent and play + held <= arrival else 1
                silent = True
            else:
                silent = silent and play + held <= arrival
    return max(0.0, start - requested), gap, gaps


def test_the_dump_recomputes_the_rows(tmp_path: Path) -> None:
    """`--dump`: one line per request with the dump's fields; the rows' start silence, gap
    silence, gaps, requests and completed follow from the dump alone."""
    dump = tmp_path / "requests.jsonl"
    done = bench(
        "--virtual", "--json", "--duration", "40", "--seeds", "1-2", "--load", "1.0",
        "--policy", "open", "--policy", "gate:80:2000", "--policy", "realtime+deadline",
        "--scenario", "network", "--dump", str(dump),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = json_lines(done.stdout)
    lines = json_lines(dump.read_text())
    assert all(set(line) == DUMP for line in lines)
    for row in rows:
        mine = [
            line for line in lines if (line["policy"], line["seed"]) == (row["policy"], row["seed"])
        ]
        assert len(mine) == row["requests"]
        assert sum(line["final"] for line in mine) == row["completed"]
        figures = [reference(line) for line in mine]
        assert sum(f[0] for f in figures) / 1000 == pytest.approx(row["start_silence_s"], abs=2e-3)
        assert sum(f[1] for f in figures) / 1000 == pytest.approx(row["gap_silence_s"], abs=2e-3)
        assert sum(f[2] for f in figures) == row["gaps"]
        for line, figure in zip(mine, figures, strict=True):
            assert line["start_ms"] == pytest.approx(figure[0], abs=2e-3)
            assert line["outcome"] == outcome(line, row)
        for name in ("good", "late", "gappy", "shed", "unfinished"):
            assert sum(line["outcome"] == name for line in mine) == row[name]
        assert row["offered"] == row["requests"]
        assert row["goodput"] == pytest.approx(row["good"] / row["offered"], abs=1e-4)
    assert any(row["gaps"] > 0 for row in rows)  # the reference had gaps to find
    assert any(row["shed"] > 0 for row in rows)  # and the deadline policy refusals


def outcome(line: dict[str, Any], row: dict[str, Any]) -> str:
    """A dumped request's outcome, recomputed from its start, longest gap and final flag
    against the row's SLOs."""
    if line["shed_ms"] is not None:
        return "shed"
    if line["start_ms"] > row["start_slo_ms"]:
        return "late"
    if line["longest_gap_ms"] > row["gap_slo_ms"]:
        return "gappy"
    return "good" if line["final"] else "unfinished"


def test_slo_and_chunk_flags_are_used_and_printed() -> None:
    """`--start-slo-ms`, `--gap-slo-ms` and `--chunks` reach the rows and the header; a
    tighter start SLO makes more requests late."""
    args = ("--virtual", "--duration", "30", "--seeds", "1", "--load", "0.9", "--policy", "open")
    loose = bench(*args, "--start-slo-ms", "5000", "--gap-slo-ms", "200", "--chunks", "4,4,8,16,25")
    tight = bench(*args, "--start-slo-ms", "1000")
    assert loose.returncode == tight.returncode == 0, loose.stderr + tight.stderr
    header, *rows = loose.stdout.splitlines()
    assert "start ≤ 5000 ms, longest gap ≤ 200 ms" in header
    assert "chunks 4,4,8,16,25 frames" in header
    (a,) = json_lines("\n".join(rows))
    header, *rows = tight.stdout.splitlines()
    assert "chunks 5,25 frames of 80 ms" in header
    (b,) = json_lines("\n".join(rows))
    assert (a["start_slo_ms"], a["gap_slo_ms"], b["start_slo_ms"]) == (5000, 200, 1000)
    assert (a["chunks"], b["chunks"]) == ("4,4,8,16,25", "5,25")
    assert b["late"] > a["late"]


def test_the_frame_flag_sets_each_frames_audio_and_the_capacity_with_it() -> None:
    """`--frame-ms 60` on cpu-vllm (as on the real engine): the rows say 60 ms frames, the
    header too, and the same load makes fewer requests (a 60 ms frame leaves the box less
    time per step, so its capacity estimate is lower) than with the profile's 80 ms."""
    args = ("--virtual", "--duration", "60", "--seeds", "1", "--profile", "cpu-vllm")
    short = bench(*args, "--frame-ms", "60", "--policy", "open")
    usual = bench(*args, "--policy", "open")
    assert short.returncode == usual.returncode == 0, short.stderr + usual.stderr
    header, *rows = short.stdout.splitlines()
    assert "chunks 5,25 frames of 60 ms" in header
    ((a,), (b,)) = json_lines("\n".join(rows)), json_lines(usual.stdout.split("\n", 1)[1])
    assert (a["frame_ms"], b["frame_ms"]) == (60, 80)
    assert a["requests"] < b["requests"]


def test_the_steps_flag_runs_the_engine_on_a_measured_shape(tmp_path: Path) -> None:
    """A shape as `real_engine.py --shape --json` prints it, with steps 1.5 times the
    `cpu-vllm` profile's: loads are shares of that slower box's capacity, so the same load
    carries fewer requests; the row names the steps. A box too slow for one stream, or a
    flag without `--virtual`, is refused."""
    fit = {"base_ms": 60.0, "per_decode_seq_ms": 4.7, "per_prefill_token_ms": 4.4}
    path = tmp_path / "shape.json"
    path.write_text(json.dumps({"contention": {"0.5": 2.0}, "fit": fit}) + "\n")
    args = ("--json", "--duration", "60", "--seeds", "1", "--profile", "cpu-vllm")
    slow = bench("--virtual", *args, "--policy", "open", "--steps", str(path))
    usual = bench("--virtual", *args, "--policy", "open")
    assert slow.returncode == usual.returncode == 0, slow.stderr + usual.stderr
    ((measured,), (shipped,)) = json_lines(slow.stdout), json_lines(usual.stdout)
    assert measured["requests"] < shipped["requests"]
    assert measured["steps"] == "60 + 4.7·n ms, 4.4 ms/token"
    assert "steps" not in shipped
    refused = bench(*args, "--steps", str(path))
    assert refused.returncode == 2
    assert "--virtual" in refused.stderr
    path.write_text(json.dumps({"fit": {**fit, "base_ms": 80.0}}) + "\n")
    too_slow = bench("--virtual", *args, "--steps", str(path))
    assert too_slow.returncode == 2
    assert "no stream keeps up" in too_slow.stderr


def test_every_run_prints_its_parameters_without_json() -> None:
    """Without `--json` a header line says the mode, profile, scenario with its parameters,
    loads, seeds and duration before the rows."""
    done = bench(
        "--virtual", "--duration", "10", "--seeds", "4", "--profile", "x86-gpu",
        "--scenario", "burst", "--burst", "5:3",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    first, *rows = done.stdout.splitlines()
    assert first.startswith("# closed loop (virtual clock), profile x86-gpu")
    assert "burst 5:3" in first
    assert "seeds 4" in first
    assert "10 s per run" in first
    (row,) = json_lines("\n".join(rows))
    assert row["policy"] == "edgemon"
    assert row["profile"] == "x86-gpu"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--seeds", "5-2"], "--seeds"),
        (["--seeds", "x"], "--seeds"),
        (["--policy", "cap:0"], "cap:0"),
        (["--policy", "gate:80"], "unknown policy"),
        (["--policy", "edgemon+budget:0:40:often"], "budget"),
        (["--scenario", "slowdown", "--slowdown", "1.3:70:60"], "--slowdown"),
        (["--scenario", "burst", "--burst", "2.5:10"], "--burst"),
        (["--load", "-1"], "--load"),
        (["--duration", "0"], "--duration"),
        (["--chunks", "4,0"], "--chunks"),
        (["--frame-ms", "0"], "--frame-ms"),
        (["--profile", "cpu-vllm", "--frame-ms", "40"], "no stream keeps up"),
        (["--start-slo-ms", "-5"], "--start-slo-ms"),
        (["--policy", "realtime+deadline:lifo"], "order"),
        (["--steps", "/nonexistent/shape.json"], "--steps"),
    ],
)
def test_bad_flags_say_what_is_wrong_in_one_line(args: list[str], words: str) -> None:
    """Bad input: exit status 2, one line on stderr naming the flag, nothing run."""
    done = bench("--virtual", *args)
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert words in line


def synthetic_row(policy: str, seed: int, goodput: float, p99: float, **point: Any) -> str:
    """One row of the contract with the given goodput and start p99."""
    row = {
        "mode": "virtual", "profile": "jetson", "scenario": "slowdown", "load": 0.9,
        "scenario_params": "slowdown 1.3:20:60", "policy": policy, "seed": seed,
        "requests": 100, "completed": 90, "start_silence_s": 1.0, "start_silence_p50_ms": 1.0,
        "start_silence_p99_ms": p99, "ttfa_p50_ms": 1.0, "ttfa_p99_ms": 1.0,
        "gap_silence_s": 1.0, "gaps": 1, "gaps_per_stream_min": 0.1, "total_silence_s": 2.0,
        "start_slo_ms": 3000.0, "gap_slo_ms": 100.0, "offered": 100,
        "good": round(100 * goodput), "late": 0, "gappy": 0, "shed": 0, "unfinished": 0,
        "goodput": goodput, "shed_p99_ms": None, "longest_gap_p95_ms": 50.0,
    } | point  # fmt: skip
    return json.dumps(row)


def test_the_report_leads_with_the_goodput_targets(tmp_path: Path) -> None:
    """`--report`: the target table per point, computed per seed: (a) seeds in which
    `edgemon` matches every baseline, (b) points above open and the best cap, (c) the start
    p99 against the SLO × 1.1; then each point's goodput table."""
    rows = tmp_path / "rows.jsonl"
    lines = []
    for seed in range(1, 11):
        lines.append(synthetic_row("open", seed, 0.40, 7000.0))
        lines.append(synthetic_row("cap:11", seed, 0.50, 9000.0))
        lines.append(synthetic_row("realtime", seed, 0.45, 9000.0))
        mine = 0.72 if seed != 3 else 0.30  # one seed below every baseline
        lines.append(synthetic_row("edgemon", seed, mine, 3400.0 if seed == 5 else 3000.0))
    rows.write_text("\n".join(lines) + "\n")
    done = bench("--report", str(rows))
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert text.index("Goodput targets") < text.index("| policy | goodput |")
    (target,) = [line for line in text.splitlines() if line.startswith("| jetson | slowdown")]
    cells = [cell.strip() for cell in target.strip("|").split("|")]
    assert cells[3] == "72.0 % [30.0 %–72.0 %]"
    assert cells[4].startswith("9/10 (")  # every baseline beat it on seed 3 only
    assert cells[4].endswith("): met")
    assert cells[6].startswith("+32.0 [-10.0–+32.0] met")
    assert cells[7].startswith("+22.0 [-20.0–+22.0] (cap:11) met")
    assert cells[8] == "3,400 ≤ 3,300: **missed**"


def real_row(mode: str, seed: int, **fields: Any) -> dict[str, Any]:
    """A row of `real_engine.py` (mode ``real``) or of its prediction (``virtual``)."""
    base = {"mode": mode, "profile": "cpu-vllm", "policy": "edgemon", "scenario": "steady"}
    return base | {"seed": seed} | fields


def test_the_real_report_summarises_real_figures_beside_their_prediction(tmp_path: Path) -> None:
    """`--real-report ... --summary`: per scenario, policy and mode, the median [least–most]
    of the real runs' SLO capacity and goodput, beside the virtual loop's for the same seeds
    only; the made row names the seeds and the runs' arrivals."""
    tuned = {"kind": "tuned", "profile": "cpu-vllm", "policy": "queued:20:20", "ranking": []}
    search = {"kind": "slo_capacity", "slo_target": 0.95, "arrivals_s": 60.0}
    lines: list[dict[str, Any]] = [tuned]
    for seed, (real, guess) in enumerate([(0.6, 0.7), (0.4, 0.5)], start=1):
        for mode, capacity in (("real", real), ("virtual", guess)):
            lines.append(real_row(mode, seed, slo_capacity=capacity, **search))
            lines.append(real_row(mode, seed, load=1.0, goodput=capacity / 2))
    lines.append(real_row("virtual", 9, slo_capacity=0.9, **search))
    rows, summary = tmp_path / "rows.jsonl", tmp_path / "real.jsonl"
    rows.write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = bench("--real-report", str(rows), "--summary", str(summary))
    assert done.returncode == 0, done.stderr
    assert "| steady | SLO capacity at 0.95 | `edgemon` (edgemon) |" in done.stdout
    made, *figures = json_lines(summary.read_text())
    assert (made["kind"], made["seeds"], made["arrivals_s"]) == ("made", [1, 2], [60.0])
    by = {(row["kind"], row["role"], row["mode"]): row for row in figures}
    assert by["slo_capacity", "edgemon", "real"]["values"] == [0.6, 0.4]
    assert by["slo_capacity", "edgemon", "virtual"]["values"] == [0.7, 0.5]  # not seed 9's
    assert by["goodput", "edgemon", "real"]["median"] == 0.25


def feed_row(policy: str, seed: int, **fields: Any) -> dict[str, Any]:
    """A virtual row of `make bench-feed`."""
    base = {"mode": "virtual", "profile": "jetson", "scenario": "pause", "lengths": "eos"}
    return base | {"policy": policy, "seed": seed} | fields


def test_the_feed_report_compares_the_feeds_seed_by_seed(tmp_path: Path) -> None:
    """`--feed-report ... --summary`: per point each feed's and peer's median [least–most],
    the measured − estimated difference taken seed by seed with how many seeds it was ahead,
    the start-SLO misses among admitted requests, and SLO capacities below the bisection's low
    bound counted as 0; other policies are left out."""
    lines: list[dict[str, Any]] = []
    for seed, (measured, estimated) in enumerate([(0.80, 0.70), (0.60, 0.65), (0.90, 0.80)], 1):
        for policy, good in (
            ("edgemon+feed:measured", measured),
            ("edgemon+feed:estimated", estimated),
            ("estimated-park", 0.1),
            ("queued:12:12", 0.99),
        ):
            lines.append(
                feed_row(policy, seed, load=1.0, goodput=good, late=10, offered=100, shed=50)
            )
        search = {"kind": "slo_capacity", "slo_target": 0.95, "seeds": "1-3"}
        lines.append(feed_row("edgemon+feed:measured", seed, slo_capacity=0.5, **search))
        lines.append(feed_row("edgemon+feed:estimated", seed, slo_capacity=None, **search))
    rows, summary = tmp_path / "rows.jsonl", tmp_path / "feed.jsonl"
    rows.write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = bench("--feed-report", str(rows), "--summary", str(summary))
    assert done.returncode == 0, done.stderr
    assert "| jetson | pause | 1 | 80.0 [60.0 to 90.0] | 70.0 [65.0 to 80.0] |" in done.stdout
    made, *figures = json_lines(summary.read_text())
    assert (made["kind"], made["command"], made["seeds"]) == ("made", "make bench-feed", ["1-3"])
    by = {(row["kind"], row["role"]): row for row in figures}
    diff = by["goodput", "measured - estimated"]
    assert (diff["median"], diff["min"], diff["max"]) == (0.1, -0.05, 0.1)
    assert (diff["ahead"], diff["behind"], diff["seeds"]) == (2, 1, 3)
    assert by["late_admitted", "measured"]["median"] == 0.2
    assert by["slo_capacity", "estimated"]["median"] == 0.0
    assert by["slo_capacity", "measured - estimated"]["median"] == 0.5
    assert not any("queued" in str(row.get("role")) for row in figures)
