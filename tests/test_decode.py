"""Payload decoding (docs/protocol.md, docs/reliability.md): events validated one by one,
engine objects, never a crash."""

from __future__ import annotations

import gc
import json
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgemon.engine.events import ChunkEvent, EndEvent, StartEvent
from edgemon.engine.tts import TtsEngineInfo
from edgemon.wire.decode import (
    MAX_KNOWN_IDS,
    Problem,
    decode_engine,
    decode_events,
    parse_json,
    parted_events,
)

from properties import examples

if TYPE_CHECKING:
    from edgemon.engine.events import Event

MAX_BYTES = 262_144
MAX_BATCH = 1_000
#: The result labels a decoding problem may carry (runbook.md `edgemon_messages_total{result}`).
DECODE_REASONS = frozenset({"invalid_json", "invalid_event", "oversized"})

CHUNK: dict[str, Any] = {"type": "chunk", "stream": "s1", "t_ms": 1000, "seq": 0, "audio_ms": 200}
START: dict[str, Any] = {"type": "start", "stream": "s1", "t_ms": 900}
END: dict[str, Any] = {"type": "end", "stream": "s1", "t_ms": 2000, "reason": "cancelled"}
GEOMETRY = {"num_layers": 28, "num_kv_heads": 8, "head_dim": 128}
GiB = 1024**3
#: A Qwen3-TTS talker on 4 GiB: 9 sequences of 4096 tokens fit (the README's kv-budget
#: example geometry).
ENGINE: dict[str, Any] = {
    "kv_cache_bytes": 4 * GiB,
    "max_num_seqs": 8,
    "max_model_len": 4096,
    "geometry": GEOMETRY,
}


def payload(value: Any) -> bytes:
    """`value` as a JSON payload (raw text is passed through as UTF-8)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value).encode()


def decode(
    value: Any, *, max_bytes: int = MAX_BYTES, max_batch: int = MAX_BATCH
) -> list[Event | Problem] | Problem:
    """`decode_events` of a JSON value, raw text or bytes, with the default limits."""
    return decode_events(payload(value), max_bytes=max_bytes, max_batch=max_batch)


def one(value: Any) -> Event | Problem:
    """The single verdict for a payload holding one event object."""
    result = decode(value)
    assert isinstance(result, list), result
    assert len(result) == 1
    return result[0]


def rejected(value: Any) -> Problem:
    """The `invalid_event` problem of a payload holding one invalid event object."""
    result = one(value)
    assert isinstance(result, Problem), result
    assert result.reason == "invalid_event"
    return result


def chunk(**changes: Any) -> dict[str, Any]:
    """The reference chunk with some fields changed."""
    return {**CHUNK, **changes}


# ---------------------------------------------------------------------------- events


def test_single_chunk_event() -> None:
    """One event object decodes to one event with every field, numbers as floats."""
    event = one(chunk(eta_ms=120, final=True, audio_total_ms=200, play_start_ms=1000))
    assert event == ChunkEvent(
        stream="s1",
        t_ms=1000.0,
        seq=0,
        audio_ms=200.0,
        eta_ms=120.0,
        final=True,
        audio_total_ms=200.0,
        play_start_ms=1000.0,
    )
    assert isinstance(event, ChunkEvent)
    assert isinstance(event.t_ms, float)
    assert isinstance(event.seq, int)


def test_single_start_and_end_events() -> None:
    """Start and end events decode with their optional fields, absent ones as None."""
    start = {**START, "play_start_ms": 950, "margin_ms": 100, "player": "rebuffer"}
    assert one(start) == StartEvent(
        stream="s1",
        t_ms=900.0,
        play_start_ms=950.0,
        margin_ms=100.0,
        player="rebuffer",
    )
    assert one(START) == StartEvent(stream="s1", t_ms=900.0)
    assert one(END) == EndEvent(stream="s1", t_ms=2000.0, reason="cancelled")
    assert one({"type": "end", "stream": "s1", "t_ms": 0}) == EndEvent(
        stream="s1", t_ms=0.0, reason=None
    )


def test_batch_keeps_order() -> None:
    """A JSON array is a batch: one verdict per item, in the array's order."""
    result = decode([START, CHUNK, chunk(seq=1, t_ms=1200), END])
    assert isinstance(result, list)
    assert [type(e) for e in result] == [StartEvent, ChunkEvent, ChunkEvent, EndEvent]
    assert [getattr(e, "seq", None) for e in result] == [None, 0, 1, None]


