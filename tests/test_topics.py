"""Topic names (docs/protocol.md, "Topics"): what edgemon subscribes to, parses, publishes on."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgemon.wire.topics import Topics, valid_device_id

DEFAULT = Topics()


@pytest.mark.parametrize(
    ("topic", "expected"),
    [
        ("edgemon/v1/d1/events", ("d1", "events")),
        ("edgemon/v1/d1/engine", ("d1", "engine")),
        ("edgemon/v1/Edge-1.box_2/events", ("Edge-1.box_2", "events")),
        ("edgemon/v1/" + "a" * 64 + "/events", ("a" * 64, "events")),
        ("edgemon/v1/x/engine", ("x", "engine")),
        ("edgemon/v1/d1/capacity", ("d1", "capacity")),
    ],
)
def test_parse_valid_inbound_topics(topic: str, expected: tuple[str, str]) -> None:
    """`P/{device}/events`, `P/{device}/engine` and `P/{device}/capacity` give the device (from
    the topic) and kind."""
    assert DEFAULT.parse(topic) == expected


@pytest.mark.parametrize(
    "topic",
    [
        "edgemon/v2/d1/events",  # other prefix
        "other/v1/d1/events",
        "/edgemon/v1/d1/events",  # leading slash: not the prefix
        "edgemon/v1x/d1/events",  # prefix without a slash after it
        "edgemon/v1d1/events",
        "edgemon/v1",  # the prefix alone
        "edgemon/v1/",
        "",
    ],
)
def test_parse_rejects_prefix_mismatch(topic: str) -> None:
    """A topic that does not start with `P/` exactly is not ours."""
    assert DEFAULT.parse(topic) is None


@pytest.mark.parametrize(
    "device",
    [
        "",  # empty level
        "a" * 65,  # too long
        "a b",
        "a+",
        "+",
        "#",
        "dé",  # non-ASCII letter
        "d\n",  # a trailing newline must not slip through `$`
        "d\x00",
        "d:1",  # ':' is allowed in stream ids, not in device ids
    ],
)
def test_parse_rejects_bad_device_ids(device: str) -> None:
    """The device level must match `[A-Za-z0-9._-]{1,64}` in full."""
    assert DEFAULT.parse(f"edgemon/v1/{device}/events") is None
    assert DEFAULT.parse(f"edgemon/v1/{device}/engine") is None
    assert not valid_device_id(device)


@pytest.mark.parametrize("device", ["d", "D-1", "a.b_c-d", "0" * 64, "_edgemon2", "edgemon"])
def test_valid_device_ids(device: str) -> None:
    """Any 1 to 64 characters of letters, digits, `.`, `_` and `-` name a device, but
    `_edgemon`."""
    assert valid_device_id(device)
    assert DEFAULT.parse(f"edgemon/v1/{device}/events") == (device, "events")


@pytest.mark.parametrize(
    "topic",
    [
        "edgemon/v1/d1/throttle",  # what edgemon itself publishes
        "edgemon/v1/d1/status",
        "edgemon/v1/d1/EVENTS",  # kinds are case-sensitive
        "edgemon/v1/d1/event",
        "edgemon/v1/d1/",
        "edgemon/v1/d1",
        "edgemon/v1//events",
    ],
)
def test_parse_rejects_wrong_kind(topic: str) -> None:
    """Only `events` and `engine` are inbound kinds."""
    assert DEFAULT.parse(topic) is None


@pytest.mark.parametrize(
    "topic",
    [
        "edgemon/v1/d1/events/extra",
        "edgemon/v1/d1/engine/",
        "edgemon/v1/d1/x/events",
        "edgemon/v1/_edgemon/inst/status",
        "edgemon/v1/d1/events\n",
    ],
)
def test_parse_rejects_extra_levels(topic: str) -> None:
    """A topic with more levels than `P/{device}/{kind}` is not ours."""
    assert DEFAULT.parse(topic) is None


def test_outbound_topic_names() -> None:
    """Throttle goes to `P/{device}/throttle`, status to `P/_edgemon/{instance}/status`."""
    assert DEFAULT.throttle("d1") == "edgemon/v1/d1/throttle"
    assert DEFAULT.status("box-7") == "edgemon/v1/_edgemon/box-7/status"
    assert DEFAULT.subscriptions == (
        "edgemon/v1/+/events",
        "edgemon/v1/+/engine",
        "edgemon/v1/+/capacity",
    )


def test_outbound_topics_are_not_parsed_as_inbound() -> None:
    """edgemon's own throttle and status topics never route back into it."""
    assert DEFAULT.parse(DEFAULT.throttle("d1")) is None
    assert DEFAULT.parse(DEFAULT.status("inst")) is None


def test_custom_prefix() -> None:
    """A custom prefix (with its own levels) is used for every name, and only it is parsed."""
    topics = Topics("site/a/edge")
    assert topics.subscriptions == (
        "site/a/edge/+/events",
        "site/a/edge/+/engine",
        "site/a/edge/+/capacity",
    )
    assert topics.throttle("d") == "site/a/edge/d/throttle"
    assert topics.status("i") == "site/a/edge/_edgemon/i/status"
    assert topics.parse("site/a/edge/d/events") == ("d", "events")
    assert topics.parse("site/a/edge/d/engine") == ("d", "engine")
    assert topics.parse("edgemon/v1/d/events") is None
    assert topics.parse("site/a/edgex/d/events") is None
    assert topics.parse("site/a/d/events") is None


def test_parse_remembers_routes_within_its_bound() -> None:
    """Routes are remembered per topic string, at most `cached` of them (the cache starts
    over when full), and every parse still gives the route a fresh parse gives."""
    topics = Topics(cached=4)
    names = [f"edgemon/v1/d{n}/{kind}" for n in range(10) for kind in ("events", "engine")]
    for _ in range(3):
        for name in names:
            assert topics.parse(name) == Topics().parse(name) is not None
            assert 1 <= topics.remembered <= 4


@pytest.mark.parametrize(
    "topic",
    ["other/v1/d1/events", "edgemon/v1/bad device/events", "edgemon/v1/d1/throttle", ""],
)
def test_topics_that_are_not_ours_are_never_remembered(topic: str) -> None:
    """A topic that is not an inbound edgemon topic is parsed (to None) every time and never
    takes a place in the cache: a flood of junk topics cannot evict or grow anything."""
    topics = Topics(cached=4)
    assert topics.parse("edgemon/v1/d1/events") == ("d1", "events")
    for _ in range(3):
        assert topics.parse(topic) is None
    assert topics.remembered == 1


@given(st.lists(st.sampled_from(["edgemon/v1/", "edgemon/v1/d", "x/"]) | st.text(max_size=12)))
def test_cached_parse_equals_a_fresh_parse(parts: list[str]) -> None:
    """Any sequence of topics parsed through one small cache gives, topic by topic, exactly
    what a Topics that never saw a topic before gives."""
    topics = Topics(cached=3)
    for n, part in enumerate(parts):
        topic = part + ("/events" if n % 2 else "")
        assert topics.parse(topic) == Topics().parse(topic)


def test_reserved_edgemon_level_is_no_device() -> None:
    """`_edgemon` names edgemon's own topics (`P/_edgemon/{instance}/status`), so it is refused
    as a device id: its events and engine objects are not taken as a device's."""
    assert not valid_device_id("_edgemon")
    assert DEFAULT.parse("edgemon/v1/_edgemon/events") is None
    assert DEFAULT.parse("edgemon/v1/_edgemon/engine") is None
