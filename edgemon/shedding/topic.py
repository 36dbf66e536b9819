"""The capacity topic (``P/{device}/capacity``, docs/protocol.md): its settings, the object as
read, and the engine's publisher.

- **Settings** come from the gate's environment (`TopicConfig.from_environ`):
  ``EDGEMON_GATE_DEVICE`` (one id or a comma-separated list; ``+`` names no topic to publish
  on, so it turns the capacity topic off), ``EDGEMON_GATE_BROKER``,
  ``EDGEMON_GATE_TOPIC_PREFIX`` and the connection's ``USERNAME`` / ``PASSWORD_FILE`` /
  ``CA_FILE``.
- **The engine publishes** (`CapacityPublisher`, built by edgemon's schedulers in the engine
  process): ``{"t_ms", "realtime_streams", "running", "waiting", "start_wait_ms",
  "shed_total"}`` on every listed device's topic, retained, QoS 1, when one of the integer
  fields or the rounded ``start_wait_ms`` changed, at most once a second, and again every
  `CAPACITY_REFRESH_S` while nothing changes, ``t_ms`` the time of each publication
  (`RetainedLink`): readers ignore an object older than `CAPACITY_MAX_AGE_MS`, so the objects
  an engine leaves behind when it dies lose their power by themselves (its will empties
  only the first device's topic: MQTT has one will per connection).
- **Reading it** (`edgemon.capacity_object.read_capacity`, as the daemon reads it): standard
  JSON only; an object with a field that is not a number ≥ 0 (up to 2^53) is unreadable as a
  whole, which voids what the reader knew of that device; ``start_wait_ms`` is read as at
  most `MAX_START_WAIT_MS`.
- **Every refusal is counted** in ``shed_total`` and, by reason, in ``shed_reasons``
  (``{"http": n, "arrival": n, "queued": n}``, a field beyond SPEC's, which consumers may
  ignore): ``http`` the middleware's 503s, ``arrival`` and ``queued`` the requests the
  scheduler ended as they arrived and while they waited.
- **Refusals at arrival in HTTP reach ``shed_total``.** The HTTP middleware runs in vLLM's API
  server process, not in the engine's: each middleware publishes its own count, retained, on
  ``P/{first device}/capacity/shed/{its client id}`` (``{"shed_total": n}``; emptied by its
  will or at close), and the engine's publisher adds every such count to its own. A count
  whose topic is emptied (its server went away) stays in the total, so ``shed_total`` never
  goes down while the engine runs. At most `MAX_SHED_SERVERS` servers are followed (one more
  is ignored, with a warning), and a server's count rises by at most `SHED_BURST` per message.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgemon.capacity_object import Capacity, read_capacity
from edgemon.client import mqtt as _mqtt
from edgemon.environ import read_gate_environ
from edgemon.protocol import (
    CAPACITY_REFRESH_S,
    SHED_BURST,
)
from edgemon.shedding._retained import RetainedLink

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from edgemon.broker_url import Broker
    from edgemon.environ import GateEnviron

__all__ = ["CapacityPublisher", "TopicConfig"]

_SHED_LEVELS = "capacity/shed"
#: HTTP servers whose refusal counts a publisher follows at most.
MAX_SHED_SERVERS = 16


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """Where the capacity topics are, and how to connect."""

    broker: Broker
    devices: tuple[str, ...]
    prefix: str = "edgemon/v1"

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> TopicConfig | None:
        """From the gate's variables; None without ``EDGEMON_GATE_DEVICE`` or with ``+``.

        Bad values raise `edgemon.environ.EnvironError` naming each variable."""
        return cls.from_gate(read_gate_environ(environ))

    @classmethod
    def from_gate(cls, gate: GateEnviron | None) -> TopicConfig | None:
        """From the gate's variables as read; None without a device or with ``+``."""
        if gate is None:
            return None
        if gate.devices == ("+",):
            _mqtt.log.warning(
                "edgemon: EDGEMON_GATE_DEVICE=+ names no device to publish capacity for; "
                "the capacity topic and HTTP shedding are off (list the devices instead)"
            )
            return None
        return cls(gate.broker, gate.devices, gate.topic_prefix)

    def capacity_topics(self) -> tuple[str, ...]:
        """``P/{device}/capacity`` for every device."""
        return tuple(f"{self.prefix}/{device}/capacity" for device in self.devices)

    def shed_topic(self, server: str) -> str:
        """Where one HTTP server publishes its refusals: under the first device."""
        return f"{self.prefix}/{self.devices[0]}/{_SHED_LEVELS}/{server}"

    def shed_filter(self) -> str:
        """Every HTTP server's refusal count."""
        return f"{self.prefix}/{self.devices[0]}/{_SHED_LEVELS}/+"


