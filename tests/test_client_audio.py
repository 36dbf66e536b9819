"""`edgemon.client` without a broker: PCM formats, exact durations, and every argument the
Reporter refuses (nothing invalid is queued), plus the package's light imports."""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgemon.client import AudioFormat, Reporter
from edgemon.client._events import Conflict, Streams

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

FORMATS = [
    AudioFormat.PCM_S16LE_24K_MONO,
    AudioFormat.PCM_S16LE_22K_MONO,
    AudioFormat.PCM_S16LE_44K_STEREO,
    AudioFormat.PCM_F32LE_48K_STEREO,
    AudioFormat("s24le", 24_000, 1),
    AudioFormat("s32be", 11_025, 2),
]


def test_formats_and_their_text_form() -> None:
    """Qwen3-TTS's 24 kHz s16le mono is 48,000 B/s; the text form parses back to the same
    format; frame sizes follow the encoding and channels; a partial frame counts nothing."""
    qwen = AudioFormat.PCM_S16LE_24K_MONO
    assert qwen.bytes_per_second == 48_000
    assert qwen.duration_ms(48_000) == 1000.0
    assert qwen.duration_ms(4_801) == 100.0
    assert AudioFormat.parse("s16le:24000:1") is not qwen
    assert AudioFormat.parse(" S16LE:24000:1 ") == qwen
    assert AudioFormat.of("f32le:48000:2") == AudioFormat.PCM_F32LE_48K_STEREO
    assert AudioFormat.PCM_F32LE_48K_STEREO.frame_bytes == 8
    assert AudioFormat("s24le", 48_000, 2).frame_bytes == 6
    for fmt in FORMATS:
        assert AudioFormat.parse(str(fmt)) == fmt
    assert AudioFormat.PCM_S16LE_22K_MONO.duration_ms(2 * 22_050 * 3) == 3000.0


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("s16le:24000", "ENCODING:RATE:CHANNELS"),
        ("pcm_s16le_24k_mono", "ENCODING:RATE:CHANNELS"),
        ("s16le:24k:1", "ENCODING:RATE:CHANNELS"),
        ("u8:8000:1", "unknown PCM encoding"),
        ("s16le:0:1", "sample rate"),
        ("s16le:24000:0", "channels"),
        ("s16le:24000:9", "channels"),
    ],
)
def test_bad_format_text(text: str, fragment: str) -> None:
    """A format string that is not ENCODING:RATE:CHANNELS with known parts names the problem."""
    with pytest.raises(ValueError, match=fragment):
        AudioFormat.parse(text)


@given(
    fmt=st.sampled_from(FORMATS),
    sizes=st.lists(st.integers(min_value=1, max_value=40_000), min_size=1, max_size=40),
)
def test_pcm_totals_are_exact(fmt: AudioFormat, sizes: list[int]) -> None:
    """Whatever byte counts arrive (partial frames included), each chunk's `audio_ms` is its
    whole frames (the carried remainder included), `audio_total_ms` is exactly the audio of
    all whole frames received so far (one rounding), and `seq` counts the chunks sent."""
    streams = Streams(max_streams=4)
    received = 0
    frames_sent = 0
    events = []
    for size in sizes:
        received += size
        event = streams.chunk(
            "s", 1.0, audio_ms=None, pcm_bytes=size, audio_format=fmt, eta_ms=None, final=False
        )
        whole = received // fmt.frame_bytes
        if event is None:
            assert whole == frames_sent  # nothing new to report: all carried
            continue
        events.append(event)
        assert event["audio_ms"] == float(Fraction((whole - frames_sent) * 1000, fmt.rate))
        assert event["audio_total_ms"] == float(Fraction(whole * 1000, fmt.rate))
        frames_sent = whole
    assert [e["seq"] for e in events] == list(range(len(events)))


