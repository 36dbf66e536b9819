"""What the broker sent and the connection has not handled yet: blocks in, packets out.

asyncio hands the connection whatever the socket held, in blocks that need not end on a packet
boundary. While nothing is left over, a block is read in place (no copy): that is the common
case, and the hot path's. What is left over after a block (the start of a packet, or packets
not handled yet because the intake paused) goes into one `bytearray`, which the next blocks
are appended to: a packet that arrives in many small pieces is copied once, not once per
piece (joining `bytes` would copy the whole tail on every read, quadratic in its size).

`moved` counts the bytes copied within the buffer, so a test can check the work is linear;
`peak` the most it held at once, so a test can check a packet too large to read was not kept.
"""

from __future__ import annotations

__all__ = ["PacketBuffer"]


class PacketBuffer:
    """The bytes received and not handled yet: `data[pos:]`. The reader advances `pos`."""

    __slots__ = ("data", "moved", "peak", "pos")

    def __init__(self) -> None:
        #: A block as received (nothing was left before it), or the leftovers and what came
        #: after them.
        self.data: bytes | bytearray = b""
        #: Where the first byte not handled yet is.
        self.pos = 0
        #: Bytes copied within the buffer so far (leftovers kept, blocks appended to them).
        self.moved = 0
        #: The most bytes it held at once.
        self.peak = 0

    def feed(self, block: bytes) -> None:
        """Append one block received."""
        data, pos = self.data, self.pos
        left = len(data) - pos
        if left <= 0:  # everything handled: read the block where it is
            self.data = block
        elif isinstance(data, bytearray):
            if pos:
                del data[:pos]  # the leftovers to the front (CPython: usually no copy at all)
                self.moved += left
            data += block
            self.moved += len(block)
        else:  # leftovers of a block read in place: into a buffer of their own, once
            kept = bytearray(memoryview(data)[pos:])
            kept += block
            self.data = kept
            self.moved += left + len(block)
        self.pos = 0
        self.peak = max(self.peak, len(self.data))

    @property
    def pending(self) -> int:
        """Bytes received and not handled yet."""
        return len(self.data) - self.pos