def test_unknown_fields_are_ignored() -> None:
    """Unknown fields, at any depth, are ignored (forward compatibility)."""
    extra = {"future": {"nested": [1, 2, {"x": None}]}, "codec": "opus", "seq2": "x"}
    assert one({**CHUNK, **extra}) == one(CHUNK)
    assert one({**START, **extra}) == one(START)
    assert one({**END, **extra}) == one(END)


def test_optional_fields_may_be_null() -> None:
    """An optional number given as JSON null is the same as leaving it out."""
    assert one(chunk(eta_ms=None, audio_total_ms=None, play_start_ms=None)) == one(CHUNK)


def test_batch_is_validated_per_event() -> None:
    """In a batch the valid events survive and every invalid one gets its own Problem."""
    items = [
        START,
        chunk(seq=-1),  # invalid
        CHUNK,
        {"type": "nope", "stream": "s1", "t_ms": 1},  # invalid
        chunk(seq=1, t_ms=1200, audio_ms=0),  # invalid
        END,
    ]
    result = decode(items)
    assert isinstance(result, list)
    assert len(result) == len(items)
    assert result[0] == one(START)
    assert result[2] == one(CHUNK)
    assert result[5] == one(END)
    problems = [p for p in result if isinstance(p, Problem)]
    assert problems == [result[1], result[3], result[4]]
    assert all(p.reason == "invalid_event" for p in problems)
    assert "seq" in problems[0].detail
    assert "audio_ms" in problems[2].detail


@pytest.mark.parametrize(
    ("bad", "field"),
    [("NaN", "t_ms"), ("-Infinity", "eta_ms"), ("1e400", "audio_total_ms"), ("1e400", "seq")],
)
def test_a_batch_with_numbers_msgspec_cannot_parse_keeps_its_valid_events(
    bad: str, field: str
) -> None:
    """A number msgspec's parser refuses (NaN, ±Infinity, one out of its range) costs only the
    event holding it: the payload is parsed again by pydantic-core's parser, event by event."""
    text = json.dumps([START, chunk(**{field: 12345}), CHUNK])
    text = text.replace(f'"{field}": 12345', f'"{field}": {bad}')
    assert bad in text
    result = decode(text)
    assert isinstance(result, list)
    assert result[0] == one(START)
    assert result[2] == one(CHUNK)
    assert isinstance(result[1], Problem)
    assert result[1].reason == "invalid_event"
    assert field in result[1].detail


def test_events_are_not_tracked_by_the_garbage_collector() -> None:
    """Events hold only numbers, strings and booleans: tens of thousands of held or batched
    events add nothing to what a collection has to traverse."""
    events = decode([START, CHUNK, END])
    assert isinstance(events, list)
    assert events
    assert not any(gc.is_tracked(event) for event in events)


def test_non_object_items_of_a_batch_are_each_rejected() -> None:
    """Numbers, strings, nulls, booleans and arrays inside a batch are invalid events, one each."""
    result = decode([1, "chunk", None, True, [CHUNK], CHUNK])
    assert isinstance(result, list)
    assert len(result) == 6
    for item in result[:5]:
        assert isinstance(item, Problem)
        assert item.reason == "invalid_event"
    assert result[5] == one(CHUNK)


