"""`RetainedLink`: one paho connection that keeps a retained JSON object up to date on a few
topics and hands the messages of a few topic filters to a callback.

The engine's capacity publisher and the HTTP shedding middleware each own one. The caller's
thread (a scheduler step, an HTTP request) only hands over the latest object (`set`): a lock
taken for a few attribute writes, never network I/O. A background thread publishes it
(retained, QoS 1) when it changed, at most once per `min_interval_s`, again after every
reconnect (a broker restarted without persistence forgot it) and, with `refresh_s`, at least
that often while nothing changes, stamped with the time of each publication (`t_ms`, with
`stamp`): readers ignore an object older than a few refreshes (docs/protocol.md), so an object
left behind by a dead publisher loses its power by itself. Because that thread, not the
caller, does the publishing, the last change before an engine goes idle is published even
though no further step comes. `close()` empties the retained topics (the object is gone with
its publisher), and the MQTT will does the same for the first topic when the process dies.

A filter of `watch` that the broker refuses in its SUBACK (a code of 0x80 or more: its ACL)
is one error in the log naming it, `refused` and `subscriptions_refused` (a count) say so.
(Mosquitto's `acl_file` grants every subscription and withholds the messages instead: no
client can see that; the capacity view says when no object came at all.)

Nothing here raises into the caller after construction: a failed publish or a bad callback is
counted (`errors`) and the first one logged (`CaughtErrors`).
"""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING, Any

from edgemon.client import mqtt as _mqtt
from edgemon.errors import CaughtErrors

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import paho.mqtt.client as mqtt

    from edgemon.broker_url import Broker


