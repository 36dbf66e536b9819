"""What the broker grants edgemon, heard and said: the session kept or lost, the QoS granted,
retained messages available (docs/reliability.md, "What the broker grants").

- A reconnection whose CONNACK says the broker kept no session (with a persistent session
  asked for): what devices sent while edgemon was away is gone. A warning each time, and
  `edgemon_mqtt_sessions_lost_total`.
- A grant below the QoS edgemon asked for (SUBACK, or MQTT 5's Maximum QoS in CONNACK):
  messages are no longer acknowledged only once durable, so a crash or an outage loses them.
  Edgemon still works (messages flow, throttles go out), so `/readyz` stays 200 and says
  "degraded" with the reason; one error in the log for each distinct grant.
- A broker that keeps no retained messages (MQTT 5's Retain Available 0, or a CONNACK refusing
  the retained will): every throttle object and status is retained, so edgemon refuses the
  broker, with one error naming the broker's setting; it keeps trying, quietly, meanwhile.
- A subscription the broker refuses in its SUBACK (a code of 0x80 or more: its ACL): one
  error naming the filters (each distinct set once), `edgemon_mqtt_subscriptions_refused_total`,
  and the session is ended and tried again with the backoff (`/readyz` 503 meanwhile), so an
  ACL that is fixed is picked up. (Mosquitto's `acl_file` grants every subscription and
  withholds the messages instead: no client can see that.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgemon.daemon import mqtt_codec as codec
from edgemon.errors import ConnectionLostError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from edgemon.adapters.connection_state import ConnectionState

#: MQTT 5 CONNACK reason codes for a will the broker cannot keep: "Retain not supported",
#: "QoS not supported" (edgemon's will is the retained `offline` status at QoS 1).
RETAIN_NOT_SUPPORTED = 0x9A
QOS_NOT_SUPPORTED = 0x9B
#: What to change on the broker (Mosquitto's settings).
RETAIN_FIX = "set `retain_available true` in mosquitto.conf (or the broker's equivalent)"
QOS_FIX = (
    "allow QoS 1 for edgemon: `max_qos 1` or more in mosquitto.conf, and ACLs that let it "
    "subscribe at QoS 1 (or the broker's equivalent)"
)


class BrokerUnsuitableError(ConnectionLostError):
    """The broker lacks what edgemon relies on; `fix` says what to change on its side."""

    def __init__(self, message: str, *, fix: str, reason: int | None = None) -> None:
        super().__init__(message, reason=reason)
        self.fix = fix


def refusal(connack: codec.Connack, *, version: int) -> ConnectionLostError:
    """Why the broker refused the connection, as the error to raise."""
    code = connack.code
    text = f"connection refused: {codec.reason_text(code, version=version)}"
    if version == codec.V5 and code == RETAIN_NOT_SUPPORTED:
        return BrokerUnsuitableError(
            f"{text}: the broker keeps no retained messages, and edgemon's status (its will) "
            "and throttle objects are retained",
            fix=RETAIN_FIX,
            reason=code,
        )
    if version == codec.V5 and code == QOS_NOT_SUPPORTED:
        return BrokerUnsuitableError(
            f"{text}: edgemon's will (its `offline` status) is sent at QoS 1",
            fix=QOS_FIX,
            reason=code,
        )
    return ConnectionLostError(text, reason=code)


class Terms:
    """Hears what each CONNACK and SUBACK grants; says each shortfall once."""

    __slots__ = ("_log", "_reported", "_state")

    def __init__(self, log: Any, state: ConnectionState) -> None:
        self._log = log
        self._state = state
        #: Errors already logged (each distinct one once per process).
        self._reported: set[str] = set()

    def accepted(self, connack: codec.Connack, *, persistent: bool, reconnection: bool) -> None:
        """A CONNACK accepted: BrokerUnsuitableError if the broker keeps no retained messages;
        a lost session is counted and logged."""
        if connack.properties.get(codec.RETAIN_AVAILABLE) == 0:
            raise BrokerUnsuitableError(
                "the broker keeps no retained messages (MQTT 5 Retain Available 0), and "
                "edgemon's status and throttle objects are retained",
                fix=RETAIN_FIX,
            )
        if persistent and reconnection and not connack.session_present:
            self._state.sessions_lost += 1
            self._log.warning(
                "mqtt_session_lost",
                cause="the broker kept no session for edgemon's client id (restarted without "
                "persistence, or the session expired): what devices sent while edgemon was "
                "away is lost",
                sessions_lost=self._state.sessions_lost,
            )

    def granted(self, filters: Sequence[str], codes: bytes, *, asked: int, max_qos: int) -> None:
        """A SUBACK: `codes` per filter, for `asked`; `max_qos` from the CONNACK. Below what
        was asked: `/readyz` says so, and one error is logged."""
        low = [f"{topic} QoS {code}" for topic, code in zip(filters, codes, strict=True)
               if code < asked]  # fmt: skip
        if max_qos < asked:
            low.append(f"publishes QoS {max_qos} (the broker's Maximum QoS)")
        if not low:
            self._state.degraded = None
            return
        reason = (
            f"the broker granted less than QoS {asked}: {', '.join(low)}; messages are not held "
            "until durable, so a crash or an outage loses them"
        )
        self._state.degraded = reason
        if reason not in self._reported:
            self._reported.add(reason)
            self._log.error("mqtt_qos_downgraded", problem=reason, fix=QOS_FIX)

    def refused(self, filters: Sequence[str], *, broker: str) -> None:
        """A SUBACK refusing `filters`: counted; one error for each distinct set."""
        self._state.subscriptions_refused += len(filters)
        problem = f"the broker refused the subscription to {', '.join(filters)}"
        if problem in self._reported:
            return
        self._reported.add(problem)
        self._log.error(
            "mqtt_subscription_refused",
            broker=broker,
            problem=problem,
            fix="let edgemon's broker user read its topics (deploy/mosquitto/acl)",
        )

    def unsuitable(self, error: BrokerUnsuitableError, *, broker: str) -> None:
        """A broker refused for what it lacks: one error, then a warning per attempt."""
        problem = str(error)
        if problem in self._reported:
            self._log.warning("mqtt_connect_failed", broker=broker, error=problem)
            return
        self._reported.add(problem)
        self._log.error("mqtt_broker_unsuitable", broker=broker, problem=problem, fix=error.fix)