def test_audio_ms_totals_and_final() -> None:
    """Given `audio_ms`, totals are exact sums; a final chunk closes the stream, after which
    `end()` sends nothing and a chunk is refused; a stream fed only a partial frame is ended
    without an event (edgemon never heard of it)."""
    streams = Streams(max_streams=4)
    chunk: dict[str, Any] = {"pcm_bytes": None, "audio_format": "s16le:24000:1", "eta_ms": None}
    totals = [
        streams.chunk("a", 1.0, audio_ms=ms, final=False, **chunk)["audio_total_ms"]  # type: ignore[index]
        for ms in (0.1, 0.2, 0.3)
    ]
    assert totals == [0.1, float(Fraction(0.1) + Fraction(0.2)), 0.6]  # exact, rounded once
    assert 0.1 + 0.2 + 0.3 == 0.6000000000000001  # what a float running sum would send
    last = streams.chunk("a", 2.0, audio_ms=40, final=True, **chunk)
    assert last is not None
    assert last["final"] is True
    assert last["seq"] == 3
    assert streams.end("a", 3.0, "completed") is None
    with pytest.raises(Conflict, match="has ended") as conflict:
        streams.chunk("a", 4.0, audio_ms=40, final=False, **chunk)
    assert conflict.value.kind == "ended"
    partial = streams.chunk(
        "b", 1.0, pcm_bytes=1, audio_ms=None, audio_format="s16le:24000:1", eta_ms=None,
        final=False,
    )  # fmt: skip
    assert partial is None
    assert streams.end("b", 2.0, "cancelled") is None
    assert streams._live == {}  # both ended: nothing live left


@contextlib.contextmanager
def _reporter(**kwargs: Any) -> Iterator[Reporter]:
    """A Reporter with no broker: its calls check and queue, nothing is sent; closed after."""
    reporter = Reporter("mqtt://127.0.0.1:1", "dev", clock=lambda: 1000.0, **kwargs)
    try:
        yield reporter
    finally:
        reporter.close(0.1)