def test_empty_batch_is_one_problem() -> None:
    """An empty array is rejected as a message (nothing to count per event)."""
    assert decode([]) == Problem("invalid_event", "empty batch")


@pytest.mark.parametrize("value", [1, "x", None, True, 1.5])
def test_top_level_scalar_is_one_problem(value: Any) -> None:
    """A JSON value that is neither object nor array is rejected as a message."""
    result = decode(json.dumps(value).encode())
    assert isinstance(result, Problem)
    assert result.reason == "invalid_event"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seq", 1.0),  # a float is not an int, even a whole one
        ("seq", "1"),
        ("seq", True),
        ("seq", None),
        ("seq", -1),
        ("seq", 2**53 + 1),
        ("t_ms", "1000"),
        ("t_ms", True),
        ("t_ms", None),
        ("t_ms", -1),
        ("audio_ms", "200"),
        ("audio_ms", False),
        ("final", 1),
        ("final", "true"),
        ("final", None),
        ("eta_ms", -1),
        ("eta_ms", "5"),
        ("stream", 5),
        ("stream", None),
        ("type", "CHUNK"),
    ],
)
def test_strict_types(field: str, value: Any) -> None:
    """Strict JSON: no coercion of strings, booleans or floats; the detail names the field."""
    problem = rejected(chunk(**{field: value}))
    assert field in problem.detail or field == "type"


@pytest.mark.parametrize("field", ["seq", "audio_ms", "t_ms", "stream", "type"])
def test_required_chunk_fields(field: str) -> None:
    """A chunk without one of `type`, `stream`, `t_ms`, `seq`, `audio_ms` is invalid."""
    item = dict(CHUNK)
    del item[field]
    rejected(item)


def test_integer_times_are_accepted_as_numbers() -> None:
    """`t_ms` (and the other ms fields) may be JSON integers or fractions."""
    event = one(chunk(t_ms=1700000000123, audio_ms=80.5))
    assert isinstance(event, ChunkEvent)
    assert event.t_ms == 1700000000123.0
    assert event.audio_ms == 80.5


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("field", ["t_ms", "audio_ms", "eta_ms", "audio_total_ms", "play_start_ms"])
def test_non_finite_numbers_are_rejected(field: str, literal: str) -> None:
    """NaN and ±Infinity (non-standard JSON literals) are never taken as times or amounts."""
    body = json.dumps(chunk(**{field: 0}))
    text = body.replace(f'"{field}": 0', f'"{field}": {literal}')
    assert literal in text
    result = decode(text)
    problem = result[0] if isinstance(result, list) else result
    assert isinstance(problem, Problem)
    assert problem.reason in {"invalid_event", "invalid_json"}


@pytest.mark.parametrize("field", ["t_ms", "play_start_ms", "audio_total_ms"])
def test_huge_times_are_rejected(field: str) -> None:
    """1e308 is a finite JSON number, but not a usable millisecond time."""
    problem = rejected(chunk(**{field: 1e308}))
    assert field in problem.detail


def test_start_margin_and_player_are_checked() -> None:
    """A start's `margin_ms` must be a sane number and `player` one of the two models."""
    rejected({**START, "margin_ms": -1})
    rejected({**START, "margin_ms": 1e308})
    rejected({**START, "margin_ms": "80"})
    rejected({**START, "player": "pause"})


@pytest.mark.parametrize("audio", [0, -1, -0.001, 600_000.001, 1e308])
def test_audio_ms_out_of_range(audio: float) -> None:
    """`audio_ms` must satisfy 0 < x ≤ 600000."""
    assert "audio_ms" in rejected(chunk(audio_ms=audio)).detail


@pytest.mark.parametrize("audio", [0.001, 1, 600_000])
def test_audio_ms_in_range(audio: float) -> None:
    """Any `audio_ms` in (0, 600000] is accepted, the bound included."""
    event = one(chunk(audio_ms=audio))
    assert isinstance(event, ChunkEvent)
    assert event.audio_ms == audio


