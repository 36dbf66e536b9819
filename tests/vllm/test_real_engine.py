"""`benchmarks/real_engine.py`: the closed loop on vLLM's real CPU engine, one short point.

The smallest generated model (`--model-size tiny`, made here, nothing downloaded) served by
`python -m vllm.entrypoints.openai.api_server` with vLLM's own scheduler (`open`) and then
with the policy edgemon ships (`edgemon`: `EdgemonRealtimeScheduler`, `EDGEMON_DEADLINES=shed`,
the gate and the shedding middleware), a real Mosquitto and `edgemon run`, players streaming
over HTTP and reporting through `Reporter`. Checks that the rows are the virtual loop's and
that requests were served; nothing about how fast (the figures belong to `make bench-real`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm.entrypoints.openai.api_server", exc_type=ImportError)
pytest.importorskip("transformers")

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "real_engine.py"
TIMEOUT_S = 900.0  # two server starts on a loaded 2-core machine, and two 15 s runs
CONTRACT = {
    "mode", "profile", "policy", "scenario", "load", "seed", "duration_s", "requests",
    "completed", "start_silence_s", "start_silence_p50_ms", "start_silence_p99_ms",
    "ttfa_p50_ms", "ttfa_p99_ms", "gap_silence_s", "gaps", "total_silence_s", "offered",
    "good", "late", "gappy", "shed", "unfinished", "goodput", "shed_p99_ms", "start_slo_ms",
    "gap_slo_ms", "model_size", "frame_ms", "step_p50_ms", "cut",
}  # fmt: skip
OUTCOMES = ("good", "late", "gappy", "shed", "unfinished")


def test_one_short_point_on_the_real_engine_open_and_edgemon(tmp_path: Path) -> None:
    """Open and edgemon through the delaying proxy (`network`, 300 ms in the last 5 s of every
    10 s: the players' whole path, the proxy included), 15 s each at three times the profile's
    estimated load (the tiny model is far faster than the profile's): one row each with every
    field of the virtual loop's contract, requests made and completed, outcomes adding up to
    the requests, and one dump line per request."""
    dump = tmp_path / "dump.jsonl"
    done = subprocess.run(
        [
            sys.executable, str(SCRIPT), "--json", "--model-size", "tiny",
            "--policy", "open", "--policy", "edgemon", "--scenario", "network",
            "--network", "300:5:10",
            "--load", "3", "--seeds", "1", "--duration", "15", "--dump", str(dump),
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rows: list[dict[str, Any]] = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(row["policy"], row["scenario"]) for row in rows] == [
        ("open", "network"), ("edgemon", "network"),
    ]  # fmt: skip
    for row in rows:
        assert set(row) >= CONTRACT
        assert (row["mode"], row["model_size"]) == ("real", "tiny")
        assert row["requests"] >= row["completed"] > 0
        assert sum(row[name] for name in OUTCOMES) == row["offered"] == row["requests"]
    lines = [json.loads(line) for line in dump.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == sum(row["requests"] for row in rows)
    assert {line["policy"] for line in lines} == {"open", "edgemon"}
