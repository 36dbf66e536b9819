"""The capacity object read one way (docs/protocol.md, "Capacity object"): the daemon and the
engine's shedding middleware take every payload to the same object, or both find it
unreadable (they used two models with two validations, which disagreed); a count may be
written as a whole number in any JSON form; only UTF-8 is JSON."""

from __future__ import annotations

import pytest

from edgemon.broker_url import Broker
from edgemon.capacity_object import Capacity, Unreadable, read_capacity
from edgemon.protocol import MAX_START_WAIT_MS
from edgemon.shedding.middleware import CapacityView
from edgemon.shedding.topic import TopicConfig, read_shed_count
from edgemon.wire.decode import Problem, decode_capacity

T_S = 1_764_000_000.0
#: Payloads on which the two readers disagreed before, and some they agreed on.
PAYLOADS = [
    b'{"running": 3.0, "waiting": 1e2, "shed_total": 0.0}',
    b'{"t_ms": 9007199254740993}',
    b'{"t_ms": 9007199254740992}',
    b'{"s": "\\ud800", "running": 1}',
    '{"running": 2}'.encode("utf-16"),
    b'\xef\xbb\xbf{"running": 2}',
    b'{"running": 1.5}',
    b'{"running": true}',
    b'{"start_wait_ms": 1e300}',
    b'{"start_wait_ms": 7200000}',
    b'{"start_wait_ms": NaN}',
    b'{"realtime_streams": 8, "running": 3, "t_ms": 1764000000000.5}',
    b"[]",
    b"{}",
]


def middleware_reads(payload: bytes) -> Capacity | None:
    """What the engine's shedding middleware keeps of `payload` on device a's topic (None:
    unreadable, nothing kept)."""
    view = CapacityView(TopicConfig(Broker("127.0.0.1", 1), ("a",)), wall=lambda: T_S)
    view.receive("edgemon/v1/a/capacity", payload)
    assert view.received + view.unreadable == 1
    return view.readings().get("a")


@pytest.mark.parametrize("payload", PAYLOADS)
def test_the_daemon_and_the_middleware_read_an_object_alike(payload: bytes) -> None:
    """Each payload is, for the daemon and for the engine's middleware, the same object or
    unreadable to both (before: `3.0` was a count to one and unreadable to the other, and a
    `t_ms` beyond 2^53 the other way round)."""
    daemon = decode_capacity(payload, max_bytes=1000)
    middleware = middleware_reads(payload)
    if isinstance(daemon, Problem):
        assert middleware is None
    else:
        assert middleware == daemon


def test_a_whole_count_is_a_count_in_any_json_form() -> None:
    """`3`, `3.0` and `3e0` are the count 3 (an integer in JSON's sense); `3.5` is no count."""
    for written in (b"3", b"3.0", b"3e0"):
        assert read_capacity(b'{"running": %s}' % written) == Capacity(running=3)
    assert read_capacity(b'{"running": 3.5}') == Unreadable(
        "invalid_event", "running: expected a whole number, got 3.5"
    )


@pytest.mark.parametrize(
    "payload",
    [b'{"t_ms": NaN}', b"\xff\xfe", '{"running": 2}'.encode("utf-16"), b"\xef\xbb\xbf{}"],
    ids=["NaN", "not UTF-8", "UTF-16", "a byte-order mark"],
)
def test_only_standard_json_is_read(payload: bytes) -> None:
    """Standard JSON only: no NaN, UTF-8 without a byte-order mark (Python's `json` would
    take UTF-16 and UTF-32 bytes): `invalid_json`."""
    read = read_capacity(payload)
    assert isinstance(read, Unreadable)
    assert read.reason == "invalid_json"


def test_fields_out_of_range_make_the_whole_object_unreadable() -> None:
    """A value of the wrong type, negative, or beyond 2^53 is `invalid_event`, and says which
    field; `start_wait_ms` beyond its bound is read as the bound; an HTTP server's refusal
    count is read the same way."""
    for payload, field in ((b'{"waiting": "3"}', "waiting"), (b'{"t_ms": -1}', "t_ms"),
                           (b'{"shed_total": 1e16}', "shed_total")):  # fmt: skip
        read = read_capacity(payload)
        assert isinstance(read, Unreadable)
        assert (read.reason, read.detail.split(":")[0]) == ("invalid_event", field)
    wait = read_capacity(b'{"start_wait_ms": 9999999}')
    assert wait == Capacity(start_wait_ms=MAX_START_WAIT_MS)
    assert read_shed_count(b'{"shed_total": 4}') == 4
    assert read_shed_count(b'{"shed_total": -4}') is None