@pytest.mark.parametrize(
    "stream", ["a" * 128, "a", "A-z.0_9:x", "tts:req-42.part_1", "0", ":", "-", "."]
)
def test_valid_stream_ids(stream: str) -> None:
    """`[A-Za-z0-9._:-]{1,128}` are stream ids, 128 characters included."""
    for item in (chunk(stream=stream), {**START, "stream": stream}, {**END, "stream": stream}):
        assert getattr(one(item), "stream", None) == stream


@pytest.mark.parametrize(
    "stream", ["a" * 129, "", "a b", "a/b", "a+b", "a#", "é", "a\n", "a\x00", "s\u200b"]
)
def test_invalid_stream_ids(stream: str) -> None:
    """Stream ids longer than 128, empty, or with other characters are rejected."""
    for item in (chunk(stream=stream), {**START, "stream": stream}, {**END, "stream": stream}):
        assert "stream" in rejected(item).detail


#: msgspec's words for a stream id that does not match (each event is judged alone).
ID_MISMATCH = Problem(
    "invalid_event", "Expected `str` matching regex '^[A-Za-z0-9._:-]{1,128}\\\\Z' - at `$.stream`"
)


def test_an_invalid_stream_id_among_known_ones_gets_msgspec_words() -> None:
    """Ids already seen are not matched again, and a batch with one that does not match keeps
    its other events and says what msgspec says of the invalid one."""
    known = [chunk(stream=f"known-{i}", seq=i) for i in range(3)]
    first = decode(known)  # now known
    assert isinstance(first, list)
    assert all(isinstance(e, ChunkEvent) for e in first)
    result = decode([known[0], chunk(stream="a b"), known[2], {**END, "stream": "é"}])
    assert isinstance(result, list)
    assert result[0] == one(known[0])
    assert result[2] == one(known[2])
    assert result[1] == result[3] == ID_MISMATCH
    assert rejected(chunk(stream="a b")) == ID_MISMATCH


def test_stream_ids_beyond_the_ones_remembered_are_still_matched() -> None:
    """More distinct ids than the decoder remembers: each valid one is still accepted and an
    invalid one refused, before and after the remembered ones are forgotten."""
    for i in range(MAX_KNOWN_IDS + 10):
        assert isinstance(one(chunk(stream=f"req-{i}")), ChunkEvent)
        if i % 1000 == 0:
            assert "stream" in rejected(chunk(stream=f"req {i}")).detail
    assert isinstance(one(chunk(stream="req-0")), ChunkEvent)
    assert "stream" in rejected(chunk(stream="req 0")).detail


@pytest.mark.parametrize(
    "body",
    [
        json.dumps([START, CHUNK, END]),
        json.dumps([START, chunk(stream="a b"), CHUNK, {"type": "nope"}, END]),
        json.dumps([START, CHUNK, END]).replace('"t_ms": 2000', '"t_ms": NaN'),
        json.dumps(START),
    ],
)
def test_events_are_the_engine_types_on_every_path(body: str) -> None:
    """Whichever way a payload is decoded (in one go, event by event, or parsed by
    pydantic-core), its valid events are exactly the engine's structs (the engine dispatches
    on `type(event)`)."""
    result = decode(body)
    assert isinstance(result, list)
    engine_types = {StartEvent, ChunkEvent, EndEvent}
    types = [type(item) for item in result if not isinstance(item, Problem)]
    assert types
    assert set(types) <= engine_types


def test_end_reason_length() -> None:
    """An end `reason` may have up to 64 characters; 65 are rejected."""
    event = one({**END, "reason": "r" * 64})
    assert isinstance(event, EndEvent)
    assert event.reason == "r" * 64
    assert "reason" in rejected({**END, "reason": "r" * 65}).detail
    assert "reason" in rejected({**END, "reason": 5}).detail