BAD_CALLS: list[tuple[str, Callable[[Reporter], None], str]] = [
    ("stream id", lambda r: r.chunk("bad id", audio_ms=20), "must match"),
    ("empty stream id", lambda r: r.start(""), "must match"),
    ("long stream id", lambda r: r.start("s" * 129), "must match"),
    ("negative audio", lambda r: r.chunk("s", audio_ms=-1), "audio_ms must be 0 < x"),
    ("zero audio", lambda r: r.chunk("s", audio_ms=0), "audio_ms must be 0 < x"),
    ("huge audio", lambda r: r.chunk("s", audio_ms=600_001), "≤ 600000"),
    ("nan audio", lambda r: r.chunk("s", audio_ms=float("nan")), "finite"),
    ("bool audio", lambda r: r.chunk("s", audio_ms=True), "must be a number"),
    ("both", lambda r: r.chunk("s", audio_ms=20, pcm_bytes=960), "exactly one"),
    ("neither", lambda r: r.chunk("s"), "exactly one"),
    ("zero bytes", lambda r: r.chunk("s", pcm_bytes=0), "pcm_bytes must be an integer > 0"),
    ("float bytes", lambda r: r.chunk("s", pcm_bytes=9.5), "pcm_bytes must be an integer"),  # type: ignore[arg-type]
    ("huge pcm", lambda r: r.chunk("s", pcm_bytes=48_000 * 601, audio_format="s16le:24000:1"),
     "more than 600000"),
    ("format", lambda r: r.chunk("s", pcm_bytes=2, audio_format="mp3"), "ENCODING:RATE"),
    ("start format", lambda r: r.start("s", audio_format="wav"), "ENCODING:RATE"),
    ("no format", lambda r: r.chunk("s", pcm_bytes=2), "unknown audio format"),
    ("no format, started", lambda r: r.chunk("live", pcm_bytes=2), "unknown audio format"),
    ("eta", lambda r: r.chunk("s", audio_ms=20, eta_ms=-1), "eta_ms"),
    ("eta inf", lambda r: r.chunk("s", audio_ms=20, eta_ms=float("inf")), "eta_ms"),
    ("final type", lambda r: r.chunk("s", audio_ms=20, final=1), "final must be"),  # type: ignore[arg-type]
    ("empty final", lambda r: r.chunk("new", pcm_bytes=1, final=True, audio_format="s16le:24000:1"),
     "final chunk must hold"),
    ("margin", lambda r: r.start("s", margin_ms=60_001), "margin_ms"),
    ("play start", lambda r: r.start("s", play_start_ms=-5), "play_start_ms"),
    ("chunk play start", lambda r: r.chunk("s", audio_ms=20, play_start_ms=-5), "play_start_ms"),
    ("player", lambda r: r.start("s", player="buffer"), "'conceal' or 'rebuffer'"),
    ("reason", lambda r: r.end("live", reason="x" * 65), "at most 64"),
    ("bad args of an ended stream", lambda r: r.chunk("gone", audio_ms=-1), "audio_ms"),
    ("format switch", lambda r: r.chunk("odd", pcm_bytes=2, audio_format="s16le:16000:1"),
     "carries 1 bytes"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "call", "fragment"), BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_calls_raise_and_queue_nothing(
    name: str, call: Callable[[Reporter], None], fragment: str
) -> None:
    """Each argument edgemon would reject raises ValueError at the call with a message saying
    what is wrong, and queues no event (also for a stream that has ended: a bad argument is
    the caller's mistake whatever the stream's state)."""
    with _reporter(max_streams=3) as reporter:
        reporter.start("live")
        reporter.chunk("gone", audio_ms=20)
        reporter.end("gone")
        reporter.chunk("odd", pcm_bytes=1, audio_format="s16le:24000:1")
        before = reporter.stats.events
        with pytest.raises(ValueError, match=fragment):
            call(reporter)
        assert reporter.stats.events == before == 3
        assert not reporter.stats.conflicts


def _closed_then(reporter: Reporter) -> Reporter:
    """`reporter`, closed."""
    reporter.close(0.1)
    return reporter


CONFLICTS: list[tuple[str, Callable[[Reporter], None], str]] = [
    ("end twice", lambda r: r.end("gone"), "ended"),
    ("unknown end", lambda r: r.end("nobody"), "unknown"),
    ("chunk after end", lambda r: r.chunk("gone", audio_ms=20), "ended"),
    ("restart ended", lambda r: r.start("gone"), "ended"),
    ("start twice", lambda r: r.start("live"), "live"),
    ("past max_streams", lambda r: r.chunk("fourth", audio_ms=20), "max_streams"),
    ("after close", lambda r: _closed_then(r).chunk("live", audio_ms=20), "closed"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "call", "kind"), CONFLICTS, ids=[c[0] for c in CONFLICTS])
def test_state_conflicts_are_counted_and_logged_once_never_raised(
    name: str,
    call: Callable[[Reporter], None],
    kind: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A call the stream's state makes moot raises nothing into the player: it queues
    nothing, is counted in `stats.conflicts` by kind, and only its first occurrence is logged
    (a WARNING naming the stream)."""
    caplog.set_level(logging.DEBUG, logger="edgemon.client")
    with _reporter(max_streams=2) as reporter:
        reporter.start("live")
        reporter.chunk("gone", audio_ms=20)
        reporter.end("gone")
        reporter.chunk("third", audio_ms=20)
        before = reporter.stats.events
        for _ in range(3):
            call(reporter)
        assert reporter.stats.events == before == 4
        assert dict(reporter.stats.conflicts) == {kind: 3}
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and kind in r.message]
    assert len(warnings) == 1, [r.message for r in caplog.records]


def test_audio_format_given_once() -> None:
    """The audio format is given once, to `Reporter(...)` or to `start(...)`, and a chunk's
    `audio_format` overrides it for that chunk: 48 kHz stereo s16 (192,000 B/s) is counted as
    such, not as 24 kHz mono (4x the audio)."""
    streams = Streams(max_streams=4, audio_format=AudioFormat.PCM_S16LE_48K_STEREO)
    common: dict[str, Any] = {"audio_ms": None, "eta_ms": None, "final": False}
    events = [
        streams.chunk("a", 1.0, pcm_bytes=19_200, audio_format=None, **common),  # 100 ms
        streams.start("b", 1.0, play_start_ms=None, margin_ms=None, player=None,
                      audio_format="s16le:24000:1"),
        streams.chunk("b", 2.0, pcm_bytes=19_200, audio_format=None, **common),  # 400 ms
        streams.chunk("b", 3.0, pcm_bytes=19_200, audio_format="f32le:48000:2", **common),
    ]  # fmt: skip
    chunks = [
        (e["stream"], e["audio_ms"], e["audio_total_ms"])
        for e in events
        if e and e["type"] == "chunk"
    ]
    assert chunks == [("a", 100.0, 100.0), ("b", 400.0, 400.0), ("b", 50.0, 450.0)]
    with pytest.raises(ValueError, match="unknown audio format"):
        Streams(max_streams=1).chunk("c", 1.0, pcm_bytes=4, audio_format=None, **common)


def test_bad_construction_and_clock() -> None:
    """Bad device ids, prefixes, URLs and limits are refused at construction; a clock that
    returns a non-time is refused at the call; a closed Reporter refuses calls."""
    for kwargs, fragment in (
        ({"device": "a/b"}, "device"),
        ({"topic_prefix": "edgemon/+"}, "topic prefix"),
        ({"broker_url": "http://x"}, "broker URL"),
        ({"broker_url": "mqtt://u:p@h", "password": "q"}, "not both"),
        ({"max_buffered_events": 0}, "max_buffered_events"),
        ({"flush_ms": -1}, "flush_ms"),
    ):
        args: dict[str, Any] = {"broker_url": "mqtt://127.0.0.1:1", "device": "d"} | kwargs
        with pytest.raises(ValueError, match=fragment):
            Reporter(args.pop("broker_url"), args.pop("device"), **args)
    reporter = Reporter("mqtt://127.0.0.1:1", "d", clock=lambda: float("nan"))
    with pytest.raises(ValueError, match="t_ms"):
        reporter.chunk("s", audio_ms=20)
    reporter.close(0.1)
    with pytest.raises(RuntimeError, match="closed"):
        reporter.open()
    with _reporter(max_streams=2) as few:
        few.start("a")
        few.chunk("b", audio_ms=20)
        few.start("c")  # one too many: counted, not raised
        assert few.stats.conflicts == {"max_streams": 1}
        few.end("a")
        few.start("c")
        assert few.stats.events == 4


@pytest.mark.integration  # starts a process
def test_client_imports_nothing_heavy() -> None:
    """Importing `edgemon.client` (what a player or vLLM worker does) loads neither the
    daemon, nor pydantic, aiohttp, aiomqtt, structlog or prometheus_client."""
    code = (
        "import sys, edgemon.client\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "{'pydantic', 'aiohttp', 'aiomqtt', 'structlog', 'prometheus_client', 'asyncio'}"
        " or m.startswith(('edgemon.daemon', 'edgemon.settings', 'edgemon.adapters',"
        " 'edgemon.engine', 'edgemon.wire'))]\n"
        "print(bad)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"


_OP = st.one_of(
    st.tuples(st.sampled_from(FORMATS), st.integers(min_value=1, max_value=20_000)),
    st.floats(min_value=0.001, max_value=5_000, allow_nan=False),
)


@given(ops=st.lists(_OP, min_size=1, max_size=30))
def test_mixed_formats_and_audio_ms_totals_are_exact(ops: list[Any]) -> None:
    """A stream whose chunks switch formats and mix `audio_ms` with PCM bytes still reports
    the exact total (of the whole frames and the given milliseconds, rounded once); a switch
    of format while a partial frame is carried is refused and changes nothing."""
    streams = Streams(max_streams=1)
    total = Fraction(0)
    carry, carry_format = 0, None
    for op in ops:
        common: dict[str, Any] = {"eta_ms": None, "final": False}
        if isinstance(op, float):
            event = streams.chunk(
                "s", 1.0, audio_ms=op, pcm_bytes=None, audio_format="s16le:24000:1", **common
            )
            total += Fraction(op)
        else:
            fmt, size = op
            if carry and fmt != carry_format:
                with pytest.raises(ValueError, match="partial"):
                    streams.chunk(
                        "s", 1.0, audio_ms=None, pcm_bytes=size, audio_format=fmt, **common
                    )
                continue
            event = streams.chunk(
                "s", 1.0, audio_ms=None, pcm_bytes=size, audio_format=fmt, **common
            )
            frames, carry = divmod(size + carry, fmt.frame_bytes)
            carry_format = fmt if carry else None
            total += Fraction(frames * 1000, fmt.rate)
            if not frames:
                assert event is None
                continue
        assert event is not None
        assert event["audio_total_ms"] == float(total)


def test_defaults_match_the_daemons_limits() -> None:
    """The Reporter's batch limits and stream bound are edgemon's `[limits]` defaults, so its
    batches are never `oversized` and its streams never over `stream_limit` by default."""
    from edgemon.client import reporter as module  # noqa: PLC0415 - next to the daemon's
    from edgemon.settings import LimitsSettings  # noqa: PLC0415 - what the client must not import

    limits = LimitsSettings()
    assert limits.max_batch_events == module.MAX_BATCH_EVENTS
    assert limits.max_payload_bytes == module.MAX_PAYLOAD_BYTES
    assert Reporter("mqtt://127.0.0.1:1", "d")._streams.max_streams == (
        limits.max_streams_per_device
    )
