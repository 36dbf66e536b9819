"""The trace file of README: JSON lines written by `run --record` and read by `replay`."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgemon.trace import (
    TraceError,
    TraceMark,
    TraceRecord,
    encode_line,
    encode_mark,
    encode_record,
    read_records,
    read_trace,
)

TOPIC = "edgemon/v1/d1/events"


def line(**fields: Any) -> str:
    """One trace line with exactly the given keys."""
    return json.dumps(fields)


def read_one(text: str) -> TraceRecord:
    """The single record of a one-line trace."""
    records = list(read_records([text]))
    assert len(records) == 1
    return records[0]


def test_utf8_payload_is_written_as_text() -> None:
    """A UTF-8 payload is written under `payload`, as the raw text (non-ASCII kept as is)."""
    record = TraceRecord(1700000000123.5, TOPIC, '{"stream":"é"}'.encode())
    text = encode_record(record)
    assert "\n" not in text
    assert json.loads(text) == {
        "recv_ms": 1700000000123.5,
        "topic": TOPIC,
        "payload": '{"stream":"é"}',
    }
    assert "é" in text  # raw, not \u-escaped
    assert read_one(text) == record


def test_non_utf8_payload_is_written_as_base64() -> None:
    """A payload that is not valid UTF-8 is written under `payload_b64` and read back intact."""
    raw = b"\xff\xfe{\x00\x80"
    record = TraceRecord(5.0, TOPIC, raw)
    text = encode_record(record)
    obj = json.loads(text)
    assert "payload" not in obj
    assert base64.b64decode(obj["payload_b64"]) == raw
    assert read_one(text) == record


def test_payload_with_newlines_stays_on_one_line() -> None:
    """Newlines and quotes in a payload are escaped: one record is always one line."""
    record = TraceRecord(0.0, TOPIC, b'{\n"a": "b\\"\r\n"}\n')
    text = encode_record(record)
    assert "\n" not in text
    assert "\r" not in text
    assert read_one(text) == record


def test_empty_payload_round_trips() -> None:
    """An empty payload is the empty text."""
    record = TraceRecord(1.0, TOPIC, b"")
    assert json.loads(encode_record(record))["payload"] == ""
    assert read_one(encode_record(record)) == record


@given(
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.binary(max_size=64) | st.text(max_size=32).map(str.encode),
)
def test_round_trip(recv_ms: float, topic: str, payload: bytes) -> None:
    """Whatever the payload bytes and topic, `read_records(encode_record(r))` gives `r` back."""
    record = TraceRecord(recv_ms, topic, payload)
    text = encode_record(record)
    assert "\n" not in text
    assert list(read_records([text + "\n"])) == [record]


@given(
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.binary(max_size=64) | st.text(max_size=32).map(str.encode),
)
def test_the_fast_line_is_the_record_line(recv_ms: float, topic: str, payload: bytes) -> None:
    """`encode_line` (the write-ahead log's hot path) writes byte for byte what
    `encode_record` does, plus the newline."""
    expected = (encode_record(TraceRecord(recv_ms, topic, payload)) + "\n").encode(
        "utf-8", "surrogatepass"
    )
    assert encode_line(recv_ms, topic, payload) == expected


def test_records_in_file_order_blank_lines_skipped() -> None:
    """Records come in file order; blank and whitespace-only lines are skipped."""
    records = [TraceRecord(float(i), TOPIC, f"m{i}".encode()) for i in range(3)]
    lines = ["\n", encode_record(records[0]) + "\n", "   \n", "\t\n"]
    lines += [encode_record(records[1]) + "\n", "", encode_record(records[2])]
    assert list(read_records(lines)) == records


def test_unknown_keys_are_ignored() -> None:
    """Keys other than recv_ms, topic, payload and payload_b64 are ignored."""
    text = line(recv_ms=3, topic=TOPIC, payload="x", qos=1, retain=False, meta={"a": [1]})
    assert read_one(text) == TraceRecord(3.0, TOPIC, b"x")


def test_integer_recv_ms_is_a_float() -> None:
    """`recv_ms` may be written as an integer; it is read as a float."""
    record = read_one(line(recv_ms=12, topic=TOPIC, payload=""))
    assert record.recv_ms == 12.0
    assert isinstance(record.recv_ms, float)


def test_reading_is_lazy() -> None:
    """Records before a bad line are yielded before the error is raised."""
    records = read_records([line(recv_ms=1, topic=TOPIC, payload="a"), "oops"], name="t")
    assert next(records) == TraceRecord(1.0, TOPIC, b"a")
    with pytest.raises(TraceError, match=r"^t:2: "):
        next(records)


BAD_LINES = [
    pytest.param("not json", "not JSON", id="not-json"),
    pytest.param('{"recv_ms": 1, "topic": "t", "payload": "x"', "not JSON", id="truncated"),
    pytest.param("[1, 2]", "object", id="array"),
    pytest.param('"text"', "object", id="string"),
    pytest.param("null", "object", id="null"),
    pytest.param(line(topic=TOPIC, payload="x"), "recv_ms", id="recv_ms-missing"),
    pytest.param(line(recv_ms=True, topic=TOPIC, payload="x"), "recv_ms", id="recv_ms-bool"),
    pytest.param(line(recv_ms="1", topic=TOPIC, payload="x"), "recv_ms", id="recv_ms-string"),
    pytest.param(line(recv_ms=None, topic=TOPIC, payload="x"), "recv_ms", id="recv_ms-null"),
    pytest.param('{"recv_ms": NaN, "topic": "t", "payload": "x"}', "recv_ms", id="recv_ms-nan"),
    pytest.param(
        '{"recv_ms": Infinity, "topic": "t", "payload": "x"}', "recv_ms", id="recv_ms-inf"
    ),
    pytest.param('{"recv_ms": 1e400, "topic": "t", "payload": "x"}', "recv_ms", id="recv_ms-1e400"),
    pytest.param(line(recv_ms=1, payload="x"), "topic", id="topic-missing"),
    pytest.param(line(recv_ms=1, topic=5, payload="x"), "topic", id="topic-number"),
    pytest.param(line(recv_ms=1, topic=None, payload="x"), "topic", id="topic-null"),
    pytest.param(line(recv_ms=1, topic=TOPIC), "payload", id="no-payload"),
    pytest.param(
        line(recv_ms=1, topic=TOPIC, payload="x", payload_b64="eA=="), "payload", id="both"
    ),
    pytest.param(
        line(recv_ms=1, topic=TOPIC, payload=None, payload_b64=None), "payload", id="both-null"
    ),
    pytest.param(line(recv_ms=1, topic=TOPIC, payload=5), "payload", id="payload-number"),
    pytest.param(line(recv_ms=1, topic=TOPIC, payload=["x"]), "payload", id="payload-array"),
    pytest.param(line(recv_ms=1, topic=TOPIC, payload_b64=5), "payload_b64", id="b64-number"),
    pytest.param(line(recv_ms=1, topic=TOPIC, payload_b64="!!!!"), "base64", id="b64-chars"),
    pytest.param(line(recv_ms=1, topic=TOPIC, payload_b64="eA="), "base64", id="b64-padding"),
    pytest.param(line(recv_ms=1, topic=TOPIC, payload_b64="eA==\n"), "base64", id="b64-newline"),
]


@pytest.mark.parametrize(("text", "says"), BAD_LINES)
def test_malformed_line_names_file_and_line(text: str, says: str) -> None:
    """Each malformed line raises TraceError `name:line: why`, counting blank lines too."""
    good = encode_record(TraceRecord(0.0, TOPIC, b"{}"))
    with pytest.raises(TraceError) as info:
        list(read_records([good + "\n", "\n", text + "\n", good], name="rec.jsonl"))
    message = str(info.value)
    assert message.startswith("rec.jsonl:3: ")
    assert says in message
    assert "\n" not in message


def test_default_name() -> None:
    """Without a name the error says `trace:line`."""
    with pytest.raises(TraceError, match=r"^trace:1: "):
        list(read_records(["{}"]))


def test_trace_error_is_a_value_error() -> None:
    """TraceError is a ValueError, so callers that handle bad values handle it."""
    assert issubclass(TraceError, ValueError)


def test_deeply_nested_line_is_a_trace_error() -> None:
    """A line of deeply nested JSON is a TraceError naming its line, not a RecursionError."""
    with pytest.raises(TraceError, match=r"^deep:1: "):
        list(read_records(["[" * 100_000], name="deep"))


def test_huge_integer_recv_ms_is_a_trace_error() -> None:
    """A `recv_ms` integer beyond the float range is a TraceError, not an OverflowError."""
    text = '{"recv_ms": 1' + "0" * 400 + ', "topic": "t", "payload": "x"}'
    with pytest.raises(TraceError, match=r"^big:1: .*recv_ms"):
        list(read_records([text], name="big"))


def test_marks_round_trip_and_stay_out_of_read_records() -> None:
    """A mark line (`mark`, no `topic`) reads back as the mark `encode_mark` wrote, in file
    order with the records, through `read_trace`; `read_records` (the write-ahead log's
    reader) refuses it as a record without a topic, as it did before marks existed."""
    record = TraceRecord(1.0, TOPIC, b"{}")
    marks = [TraceMark(2.0, "stop"), TraceMark(3.0, "restart", 2.5), TraceMark(4.0, "resumed")]
    lines = [encode_record(record), *(encode_mark(mark) for mark in marks)]
    assert list(read_trace(lines)) == [record, *marks]
    assert json.loads(encode_mark(marks[0])) == {"recv_ms": 2.0, "mark": "stop"}
    with pytest.raises(TraceError, match="trace:2: topic must be a string"):
        list(read_records(lines))


def test_a_record_with_a_mark_key_is_still_a_record() -> None:
    """An old trace line with an unknown `mark` key beside its `topic` is a record, as
    before (unknown keys are ignored)."""
    text = line(recv_ms=1.0, topic=TOPIC, payload="{}", mark="stop")
    assert list(read_trace([text])) == [TraceRecord(1.0, TOPIC, b"{}")]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (line(recv_ms=1.0, mark="pause"), "mark must be one of"),
        (line(recv_ms=1.0, mark="stall"), "a stall mark needs since_ms"),
        (line(recv_ms=1.0, mark="restart", since_ms="x"), "since_ms must be a finite number"),
        (line(mark="stop"), "recv_ms must be a finite number"),
    ],
)
def test_a_bad_mark_names_its_line(text: str, says: str) -> None:
    """A malformed mark stops the reading with `name:line` and what is wrong."""
    with pytest.raises(TraceError, match=f"t.jsonl:1: {says}"):
        list(read_trace([text], name="t.jsonl"))