def test_oversized_payload() -> None:
    """A payload longer than `max_bytes` is `oversized` before it is parsed; the limit is ≤."""
    body = payload(CHUNK)
    assert decode(body, max_bytes=len(body)) == [one(CHUNK)]
    result = decode(body, max_bytes=len(body) - 1)
    assert isinstance(result, Problem)
    assert result.reason == "oversized"
    garbage = b"\xff" * 100  # not even JSON: the size is checked first
    assert decode(garbage, max_bytes=99) == Problem("oversized", "payload of 100 bytes > 99")


def test_oversized_batch() -> None:
    """A batch of more than `max_batch` items is rejected whole as `oversized`; the limit is ≤."""
    batch = [chunk(seq=i, t_ms=1000 + i) for i in range(5)]
    result = decode(batch, max_batch=5)
    assert isinstance(result, list)
    assert len(result) == 5
    too_many = decode(batch, max_batch=4)
    assert isinstance(too_many, Problem)
    assert too_many.reason == "oversized"
    assert "5" in too_many.detail


@pytest.mark.parametrize(
    "body",
    [
        b"\xff\xfe\x00",  # not UTF-8
        b'{"type":"end","stream":"s1","t_ms":1,"reason":"\xff"}',  # bad byte inside a string
        b'{"type":"end","stream":"s1"',  # truncated
        b'[{"type":"end","stream":"s1","t_ms":1},',  # truncated batch
        b"",
        b"   ",
        b'{"type":"end","stream":"s1","t_ms":1} trailing',
        b"{'type': 'end'}",
        b'{"type":"end","stream":"\\ud800","t_ms":1}',  # lone surrogate escape
        b"\xef\xbb\xbf" + payload(END),  # UTF-8 byte order mark
        "{}".encode("utf-16"),
    ],
)
def test_invalid_json(body: bytes) -> None:
    """Bytes that are not UTF-8 JSON are one `invalid_json` problem for the whole message."""
    result = decode(body)
    assert isinstance(result, Problem)
    assert result.reason == "invalid_json"


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000,
        b"[" * 10_000 + b"]" * 10_000,
        b'{"a":' * 10_000 + b"1" + b"}" * 10_000,
        b'{"type":"end","stream":"s1","t_ms":1,"x":' + b"[" * 10_000 + b"]" * 10_000 + b"}",
    ],
)
def test_deeply_nested_json_is_invalid_json(body: bytes) -> None:
    """Deeply nested JSON is rejected as `invalid_json` without raising (no RecursionError)."""
    result = decode(body)
    assert isinstance(result, Problem)
    assert result.reason == "invalid_json"


def test_problem_details_are_short_single_lines() -> None:
    """A problem's detail is one line of at most 200 characters, without echoing the input."""
    huge = "x" * 5000
    problems = [
        rejected(chunk(stream=huge)),
        rejected({"type": huge, "stream": "s", "t_ms": 1}),
        rejected({**END, "reason": huge}),
    ]
    batch = decode([{"a": 1}, {"type": "chunk"}])
    assert isinstance(batch, list)
    problems += [p for p in batch if isinstance(p, Problem)]
    for problem in problems:
        assert "\n" not in problem.detail
        assert 0 < len(problem.detail) <= 200
        assert huge not in problem.detail


# ---------------------------------------------------------------------------- engine objects


def engine(value: Any) -> TtsEngineInfo | Problem:
    """`decode_engine` of an engine payload, parsed as the monitor does."""
    parsed = parse_json(payload(value), max_bytes=MAX_BYTES)
    return parsed if isinstance(parsed, Problem) else decode_engine(parsed)


def test_engine_with_geometry_gives_kv_verdict() -> None:
    """A complete engine object yields the README's kv-budget verdict (114688 bytes per token)."""
    info = engine(ENGINE)
    assert isinstance(info, TtsEngineInfo)
    assert info.kv_error is None
    assert info.kv is not None
    assert info.kv.bytes_per_token == 114_688
    assert info.kv.bytes_per_seq == 4096 * 114_688
    assert info.kv.max_seqs_without_preemption == 9
    assert info.kv.admission_ok is True
    assert info.margin is None


