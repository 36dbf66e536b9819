"""Parking in vLLM's schedulers: edgemon's parking rule (`edgemon.policy.parking`) on the
engine's running requests, fed what the players measured or what the server estimates.

``EDGEMON_PARKING`` chooses the feed (off by default):

- ``measured``: edgemon's slack feed of the gate's device (`edgemon.client.feed`), each
  request joined to its stream by the ``X-Request-Id`` its player sent;
- ``estimated``: the server's own estimate, the peers' formula: audio in the chunks sent
  less the time since the first chunk was sent.

Each step, before vLLM schedules, the rule is asked which running requests sit the step out:
a stream whose lead exceeds what it needs by the rule's band, while a request waits with no
row free for it. A parked request leaves ``scheduler.running`` for vLLM's step only and goes
back in front of it afterwards, so vLLM neither schedules nor preempts it, and keeps its KV
blocks and its model runner's cached state, as for a running request that a step's token
budget left out (vLLM's ``prev_step_scheduled_req_ids``: the runner is sent its tokens when it
is scheduled again; nothing is recomputed). What a stream needs to rejoin in time: the margin
and delivery (``EDGEMON_PARKING_MARGIN_MS``), and its next chunk's frames at the measured
decode step. The chunks are the deadline policy's: its first chunk's frames, then its second
chunk's frames each. A parked request's row is free for real-time admission and the deadline
policy, and vLLM's seat only when the batch's rows are vLLM's ``--max-num-seqs``: with
``EDGEMON_PARKING_ROWS`` below it, the batch takes that many rows and the seats beyond hold the
parked streams (the driver never lets running and parked requests exceed ``--max-num-seqs``).

Free of vLLM: it reads the running requests as the deadline policy's views (`Running`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal

from edgemon.client.feed import SlackFeedReader, stream_of
from edgemon.policy.estimates import next_frames, sent_frames
from edgemon.policy.parking import Lead, Parking

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from edgemon.environ import EngineEnviron
    from edgemon.policy.deadlines import DeadlineSettings
    from edgemon.policy.values import Running

__all__ = ["PARKING_FEEDS", "Feed", "ServedParking", "parking_from_environ"]

Feed = Literal["measured", "estimated"]
PARKING_FEEDS: tuple[Feed, ...] = ("measured", "estimated")

log = logging.getLogger("edgemon.integrations")


class ServedParking:
    """The parking rule on a vLLM scheduler's running requests; see the module doc.

    `reader`: edgemon's slack feed of the device (measured; closed with `close`); `frame_ms`: the
    audio of one token; `chunks`: the frames of the first chunk and of each later one;
    `margin_ms`: the margin and delivery a rejoining stream still needs beyond its next
    chunk; `rows`: the batch's rows, parked streams not counted (None: vLLM's seats).

    It reads the running requests as the deadline policy sees them (`Running`: the frames
    each emitted, when its first chunk was out), so both keep one account of them."""

    __slots__ = (
        "_parked",
        "_rule",
        "chunks",
        "feed",
        "frame_ms",
        "margin_ms",
        "parked_steps",
        "parks",
        "reader",
        "rows",
    )

    def __init__(
        self,
        feed: Feed,
        *,
        reader: SlackFeedReader | None = None,
        frame_ms: float,
        chunks: tuple[int, int],
        margin_ms: float,
        rows: int | None = None,
    ) -> None:
        if feed not in PARKING_FEEDS:
            raise ValueError(f"parking is fed one of {', '.join(PARKING_FEEDS)}, not {feed!r}")
        if feed == "measured" and reader is None:
            raise ValueError("parking on measured state needs edgemon's slack feed")
        if min(chunks) < 1:
            raise ValueError(f"chunks are one frame or more, not {chunks!r}")
        self.feed = feed
        #: edgemon's slack feed (measured), or None.
        self.reader = reader
        self._rule = Parking()
        self.frame_ms = frame_ms
        self.chunks = chunks
        self.margin_ms = margin_ms
        #: The batch's rows, parked streams not counted (None: vLLM's seats).
        self.rows = rows
        self._parked: frozenset[str] = frozenset()
        #: Times a request was parked, and steps a parked request sat out, so far.
        self.parks = 0
        self.parked_steps = 0

    @property
    def parked(self) -> frozenset[str]:
        """The requests parked for the last step."""
        return self._parked

    def leads(self, now_ms: float, running: Iterable[Running], step_ms: float) -> list[Lead]:
        """Each running request's lead on the feed, and what it needs (`step_ms`: the decode
        step now). A request with no chunk out (estimated), or not in the feed (measured),
        has none."""
        first, later = self.chunks
        reader = self.reader if self.feed == "measured" else None
        read_s = None if reader is None else reader.now()  # the feed's own clock
        out = []
        for r in running:
            emitted = r.emitted_frames
            need = self.margin_ms + next_frames(emitted, first, later) * step_ms
            lead: float | None = None
            playing = True
            if reader is None:
                if r.first_chunk_ms is not None:
                    sent = sent_frames(emitted, first, later)
                    lead = sent * self.frame_ms - (now_ms - r.first_chunk_ms)
            elif read_s is not None and (stream := stream_of(r.id)) is not None:
                entry = reader.get(stream)
                if entry is not None:
                    lead, playing = entry.lead_ms(read_s), entry.playing(read_s)
            out.append(Lead(r.id, lead, need, playing=playing))
        return out

    def step(
        self,
        now_ms: float,
        running: Sequence[Running],
        *,
        waiting: int,
        free_rows: int,
        step_ms: float,
    ) -> tuple[frozenset[str], frozenset[str]]:
        """The running requests (all of them, `running`) that sit this step out, and those
        whose rows count as free for it (parked, or parkable now)."""
        leads = self.leads(now_ms, running, step_ms)
        parked = self._rule.held(leads, waiting=waiting, free_rows=free_rows)
        for rid in sorted(parked - self._parked):
            lead = next(item for item in leads if item.id == rid)
            log.info(
                "edgemon parking (%s): parked %s, lead %.0f ms, needs %.0f ms",
                self.feed, rid, lead.lead_ms or 0.0, lead.need_ms,
            )  # fmt: skip
        for rid in sorted(self._parked - parked):
            log.info("edgemon parking (%s): %s rejoins", self.feed, rid)
        self.parks += len(parked - self._parked)
        self.parked_steps += len(parked)
        self._parked = parked
        return parked, self._rule.spare(leads)

    def spare(self, now_ms: float, running: Iterable[Running], step_ms: float) -> frozenset[str]:
        """Running requests parked, or that could be: their rows count as free for a request
        that arrives."""
        return self._rule.spare(self.leads(now_ms, running, step_ms))

    def close(self) -> None:
        """Stop reading the feed."""
        if self.reader is not None:
            self.reader.close()


def parking_from_environ(
    environ: EngineEnviron, settings: DeadlineSettings
) -> ServedParking | None:
    """Parking as ``EDGEMON_PARKING`` says, its chunks and frame the deadline policy's
    `settings`; measured reads the slack feed of the gate's device (opened here). None: off."""
    feed = environ.parking
    if feed not in PARKING_FEEDS:
        return None
    reader = None
    gate = environ.gate
    if feed == "measured" and gate is not None:
        if len(gate.devices) != 1 or gate.devices[0] == "+":
            raise ValueError(
                f"EDGEMON_PARKING=measured reads one device's slack feed, not {gate.device!r}"
            )
        connection: dict[str, Any] = dict(gate.connection)
        reader = SlackFeedReader(
            gate.broker_url, gate.devices[0], topic_prefix=gate.topic_prefix, **connection
        ).open()
    first = settings.first_chunk_frames
    return ServedParking(
        "measured" if feed == "measured" else "estimated",
        reader=reader,
        frame_ms=settings.frame_ms,
        chunks=(first, settings.second_chunk_frames or first),
        margin_ms=environ.parking_margin_ms,
        rows=environ.parking_rows or None,
    )