def read_shed_count(payload: bytes) -> int | None:
    """An HTTP server's ``{"shed_total": n}`` (read as a capacity object is), or None."""
    read = read_capacity(payload)
    return read.shed_total if isinstance(read, Capacity) else None


class CapacityPublisher:
    """The engine's side: `update` every step (cheap; publishes only on change, from a thread
    of its own), the HTTP servers' refusals added to ``shed_total``."""

    __slots__ = (
        "_figures",
        "_gone",
        "_key",
        "_link",
        "_lock",
        "_servers",
        "_wall",
        "config",
        "servers_ignored",
    )

    def __init__(
        self,
        config: TopicConfig,
        *,
        client_id: str | None = None,
        min_interval_s: float = 1.0,
        refresh_s: float = CAPACITY_REFRESH_S,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """`min_interval_s` apart at least, `refresh_s` apart at most (`RetainedLink`); `wall`
        is the wall clock in seconds (`t_ms`)."""
        self.config = config
        self._wall = wall
        self._lock = threading.Lock()
        self._key: tuple[Any, ...] | None = None
        self._figures: dict[str, Any] = {}
        self._servers: dict[str, int] = {}  # HTTP server topic -> its latest count
        self._gone = 0  # the counts of HTTP servers that went away
        #: Refusal counts ignored: from a server beyond `MAX_SHED_SERVERS`.
        self.servers_ignored = 0
        name = "_".join(config.devices)[:64]
        self._link = RetainedLink(
            config.broker,
            who=f"edgemon capacity {','.join(config.devices)}",
            client_id=client_id or _mqtt.default_client_id("capacity", name),
            topics=config.capacity_topics(),
            watch=(config.shed_filter(),),
            on_message=self._on_shed,
            min_interval_s=min_interval_s,
            refresh_s=refresh_s,
            stamp=lambda: self._wall() * 1000.0,
        )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> CapacityPublisher | None:
        """An opened publisher as the gate's variables say, or None (see `TopicConfig`)."""
        config = TopicConfig.from_environ(environ)
        return None if config is None else cls(config).open()

    def open(self) -> CapacityPublisher:
        """Connect in the background (never waits for the broker)."""
        self._link.open()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Empty the retained capacity objects and disconnect."""
        self._link.close(timeout)

    @property
    def link(self) -> RetainedLink:
        """The connection (its `published`, `errors`, `wait_connected`)."""
        return self._link

    @property
    def http_shed(self) -> int:
        """Refusals the HTTP servers reported (those gone included)."""
        with self._lock:
            return self._gone + sum(self._servers.values())

    def update(
        self,
        *,
        realtime_streams: int | None,
        running: int,
        waiting: int,
        start_wait_ms: float | None,
        shed: Mapping[str, int],
    ) -> None:
        """What the scheduler measures now (`shed`: the requests it ended itself, by reason)."""
        try:
            wait = None if start_wait_ms is None else round(start_wait_ms)
            with self._lock:
                key = (realtime_streams, running, waiting, wait, tuple(sorted(shed.items())))
                if key == self._key:
                    return
                self._key = key
                self._figures = {
                    "realtime_streams": realtime_streams,
                    "running": running,
                    "waiting": waiting,
                    "start_wait_ms": wait,
                    "shed": dict(shed),
                }
                self._push()
        except Exception:  # noqa: BLE001 - the step must never stop for the capacity topic
            self._link.failed("the capacity update")

    def _push(self) -> None:
        """Hand the object to the link (under the lock)."""
        figures = dict(self._figures)
        reasons = {"http": self._gone + sum(self._servers.values())} | figures.pop("shed", {})
        figures["shed_total"] = sum(reasons.values())
        figures["shed_reasons"] = reasons
        self._link.set({k: v for k, v in figures.items() if v is not None})  # `t_ms`: the link's

    def _on_shed(self, topic: str, payload: bytes) -> None:
        """An HTTP server's refusal count (an empty payload: that server went away): it only
        rises, by `SHED_BURST` at most per message; a server beyond `MAX_SHED_SERVERS` is
        ignored."""
        warn = False
        with self._lock:
            old = self._servers.get(topic)
            if not payload:
                self._gone += self._servers.pop(topic, 0)
                changed = old is not None
            else:
                count = read_shed_count(payload)
                if count is None or count == old:
                    return
                if old is None and len(self._servers) >= MAX_SHED_SERVERS:
                    self.servers_ignored += 1
                    warn, changed = self.servers_ignored == 1, False
                else:
                    new = min(max(count, old or 0), (old or 0) + SHED_BURST)
                    self._servers[topic], changed = new, new != old
            if changed and self._figures:
                self._push()
        if warn:
            _mqtt.log.warning(
                "%s: more than %d HTTP servers report refusals; the counts of the others are "
                "ignored (%s first)",
                self._link.who,
                MAX_SHED_SERVERS,
                topic,
            )
