"""`benchmarks/real_engine.py`: the closed loop on vLLM's real CPU engine, one short point.

The smallest generated model (`--model-size tiny`, made here, no EOS token, nothing
downloaded) served by `python -m vllm.entrypoints.openai.api_server` with vLLM's own
scheduler and admission limits (`queued:4:6`: `--max-num-seqs 4 --max-num-queued-reqs 6`)
and then with the policy edgemon ships (`edgemon`: `EdgemonRealtimeScheduler`,
`EDGEMON_DEADLINES=shed`, the gate and the shedding middleware), a real Mosquitto and
`edgemon run`, players streaming over HTTP without a length (a generous `max_tokens`, no
`ignore_eos`: each closes its stream once it has its frames) and reporting through
`Reporter`. Checks that the rows are the virtual loop's, scaled by the shape given, drained
and served; nothing about how fast (the figures belong to `make bench-real`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from edgemon.simulate.profiles import CPU_VLLM, StepModel

from served import uncovered

pytest.importorskip("vllm.entrypoints.openai.api_server", exc_type=ImportError)
pytest.importorskip("transformers")

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "real_engine.py"
TIMEOUT_S = 900.0  # two server starts on a loaded 2-core machine, and two 15 s runs drained
CONTRACT = {
    "mode", "profile", "policy", "scenario", "load", "seed", "duration_s", "requests",
    "completed", "start_silence_s", "start_silence_p50_ms", "start_silence_p99_ms",
    "ttfa_p50_ms", "ttfa_p99_ms", "gap_silence_s", "gaps", "total_silence_s", "offered",
    "good", "late", "gappy", "shed", "unfinished", "goodput", "shed_p99_ms", "start_slo_ms",
    "gap_slo_ms", "model_size", "frame_ms", "step_p50_ms", "cut", "drain", "rate_rps",
    "server_flags", "scale",
}  # fmt: skip
OUTCOMES = ("good", "late", "gappy", "shed", "unfinished")
FIT = {"base_ms": 40.0, "per_decode_seq_ms": 3.13, "per_prefill_token_ms": 2.95}
"""The shape the loads are scaled by: `cpu-vllm`'s fit (the tiny model is far faster), so that
load 3 is about 3.3 requests a second."""


def test_one_short_point_on_the_real_engine_vllms_limits_and_edgemon(tmp_path: Path) -> None:
    """`queued:4:6` and `edgemon` through the delaying proxy (`network`, 300 ms in the last
    5 s of every 10 s: the players' whole path, the proxy included), 15 s of arrivals each
    at load 3 of the shape given, drained: one row each with every field of the virtual
    loop's contract, vLLM's flags as given, the scale (the fit given, its capacity), requests
    made and completed, outcomes adding up to the requests, none unfinished (the run
    drained) and none cut short (no stream ended before its player had its frames), and one
    dump line per request."""
    dump = tmp_path / "dump.jsonl"
    shape = tmp_path / "shape.json"
    shape.write_text(json.dumps({"model_size": "tiny", "fit": FIT}) + "\n", encoding="utf-8")
    done = subprocess.run(
        [
            sys.executable, str(SCRIPT), "--json", "--model-size", "tiny",
            "--policy", "queued:4:6", "--policy", "edgemon", "--scenario", "network",
            "--network", "300:5:10", "--shape-file", str(shape),
            "--load", "3", "--seeds", "1", "--duration", "15", "--dump", str(dump),
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
        env=uncovered(),  # the vLLM servers it starts are not measured
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rows: list[dict[str, Any]] = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(row["policy"], row["scenario"]) for row in rows] == [
        ("queued:4:6", "network"), ("edgemon", "network"),
    ]  # fmt: skip
    capacity = replace(CPU_VLLM, step=StepModel(**FIT)).capacity_rps()
    assert "--max-num-seqs 4 --max-num-queued-reqs 6" in rows[0]["server_flags"]
    assert "--scheduler-cls" in rows[1]["server_flags"]
    for row in rows:
        assert set(row) >= CONTRACT
        assert (row["mode"], row["model_size"], row["drain"]) == ("real", "tiny", True)
        assert row["scale"]["fit"] == FIT
        assert row["scale"]["capacity_rps"] == round(capacity, 4)
        assert row["rate_rps"] == round(3 * capacity, 4)
        assert row["requests"] >= row["completed"] > 0
        assert sum(row[name] for name in OUTCOMES) == row["offered"] == row["requests"]
        assert (row["unfinished"], row["cut"]) == (0, 0)
    lines = [json.loads(line) for line in dump.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == sum(row["requests"] for row in rows)
    assert {line["policy"] for line in lines} == {"queued:4:6", "edgemon"}