def test_engine_negative_verdict_is_kept() -> None:
    """An engine that would preempt is a verdict (admission_ok False), not an error."""
    info = engine({**ENGINE, "max_num_seqs": 10})
    assert isinstance(info, TtsEngineInfo)
    assert info.kv is not None
    assert info.kv.admission_ok is False


def test_engine_with_hf_config() -> None:
    """`hf_config` (talker_config preferred) gives the same geometry as explicit numbers."""
    talker = {
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "hidden_size": 2048,  # head_dim comes from head_dim when present
        "head_dim": 128,
    }
    hf_config = {"num_hidden_layers": 2, "talker_config": talker}
    info = engine({k: v for k, v in ENGINE.items() if k != "geometry"} | {"hf_config": hf_config})
    assert isinstance(info, TtsEngineInfo)
    assert info.kv is not None
    assert info.kv.bytes_per_token == 114_688


def test_engine_kv_dtype_halves_the_bytes() -> None:
    """`kv_cache_dtype` fp8 stores one byte per element instead of the model's two."""
    info = engine({**ENGINE, "kv_cache_dtype": "fp8"})
    assert isinstance(info, TtsEngineInfo)
    assert info.kv is not None
    assert info.kv.bytes_per_token == 114_688 // 2


@pytest.mark.parametrize(
    ("changes", "names"),
    [
        ({"dtype": "bfloat17"}, "bfloat17"),
        ({"kv_cache_dtype": "int3"}, "int3"),
        ({"kv_cache_bytes": 0}, "kv_cache_bytes"),
        ({"max_model_len": None}, "max_model_len"),
        ({"geometry": {"num_layers": 28, "num_kv_heads": 0, "head_dim": 128}}, "num_kv_heads"),
        ({"block_size": -16}, "block_size"),
    ],
)
def test_engine_kv_errors_are_kept_not_rejected(changes: dict[str, Any], names: str) -> None:
    """A KV part that cannot be judged is kept as `kv_error`, naming the culprit; rest applies."""
    info = engine({**ENGINE, **changes, "margin_ms": 42})
    assert isinstance(info, TtsEngineInfo)
    assert info.kv is None
    assert info.kv_error is not None
    assert names in info.kv_error
    assert info.margin == 42


def test_engine_without_kv_fields_has_no_verdict() -> None:
    """An engine object with only a margin or a hardware class carries no KV verdict or error."""
    info = engine({"hardware_class": "jetson", "vendor": "x"})
    assert info == TtsEngineInfo(hardware_class="jetson")


@pytest.mark.parametrize(
    ("hardware", "margin"),
    [("cuda", 50), ("jetson", 80), ("x86", 120), ("arm64", 160), ("npu", 200)],
)
def test_engine_hardware_class_margin(hardware: str, margin: float) -> None:
    """The hardware class gives the semantics.md margin; an explicit `margin_ms` wins over it."""
    info = engine({"hardware_class": hardware})
    assert isinstance(info, TtsEngineInfo)
    assert info.margin == margin
    explicit = engine({"hardware_class": hardware, "margin_ms": 7.5})
    assert isinstance(explicit, TtsEngineInfo)
    assert explicit.margin == 7.5


