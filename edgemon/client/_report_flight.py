"""A `Reporter`'s messages on their way: taken from the buffer, published, not yet acknowledged.

`InFlight` knows, for each message paho accepted, the events it carries (by their first
index and count) until the broker's PUBACK, and which taken events are in the flusher's
hands between the buffer and `publish()`. A PUBACK can beat `publish()` returning its packet
id; it is kept until the id is known. With the buffer it says which event is the oldest
neither acknowledged nor dropped, which is what `flush()` waits on. The Reporter's lock
guards it.
"""

from __future__ import annotations


class InFlight:
    """Published messages awaiting their PUBACK, and the events taken but not yet published."""

    __slots__ = ("_early_acks", "_in_flight", "in_hand", "messages", "sent")

    def __init__(self) -> None:
        self._in_flight: dict[int, tuple[int, int]] = {}  # mid -> (first index, events)
        self._early_acks: set[int] = set()  # PUBACKs that beat publish() returning the mid
        #: First index of the events taken, not yet published (None: none).
        self.in_hand: int | None = None
        #: Events and messages the broker acknowledged.
        self.sent = 0
        self.messages = 0

    def __len__(self) -> int:
        """Messages awaiting their PUBACK."""
        return len(self._in_flight)

    def events(self) -> int:
        """Events awaiting their PUBACK."""
        return sum(count for _, count in self._in_flight.values())

    def published(self, mid: int, first: int, count: int) -> None:
        """Message `mid`, carrying `count` events from index `first`, was handed to paho."""
        if mid in self._early_acks:
            self._early_acks.discard(mid)
            self._settle(count)
        else:
            self._in_flight[mid] = (first, count)

    def acknowledged(self, mid: int) -> None:
        """The broker's PUBACK of message `mid`."""
        entry = self._in_flight.pop(mid, None)
        if entry is None:
            self._early_acks.add(mid)
        else:
            self._settle(entry[1])

    def oldest(self, below: int) -> int:
        """The lowest index of an event in hand or in flight, or `below` if lower."""
        oldest = below
        if self.in_hand is not None and self.in_hand < oldest:
            oldest = self.in_hand
        for first, _ in self._in_flight.values():
            if first < oldest:
                oldest = first
        return oldest

    def _settle(self, count: int) -> None:
        self.sent += count
        self.messages += 1