class RetainedLink:
    """See the module doc."""

    __slots__ = (
        "_caught",
        "_clock",
        "_cond",
        "_connected",
        "_dirty",
        "_last_sent",
        "_latest",
        "_link",
        "_min_interval_s",
        "_on_message",
        "_refresh_s",
        "_stamp",
        "_stop",
        "_subscribing",
        "_thread",
        "published",
        "refused",
        "subscriptions_refused",
        "topics",
        "watch",
        "who",
    )

    def __init__(  # noqa: PLR0913 - keyword-only parts of the link, each injectable
        self,
        broker: Broker,
        *,
        who: str,
        client_id: str,
        topics: Sequence[str],
        watch: Sequence[str] = (),
        on_message: Callable[[str, bytes], None] | None = None,
        min_interval_s: float = 1.0,
        refresh_s: float | None = None,
        stamp: Callable[[], float] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`refresh_s`: publish the object again at least this often (None: only on change);
        `stamp`: the wall clock in ms, which `t_ms` of each publication is set from."""
        self.who = who
        self.topics = tuple(topics)
        self.watch = tuple(watch)
        self._link = _mqtt.PahoLink(
            broker, who=who, client_id=client_id, on_up=self._up, on_down=self._down
        )
        self._on_message = on_message
        self._min_interval_s = min_interval_s
        self._refresh_s = refresh_s
        self._stamp = stamp
        self._clock = clock
        self._cond = threading.Condition()
        self._latest: dict[str, Any] | None = None
        self._dirty = False
        self._stop = False
        self._connected = False
        self._last_sent = -float("inf")
        self._thread: threading.Thread | None = None
        #: The filters of each SUBSCRIBE under way, by packet id.
        self._subscribing: dict[int, tuple[str, ...]] = {}
        #: Objects handed to the broker (each to every topic; MQTT 3.1.1 cannot tell one the
        #: ACL dropped).
        self.published = 0
        self._caught = CaughtErrors(_mqtt.log, who)
        #: The filters of `watch` the broker refused at the last subscription, and how many
        #: refusals there were in all.
        self.refused: tuple[str, ...] = ()
        self.subscriptions_refused = 0

    # ------------------------------------------------------------------ the caller's side
    def set(self, value: dict[str, Any]) -> None:
        """The latest object: published soon (at most once per `min_interval_s`)."""
        with self._cond:
            self._latest = value
            self._dirty = True
            self._cond.notify_all()

    @property
    def connected(self) -> bool:
        """Whether the connection is up now."""
        return self._connected

    def wait_connected(self, timeout: float) -> bool:
        """Wait until connected (its subscription to `watch` sent); False if `timeout` s pass
        first."""
        with self._cond:
            return self._cond.wait_for(lambda: self._connected, timeout)

    @property
    def errors(self) -> int:
        """Errors caught so far (the first logged)."""
        return self._caught.count

    def failed(self, where: str) -> None:
        """Count an exception caught in `where`; log the first (call from an `except` block)."""
        self._caught.caught(where)

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> RetainedLink:
        """Start the network thread and the publishing thread; never waits for the broker."""
        with self._cond:
            if self._thread is not None:
                return self
            self._stop = False
            self._thread = threading.Thread(target=self._run, name=f"{self.who}", daemon=True)
            self._thread.start()
            self._link.open(self._configure)
        return self

    def close(self, timeout: float = 5.0, *, clear: bool = True) -> None:
        """Stop both threads (waiting at most `timeout` s); with `clear`, first empty the
        retained topics if connected."""
        with self._cond:
            client = self._link.client
            thread, self._thread = self._thread, None
            self._stop = True
            connected, self._connected = self._connected, False
            self._cond.notify_all()
        if thread is not None:
            thread.join(max(0.0, timeout))
        if client is None:
            return
        if clear and connected:
            try:
                infos = [client.publish(t, b"", qos=1, retain=True) for t in self.topics]
                for info in infos:
                    info.wait_for_publish(min(1.0, timeout))
            except Exception:  # noqa: BLE001 - closing must not raise into the engine's shutdown
                self.failed("emptying the retained topics")
        self._link.close(timeout)

    # ------------------------------------------------------------------ threads
    def _run(self) -> None:
        """Publish the latest object when it changed, at most once per `min_interval_s`, and
        at least once per `refresh_s` while connected."""
        while True:
            with self._cond:
                while not self._stop:
                    if not self._connected or self._latest is None:
                        self._cond.wait()
                        continue
                    now = self._clock()
                    if self._dirty:
                        due = self._last_sent + self._min_interval_s - now
                    elif self._refresh_s is not None:
                        due = self._last_sent + self._refresh_s - now
                    else:
                        self._cond.wait()
                        continue
                    if due <= 0:
                        break
                    self._cond.wait(due)
                if self._stop:
                    return
                value, client = self._latest, self._link.client
                self._dirty = False
                self._last_sent = self._clock()
            if value is not None and client is not None:
                self._publish(client, value)

    def _publish(self, client: mqtt.Client, value: dict[str, Any]) -> None:
        try:
            if self._stamp is not None:
                value = value | {"t_ms": round(self._stamp())}
            payload = json.dumps(value, separators=(",", ":")).encode()
            for topic in self.topics:
                client.publish(topic, payload, qos=1, retain=True)
            self.published += 1
        except Exception:  # noqa: BLE001 - a publish must never stop the engine
            self.failed("publishing")

    def _configure(self, client: mqtt.Client) -> None:
        if self.topics:
            client.will_set(self.topics[0], b"", qos=1, retain=True)
        client.on_message = self._on_paho_message
        client.on_subscribe = self._on_subscribe

    def _up(self, client: mqtt.Client) -> None:
        """Connected: subscribe to `watch`; publish the object again (the broker may have
        forgotten it)."""
        if self.watch:
            _, mid = client.subscribe([(topic, 1) for topic in self.watch])
            if mid is not None:  # None: not sent (the connection is already gone)
                with self._cond:
                    self._subscribing = {mid: self.watch}
        with self._cond:
            self._connected = True
            self._dirty = self._latest is not None
            self._cond.notify_all()

    def _down(self, _reason: str) -> bool:
        """The connection is lost: news if it was up."""
        with self._cond:
            was, self._connected = self._connected, False
            self._cond.notify_all()
            return was

    def _on_subscribe(
        self, client: mqtt.Client, _userdata: Any, mid: int, reason_codes: Any, _props: Any
    ) -> None:
        """The SUBACK: each refused filter (0x80 and above, or a code missing) is said."""
        if client is not self._link.client:
            return
        try:
            with self._cond:
                filters = self._subscribing.pop(mid, None)
                if filters is None:
                    return
                refused = _mqtt.refused_filters(filters, reason_codes)
                said, self.refused = self.refused, refused
                self.subscriptions_refused += len(refused)
        except Exception:  # noqa: BLE001 - a SUBACK it cannot read must not end the thread
            self.failed("the SUBACK's handling")
            return
        if refused and refused != said:
            _mqtt.log.error(
                "%s: the broker refused the subscription to %s (its ACL?): what these topics "
                "would bring never arrives",
                self.who,
                ", ".join(refused),
            )

    def _on_paho_message(
        self, _client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage
    ) -> None:
        handler = self._on_message
        if handler is None:
            return
        try:
            handler(message.topic, bytes(message.payload))
        except Exception:  # noqa: BLE001 - a bad message must not end the network thread
            self.failed("a message's handling")