@pytest.mark.parametrize(
    "value",
    [
        {"kv_cache_bytes": "4GiB"},
        {"kv_cache_bytes": 1.0},
        {"max_num_seqs": True},
        {"max_model_len": "4096"},
        {"block_size": 16.0},
        {"dtype": 2},
        {"geometry": [28, 8, 128]},
        {"geometry": {"num_layers": "28", "num_kv_heads": 8, "head_dim": 128}},
        {"geometry": {"num_layers": 28}},
        {"hf_config": "config.json"},
        {"hardware_class": "tpu"},
        {"margin_ms": -1},
        {"margin_ms": "80"},
        {"margin_ms": 1e308},
        {"margin_ms": True},
    ],
)
def test_engine_wrong_types_are_rejected(value: dict[str, Any]) -> None:
    """Fields of the wrong type or out of range reject the engine object as `invalid_event`."""
    result = engine({**ENGINE, **value})
    assert isinstance(result, Problem)
    assert result.reason == "invalid_event"


@pytest.mark.parametrize("value", [[], [ENGINE], None, 1, "engine", True])
def test_engine_must_be_an_object(value: Any) -> None:
    """An engine payload that is not a JSON object is `invalid_event`."""
    result = engine(json.dumps(value).encode())
    assert isinstance(result, Problem)
    assert result.reason == "invalid_event"


@pytest.mark.parametrize(
    "body",
    [b"\xff", b'{"margin_ms": 5', b"", b"[" * 100_000, b'{"a":' * 10_000],
)
def test_engine_payload_invalid_json(body: bytes) -> None:
    """Engine payloads that are not UTF-8 JSON (bad bytes, cut short, deep) are `invalid_json`."""
    result = parse_json(body, max_bytes=MAX_BYTES)
    assert isinstance(result, Problem)
    assert result.reason == "invalid_json"


def test_engine_payload_oversized() -> None:
    """An engine payload over `max_bytes` is `oversized`."""
    body = payload(ENGINE)
    assert parse_json(body, max_bytes=len(body)) == ENGINE
    result = parse_json(body, max_bytes=len(body) - 1)
    assert isinstance(result, Problem)
    assert result.reason == "oversized"


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32-le", "utf-8-sig"])
def test_engine_payload_must_be_utf8(encoding: str) -> None:
    """An engine payload in another encoding than UTF-8 is `invalid_json`, as for events."""
    result = parse_json(json.dumps({"margin_ms": 5}).encode(encoding), max_bytes=MAX_BYTES)
    assert isinstance(result, Problem)
    assert result.reason == "invalid_json"


# ---------------------------------------------------------------------------- never raises

_TEXT = st.text(
    st.one_of(
        st.characters(),
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, exclude_categories=()),
    ),
    max_size=8,
)
_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),  # NaN and ±inf are written as NaN / Infinity
    _TEXT,
    st.sampled_from(["start", "chunk", "end", "s1", "conceal", "rebuffer", "fp8", "x86"]),
)
JSON = st.recursive(
    _LEAVES,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_TEXT, children, max_size=4),
    max_leaves=20,
)
_EVENT_KEYS: tuple[str, ...] = ("stream", "t_ms", "seq", "audio_ms", "eta_ms", "final")
_EVENT_KEYS += ("audio_total_ms", "play_start_ms", "margin_ms", "player", "reason")
EVENT_LIKE = st.builds(
    lambda kind, fields: {"type": kind, **fields},
    st.sampled_from(["start", "chunk", "end"]),
    st.dictionaries(st.sampled_from(_EVENT_KEYS), JSON, max_size=6),
)
_ENGINE_KEYS: tuple[str, ...] = (
    *ENGINE,
    "block_size",
    "dtype",
    "kv_cache_dtype",
    "hf_config",
    "margin_ms",
)
_ENGINE_KEYS += ("hardware_class", "num_layers", "num_kv_heads", "head_dim", "talker_config")
_ENGINE_KEYS += ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size")
ENGINE_LIKE = st.recursive(
    st.dictionaries(st.sampled_from(_ENGINE_KEYS), _LEAVES | st.integers(1, 64), max_size=6),
    lambda children: st.dictionaries(
        st.sampled_from(_ENGINE_KEYS), _LEAVES | children | st.integers(1, 2**40), max_size=8
    ),
    max_leaves=10,
)
FUZZ = settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def check_verdicts(result: object, *, items: int | None = None) -> None:
    """A decode result is a Problem with a known reason, or one verdict per item."""
    if isinstance(result, Problem):
        assert result.reason in DECODE_REASONS
        assert "\n" not in result.detail
        return
    assert isinstance(result, list)
    assert result
    if items is not None:
        assert len(result) == items
    for item in result:
        assert isinstance(item, StartEvent | ChunkEvent | EndEvent | Problem)
        if isinstance(item, Problem):
            assert item.reason == "invalid_event"


