"""The daemon's MQTT session (`edgemon.daemon.mqtt_session`) driven by hand, with no socket
and no real time: what the broker says is bytes built by `fake_broker` (not by edgemon's
codec), the time is a `Clock` the test moves (`Timeline` ticks the session on the way, as
its connection's timer would), and what the session writes is read back as packet types."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgemon.daemon.mqtt_codec import V311, ConnectRequest
from edgemon.daemon.mqtt_session import Connected, Session

from fake_broker import packet_types

if TYPE_CHECKING:
    from edgemon.daemon.mqtt_session import Event

#: CONNACK, accepted, no session present (MQTT 3.1.1; on 5 with no properties).
CONNACK = b"\x20\x02\x00\x00"
CONNACK_V5 = b"\x20\x03\x00\x00\x00"
PINGRESP = b"\xd0\x00"


class Clock:
    """Monotonic seconds that only the test moves."""

    __slots__ = ("now",)

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def connect_request(
    keepalive_s: int = 30, *, version: int = V311, client_id: str = "session"
) -> ConnectRequest:
    """A CONNECT of the daemon's kind (persistent session) for a test's connection."""
    return ConnectRequest(
        client_id=client_id, keepalive_s=keepalive_s, clean=False, version=version
    )


def accepted(
    keepalive_s: int = 1, *, version: int = V311, at: float = 0.0, connack: bytes | None = None
) -> Session:
    """A session whose CONNECT went out and whose CONNACK (`connack`, by default an accepted
    one without properties) came, both at `at`, with nothing left to send."""
    session = Session(connect_request(keepalive_s, version=version), now=at)
    session.data_to_send()
    if connack is None:
        connack = CONNACK if version == V311 else CONNACK_V5
    session.receive_data(connack, at)
    event = session.next_event(at)
    assert isinstance(event, Connected)
    assert not event.connack.refused
    return session


def events(session: Session, now: float) -> list[Event]:
    """Every event of what the session has received so far."""
    found = []
    while (event := session.next_event(now)) is not None:
        found.append(event)
    return found


def unexpected(event: Event) -> None:
    """A driver's `control` where no CONNACK or answer may come."""
    raise AssertionError(f"unexpected: {event!r}")


def sent(session: Session) -> list[int]:
    """The packet types (high nibble) of what the session would write now (then forgotten)."""
    return packet_types(session.data_to_send())


class Timeline:
    """`clock` moved for one session as its connection's timer would run it: `to(t)` calls
    `tick` at every deadline the session names on the way to `t`."""

    __slots__ = ("clock", "session")

    def __init__(self, session: Session, clock: Clock | None = None) -> None:
        self.session = session
        self.clock = clock or Clock()

    @property
    def now(self) -> float:
        """Where the clock is."""
        return self.clock.now

    def to(self, until: float) -> None:
        """Move to `until`; ConnectionLostError if the session ends on the way (`now` is
        then the instant it ended)."""
        session, clock = self.session, self.clock
        while (due := session.deadline()) is not None and due <= until:
            clock.now = max(clock.now, due)
            session.tick(clock.now)
        clock.now = until


class SessionWire:
    """What an intake writes to and pauses, as the connection would do it: writes go to the
    session at the clock's time; `reading` says whether the driver may read."""

    __slots__ = ("reading", "timeline")

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        self.reading = True

    def write(self, data: bytes) -> None:
        """Send `data` through the session now."""
        self.timeline.session.send(data, self.timeline.now)

    def pause_reading(self) -> None:
        """Read no more."""
        self.reading = False

    def resume_reading(self) -> None:
        """Read again."""
        self.reading = True
