"""`edgemon replay` run as a real process: JSON lines, flags, config, and one-line errors."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest

from edgemon.engine.config import EngineConfig, SlackPolicy
from edgemon.replay import replay
from edgemon.trace import TraceRecord

if TYPE_CHECKING:
    from pathlib import Path


TOPIC = "edgemon/v1/d1/events"
#: One stream whose output depends on every flag: it goes at risk at 220 (180 with a 120 ms
#: margin), recovers at 230 (OFF at once only without min-on), recovers at 430 to a headroom
#: of 90 (inside the default 20 ms hysteresis band), underruns at 620 and gets a final chunk
#: at 700 (the rebuffer player resumes later than the conceal player's clock).
EVENTS: list[tuple[float, dict[str, Any]]] = [
    (0, {"type": "chunk", "stream": "s", "t_ms": 0, "seq": 0, "audio_ms": 300, "eta_ms": 100}),
    (230, {"type": "chunk", "stream": "s", "t_ms": 230, "seq": 1, "audio_ms": 200, "eta_ms": 100}),
    (430, {"type": "chunk", "stream": "s", "t_ms": 430, "seq": 2, "audio_ms": 120, "eta_ms": 100}),
    (700, {"type": "chunk", "stream": "s", "t_ms": 700, "seq": 3, "audio_ms": 200, "final": True}),
]
FLAGS = ["--player", "rebuffer", "--margin-ms", "120", "--hysteresis-ms", "0"]
FLAGS += ["--min-on-ms", "0", "--sample-ms", "50"]
FLAGGED = SlackPolicy(player="rebuffer", default_margin_ms=120, hysteresis_ms=0, min_on_ms=0)


def trace_text(events: list[tuple[float, dict[str, Any]]] = EVENTS) -> str:
    """The JSON-lines trace of `(recv_ms, event)` pairs on device d1."""
    lines = [
        json.dumps({"recv_ms": recv, "topic": TOPIC, "payload": json.dumps(event)})
        for recv, event in events
    ]
    return "\n".join(lines) + "\n"


def expected(policy: SlackPolicy, sample_ms: float) -> list[dict[str, Any]]:
    """What replay prints for the trace of EVENTS, computed in-process."""
    records = [TraceRecord(recv, TOPIC, json.dumps(event).encode()) for recv, event in EVENTS]
    lines = replay(records, EngineConfig(slack=policy), sample_ms=sample_ms)
    return [json.loads(json.dumps(line)) for line in lines]


def edgemon_replay(
    *args: str, stdin: bytes | None = None, environ: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run `python -m edgemon replay ARGS` without any EDGEMON_* variable in its environment
    but those of `environ`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEMON_")}
    env.update(environ or {})
    return subprocess.run(
        [sys.executable, "-m", "edgemon", "replay", *args],
        input=stdin if stdin is not None else b"",
        capture_output=True,
        env=env,
        check=False,
        timeout=60,
    )


def json_lines(result: subprocess.CompletedProcess[bytes]) -> list[dict[str, Any]]:
    """Every stdout line, each parsed as one JSON object."""
    text = result.stdout.decode("utf-8")
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def assert_usage_error(result: subprocess.CompletedProcess[bytes], *, says: str = "") -> str:
    """Exit code 2 and exactly one line on stderr, `edgemon replay: ...`, no traceback."""
    err = result.stderr.decode("utf-8", errors="replace")
    assert result.returncode == 2, (result.returncode, err)
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("edgemon replay: "), err
    assert says in lines[0]
    assert b'"kind":"summary"' not in result.stdout
    return lines[0]


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The EVENTS trace, on disk."""
    path = tmp_path_factory.mktemp("replay") / "trace.jsonl"
    path.write_text(trace_text(), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def default_run(trace_file: Path) -> subprocess.CompletedProcess[bytes]:
    """`edgemon replay TRACE` with no options."""
    return edgemon_replay(str(trace_file))


@pytest.mark.integration  # its fixture runs a process
def test_prints_json_lines_summary_last(default_run: subprocess.CompletedProcess[bytes]) -> None:
    """Exit 0, nothing on stderr, one JSON object per stdout line, the summary last."""
    assert default_run.returncode == 0, default_run.stderr
    assert default_run.stderr == b""
    lines = json_lines(default_run)
    assert lines[-1]["kind"] == "summary"
    assert [line["kind"] for line in lines].count("summary") == 1
    assert lines == expected(SlackPolicy(), 100)
    assert lines[-1]["messages"] == 4
    assert {line["t_ms"] for line in lines if line["kind"] == "sample"} <= {
        100 * k for k in range(10)
    }


@pytest.mark.integration  # starts a process
def test_dash_reads_stdin(
    trace_file: Path, default_run: subprocess.CompletedProcess[bytes]
) -> None:
    """`-` reads the trace from standard input, with the same output as from the file."""
    result = edgemon_replay("-", stdin=trace_file.read_bytes())
    assert result.returncode == 0, result.stderr
    assert result.stdout == default_run.stdout


@pytest.mark.parametrize(
    "change",
    [
        {"player": "rebuffer"},
        {"default_margin_ms": 120},
        {"hysteresis_ms": 0},
        {"min_on_ms": 0},
    ],
)
def test_trace_is_sensitive_to_each_setting(change: dict[str, Any]) -> None:
    """(In-process.) Each setting the flags set changes this trace's output on its own."""
    assert expected(SlackPolicy(**change), 100) != expected(SlackPolicy(), 100)


@pytest.mark.integration  # starts a process
def test_flags_take_effect(
    trace_file: Path, default_run: subprocess.CompletedProcess[bytes]
) -> None:
    """--player, --margin-ms, --hysteresis-ms, --min-on-ms and --sample-ms set those settings."""
    result = edgemon_replay(str(trace_file), *FLAGS)
    assert result.returncode == 0, result.stderr
    lines = json_lines(result)
    assert lines == expected(FLAGGED, 50)
    assert lines != json_lines(default_run)
    samples = [line for line in lines if line["kind"] == "sample"]
    assert any(s["t_ms"] % 100 == 50 for s in samples)  # every 50 ms
    assert all(s["slack_ms"] >= 0 for s in samples)  # rebuffer never goes below zero
    assert all(s["at_risk"] == (s["headroom_ms"] < 120) for s in samples)
    throttle = [(t["t_ms"], t["active"]) for t in lines if t["kind"] == "throttle"]
    assert throttle[:2] == [(180, True), (230, False)]  # margin 120, no min-on


@pytest.mark.integration  # starts a process
def test_config_file_applies_and_flags_override(trace_file: Path, tmp_path: Path) -> None:
    """`[slack]` of --config applies; a flag given too overrides the file's value."""
    config = tmp_path / "edgemon.toml"
    config.write_text(
        '[slack]\nplayer = "rebuffer"\ndefault_margin_ms = 120\nhysteresis_ms = 0\nmin_on_ms = 0\n',
        encoding="utf-8",
    )
    from_file = edgemon_replay(str(trace_file), "--config", str(config))
    assert from_file.returncode == 0, from_file.stderr
    assert json_lines(from_file) == expected(FLAGGED, 100)
    overridden = edgemon_replay(
        str(trace_file), "--config", str(config), "--player", "conceal", "--margin-ms", "80"
    )
    assert overridden.returncode == 0, overridden.stderr
    policy = SlackPolicy(player="conceal", default_margin_ms=80, hysteresis_ms=0, min_on_ms=0)
    assert json_lines(overridden) == expected(policy, 100)


@pytest.mark.integration  # starts a process
def test_the_environment_applies_as_for_run(trace_file: Path) -> None:
    """The `EDGEMON_<SECTION>__<KEY>` variables that `run` reads apply to replay too (the
    same settings, so a replay judges as the daemon did); a flag overrides them."""
    environ = {
        "EDGEMON_SLACK__PLAYER": "rebuffer",
        "EDGEMON_SLACK__DEFAULT_MARGIN_MS": "120",
        "EDGEMON_SLACK__HYSTERESIS_MS": "0",
        "EDGEMON_SLACK__MIN_ON_MS": "0",
    }
    from_environment = edgemon_replay(str(trace_file), environ=environ)
    assert from_environment.returncode == 0, from_environment.stderr
    assert json_lines(from_environment) == expected(FLAGGED, 100)
    overridden = edgemon_replay(str(trace_file), "--margin-ms", "80", environ=environ)
    policy = SlackPolicy(player="rebuffer", default_margin_ms=80, hysteresis_ms=0, min_on_ms=0)
    assert json_lines(overridden) == expected(policy, 100)


@pytest.mark.integration  # starts a process
def test_bad_payloads_are_not_errors(tmp_path: Path) -> None:
    """A non-UTF-8 payload is a `rejected` line (invalid_json); unknown fields are ignored."""
    event = {"type": "chunk", "stream": "s", "t_ms": 10, "seq": 0, "audio_ms": 100, "x": [1]}
    lines = [
        {"recv_ms": 5, "topic": TOPIC, "payload_b64": base64.b64encode(b"\xff\xfe").decode()},
        {"recv_ms": 10, "topic": TOPIC, "payload": json.dumps(event), "qos": 1},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    result = edgemon_replay(str(path), "--sample-ms", "0")
    assert result.returncode == 0, result.stderr
    assert result.stderr == b""
    out = json_lines(result)
    rejected = [line for line in out if line["kind"] == "rejected"]
    assert [(r["recv_ms"], r["topic"], r["reason"]) for r in rejected] == [
        (5, TOPIC, "invalid_json")
    ]
    ends = [line for line in out if line["kind"] == "stream_end"]
    assert [(e["stream"], e["chunks"], e["audio_ms"]) for e in ends] == [("s", 1, 100)]
    assert out[-1] == {
        "kind": "summary",
        "messages": 2,
        "events": 1,
        "rejected": 1,
        "streams": 1,
        "underruns": 1,
        "throttle_engagements": 1,
    }


@pytest.mark.integration  # starts a process
def test_missing_trace_file(tmp_path: Path) -> None:
    """A trace path that does not exist: exit 2, one line naming it."""
    missing = tmp_path / "nope.jsonl"
    assert_usage_error(edgemon_replay(str(missing)), says=str(missing))


@pytest.mark.integration  # starts a process
def test_bad_json_line_names_file_and_line(tmp_path: Path) -> None:
    """A line that is not JSON: exit 2, the message names `file:line`."""
    path = tmp_path / "t.jsonl"
    path.write_text(trace_text(EVENTS[:1]) + "{oops\n", encoding="utf-8")
    assert_usage_error(edgemon_replay(str(path)), says=f"{path}:2: ")


@pytest.mark.integration  # starts a process
def test_line_without_topic(tmp_path: Path) -> None:
    """A record without `topic`: exit 2, the message names the line and the key."""
    path = tmp_path / "t.jsonl"
    path.write_text('\n\n{"recv_ms": 1, "payload": "{}"}\n', encoding="utf-8")
    line = assert_usage_error(edgemon_replay(str(path)), says=f"{path}:3: ")
    assert "topic" in line


@pytest.mark.integration  # starts a process
def test_non_utf8_trace_file(tmp_path: Path) -> None:
    """A trace file that is not UTF-8 text: exit 2, one line."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"recv_ms": 1, "topic": "t", "payload": "\xff"}\n')
    assert_usage_error(edgemon_replay(str(path)), says=str(path))


@pytest.mark.integration  # starts a process
@pytest.mark.parametrize(
    "text",
    ["[slack\nplayer = 1\n", '[slack]\nplayer = "pause"\nmin_on_ms = -1\n'],
    ids=["toml-syntax", "bad-values"],
)
def test_bad_config_file(trace_file: Path, tmp_path: Path, text: str) -> None:
    """A config file that cannot be used: exit 2, every problem on one line."""
    config = tmp_path / "bad.toml"
    config.write_text(text, encoding="utf-8")
    assert_usage_error(edgemon_replay(str(trace_file), "--config", str(config)))


@pytest.mark.integration  # starts a process
def test_missing_config_file(trace_file: Path, tmp_path: Path) -> None:
    """A --config path that does not exist is an error (README)."""
    missing = tmp_path / "none.toml"
    assert_usage_error(edgemon_replay(str(trace_file), "--config", str(missing)))


@pytest.mark.integration  # starts a process
def test_negative_sample_ms(trace_file: Path) -> None:
    """`--sample-ms -1`: exit 2, one line naming the flag."""
    assert_usage_error(edgemon_replay(str(trace_file), "--sample-ms", "-1"), says="--sample-ms")


@pytest.mark.integration  # starts a process
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_non_finite_sample_ms(trace_file: Path, value: str) -> None:
    """`--sample-ms nan` / `inf`: exit 2, one line naming the flag."""
    assert_usage_error(edgemon_replay(str(trace_file), "--sample-ms", value), says="--sample-ms")


@pytest.mark.integration  # starts a process
@pytest.mark.parametrize(
    "line",
    ["[" * 100_000, '{"recv_ms": 1' + "0" * 400 + ', "topic": "t", "payload": "x"}'],
    ids=["deeply-nested", "huge-recv_ms"],
)
def test_unreadable_line_is_a_usage_error(tmp_path: Path, line: str) -> None:
    """Any malformed trace line is exit 2 with `file:line`, however it is malformed."""
    path = tmp_path / "t.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    assert_usage_error(edgemon_replay(str(path)), says=f"{path}:1: ")


@pytest.mark.integration  # starts a process
def test_non_utf8_stdin() -> None:
    """A trace on standard input that is not UTF-8 text: exit 2, as for a file."""
    result = edgemon_replay("-", stdin=b'{"recv_ms": 1, "topic": "t", "payload": "\xff"}\n')
    assert_usage_error(result, says="<stdin>")