@FUZZ
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise(body: bytes) -> None:
    """No byte string makes `decode_events` or `parse_json`/`decode_engine` raise."""
    check_verdicts(decode_events(body, max_bytes=200, max_batch=5))
    parsed = parse_json(body, max_bytes=200)
    if not isinstance(parsed, Problem):
        assert isinstance(decode_engine(parsed), TtsEngineInfo | Problem)


@FUZZ
@given(st.one_of(JSON, EVENT_LIKE, st.lists(EVENT_LIKE | JSON, max_size=6)))
def test_arbitrary_json_never_raises(value: Any) -> None:
    """No JSON value makes decoding raise; a batch gets exactly one verdict per item."""
    body = json.dumps(value).encode()
    result = decode_events(body, max_bytes=MAX_BYTES, max_batch=MAX_BATCH)
    check_verdicts(result, items=len(value) if isinstance(value, list) and value else None)
    if isinstance(value, dict):  # one event's verdict, unless the text itself is bad
        assert isinstance(result, list) or result.reason == "invalid_json"
    info = decode_engine(value)
    assert isinstance(info, TtsEngineInfo | Problem)
    parsed = parse_json(body, max_bytes=MAX_BYTES)
    assert not isinstance(parsed, Problem) or parsed.reason == "invalid_json"


@FUZZ
@given(st.lists(EVENT_LIKE | JSON, min_size=1, max_size=6))
def test_batch_item_verdict_equals_single_verdict(items: list[Any]) -> None:
    """Each object of a batch gets the verdict it would get alone (validation is per event)."""
    result = decode(items)
    if isinstance(result, Problem):  # e.g. a string with a lone surrogate: the whole payload
        assert result.reason == "invalid_json"
        return
    assert len(result) == len(items)
    for item, verdict in zip(items, result, strict=True):
        if not isinstance(item, dict):
            assert isinstance(verdict, Problem)
            continue
        alone = one(item)
        if isinstance(alone, Problem):
            assert isinstance(verdict, Problem)
            assert verdict.reason == alone.reason
        else:
            assert verdict == alone


@FUZZ
@given(st.one_of(JSON, EVENT_LIKE, st.lists(EVENT_LIKE | JSON, max_size=6)))
def test_parted_events_are_the_verdicts_parted(value: Any) -> None:
    """`parted_events` gives the valid events and the problems of `decode_events`, each in
    their order, or the same problem with the whole payload."""
    body = json.dumps(value).encode()
    verdicts = decode_events(body, max_bytes=MAX_BYTES, max_batch=5)
    parted = parted_events(body, max_bytes=MAX_BYTES, max_batch=5)
    if isinstance(verdicts, Problem):
        assert parted == verdicts
        return
    assert parted == (
        [v for v in verdicts if not isinstance(v, Problem)],
        [v for v in verdicts if isinstance(v, Problem)],
    )


@FUZZ
@given(ENGINE_LIKE)
def test_engine_like_objects_never_raise(value: dict[str, Any]) -> None:
    """Engine-shaped objects with arbitrary values give an engine info or a Problem, never raise."""
    info = decode_engine(value)
    if isinstance(info, Problem):
        assert info.reason == "invalid_event"
    else:
        assert isinstance(info, TtsEngineInfo)
        assert info.kv is None or info.kv_error is None
