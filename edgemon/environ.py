"""The environment of an engine's process: every ``EDGEMON_*`` variable that edgemon's gate,
its vLLM schedulers, its vLLM plugin and its shedding middleware read (docs/client.md), each
parsed once into a typed value. (The daemon's ``EDGEMON_<SECTION>__<KEY>`` variables are
`edgemon.settings`'.)

- `read_engine_environ`: all of them (`EngineEnviron`), read once when a scheduler or a
  middleware is built, never at import;
- `read_gate_environ`: the gate's alone (`GateEnviron`, ``EDGEMON_GATE_*``), for
  `ThrottleGate.from_environ`;
- `read_variable`: one variable (the vLLM plugin reads only ``EDGEMON_OMNI_PIPELINES``).

A value that cannot be used is one line of one `EnvironError` (a ValueError) naming its
variable; every bad variable is in it, so a misconfigured engine fails at start-up with the
whole list. A blank variable is an unset one. An ``EDGEMON_GATE_*`` variable that no gate
reads (a misspelling) is logged as a warning with the name it may have meant.

Plain Python where the daemon's settings use pydantic: a client-only install (``pip install
paho-mqtt && pip install --no-deps edgemon``, a player's or vLLM's environment) has paho-mqtt
and nothing else. Outside `edgemon.client` so that the plugin, which vLLM imports in every
process, reads its variable without loading the client.
"""

from __future__ import annotations

import difflib
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from edgemon.broker_url import Broker, parse_broker_url
from edgemon.errors import EdgemonError
from edgemon.policy.realtime import FRAME_MS
from edgemon.policy.values import (
    GUARD_MS,
    MODES,
    PREBUFFER_MS,
    SECOND_CHUNK_FRAMES,
    START_SLO_MS,
    Mode,
)
from edgemon.protocol import TOPIC_PREFIX, check_devices, check_topic_prefix

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

__all__ = [
    "DEADLINES",
    "DEADLINE_GUARD_MS",
    "DEADLINE_PREBUFFER_MS",
    "DEADLINE_SECOND_CHUNK_FRAMES",
    "GATE_MAX_HOLD_MS",
    "GATE_PREFIX",
    "GATE_VARIABLES",
    "MAX_HOLD_MS",
    "OMNI_PIPELINES",
    "PARKING",
    "PARKING_MARGIN_MS",
    "PARKING_MODES",
    "PARKING_ROWS",
    "REALTIME_FRAME_MS",
    "SLO_START_MS",
    "EngineEnviron",
    "EnvironError",
    "GateEnviron",
    "Variable",
    "gate_warnings",
    "read_engine_environ",
    "read_gate_environ",
    "read_variable",
]

T = TypeVar("T")

PARKING_MARGIN_DEFAULT_MS = 200.0
"""``EDGEMON_PARKING_MARGIN_MS`` unset: a margin of 150 ms and a delivery of 50 ms."""

_log = logging.getLogger("edgemon.client")

GATE_PREFIX = "EDGEMON_GATE_"
#: Every ``EDGEMON_GATE_*`` variable a gate reads (without the prefix).
GATE_VARIABLES = frozenset(
    {
        "DEVICE", "BROKER", "MAX_HOLD_MS", "TOPIC_PREFIX",
        "USERNAME", "PASSWORD_FILE", "CA_FILE", "CERT_FILE", "KEY_FILE",
    }
)  # fmt: skip
DEFAULT_BROKER = "mqtt://127.0.0.1:1883"
#: The longest `max_hold_ms` a gate takes.
MAX_HOLD_MS = 3_600_000.0
#: The connection's variables and the gate's keyword each sets, checked in this order against
#: the broker with those before them; the certificate and its key go together (a problem with
#: the pair names the first of them that is set).
_CONNECTION = (
    (("USERNAME", "username"),),
    (("PASSWORD_FILE", "password_file"),),
    (("CA_FILE", "ca_file"),),
    (("CERT_FILE", "cert_file"), ("KEY_FILE", "key_file")),
)
_FLAGS = {"1": True, "true": True, "yes": True, "on": True,
          "0": False, "false": False, "no": False, "off": False}  # fmt: skip


class EnvironError(EdgemonError, ValueError):
    """Variables whose values cannot be used; `problems` holds one line for each, naming it."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


class _KindError(EdgemonError, ValueError):
    """A value that is not what its variable takes (`what`)."""


@dataclass(frozen=True, slots=True)
class Variable(Generic[T]):
    """One variable: its name, how its text becomes a value (raising ValueError, or `_KindError`
    saying what it takes), and its value when unset or blank."""

    name: str
    parse: Callable[[str], T]
    default: T


def _number(what: str, accept: Callable[[float], bool]) -> Callable[[str], float]:
    """A parser of finite numbers that `accept` takes; else `_KindError(what)`."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and accept(value)):
            raise _KindError(what)
        return value

    return parse


_milliseconds = _number("a number of milliseconds ≥ 0", lambda ms: ms >= 0)
_whole = _number("a whole number of frames ≥ 0", lambda n: n >= 0 and n.is_integer())


def _frames(text: str) -> int:
    return int(_whole(text))


def _mode(text: str) -> Mode:
    lowered = text.lower()
    for mode in MODES:
        if lowered == mode:
            return mode
    raise _KindError(f"one of {', '.join(MODES)}")


PARKING_MODES = ("off", "measured", "estimated")


def _parking(text: str) -> str:
    lowered = text.lower()
    if lowered in PARKING_MODES:
        return lowered
    raise _KindError(f"one of {', '.join(PARKING_MODES)}")


def _flag(text: str) -> bool:
    try:
        return _FLAGS[text.lower()]
    except KeyError:
        raise _KindError("1, true, yes or on (or 0, false, no or off)") from None


REALTIME_FRAME_MS = Variable("EDGEMON_REALTIME_FRAME_MS", _milliseconds, FRAME_MS)
DEADLINES: Variable[Mode] = Variable("EDGEMON_DEADLINES", _mode, "off")
DEADLINE_GUARD_MS = Variable("EDGEMON_DEADLINE_GUARD_MS", _milliseconds, GUARD_MS)
DEADLINE_PREBUFFER_MS = Variable("EDGEMON_DEADLINE_PREBUFFER_MS", _milliseconds, PREBUFFER_MS)
DEADLINE_SECOND_CHUNK_FRAMES = Variable(
    "EDGEMON_DEADLINE_SECOND_CHUNK_FRAMES", _frames, SECOND_CHUNK_FRAMES
)
SLO_START_MS = Variable(
    "EDGEMON_SLO_START_MS", _number("a number of milliseconds > 0", lambda ms: ms > 0), START_SLO_MS
)
OMNI_PIPELINES = Variable("EDGEMON_OMNI_PIPELINES", _flag, default=False)
PARKING = Variable("EDGEMON_PARKING", _parking, "off")
PARKING_MARGIN_MS = Variable("EDGEMON_PARKING_MARGIN_MS", _milliseconds, PARKING_MARGIN_DEFAULT_MS)
PARKING_ROWS = Variable("EDGEMON_PARKING_ROWS", _frames, 0)
GATE_MAX_HOLD_MS: Variable[float | None] = Variable(
    f"{GATE_PREFIX}MAX_HOLD_MS",
    _number(
        f"a number of milliseconds 0 < x ≤ {MAX_HOLD_MS:.0f}",
        lambda ms: 0 < ms <= MAX_HOLD_MS,
    ),
    None,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class GateEnviron:
    """The gate's variables: the devices it follows, the broker, the hold bound, the prefix."""

    device: str
    """``EDGEMON_GATE_DEVICE`` as given: one id, a comma-separated list, or ``+``."""
    devices: tuple[str, ...]
    """The same, checked: ``("+",)`` or the ids, sorted."""
    broker_url: str
    """``EDGEMON_GATE_BROKER`` (default ``mqtt://127.0.0.1:1883``)."""
    broker: Broker
    """The broker with the connection's variables (credentials read, TLS files checked)."""
    connection: dict[str, str]
    """The connection's variables that are set, by the gate's keyword (``username``,
    ``password_file``, ``ca_file``, ``cert_file``, ``key_file``)."""
    max_hold_ms: float | None
    """``EDGEMON_GATE_MAX_HOLD_MS`` (None: the gate's default)."""
    topic_prefix: str
    """``EDGEMON_GATE_TOPIC_PREFIX`` (default ``edgemon/v1``)."""

    def gate_keywords(self) -> dict[str, Any]:
        """The keyword arguments of a `ThrottleGate` (besides the broker URL and device)."""
        hold = {} if self.max_hold_ms is None else {"max_hold_ms": self.max_hold_ms}
        return hold | {"topic_prefix": self.topic_prefix} | self.connection


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineEnviron:
    """Every variable of an engine's process; see the module doc."""

    gate: GateEnviron | None
    """The gate's variables; None without ``EDGEMON_GATE_DEVICE`` (no gate, no capacity)."""
    realtime_frame_ms: float
    """``EDGEMON_REALTIME_FRAME_MS``: the decode step real-time admission allows (0: off)."""
    deadlines: Mode
    """``EDGEMON_DEADLINES``: off, hold or shed."""
    deadline_guard_ms: float
    """``EDGEMON_DEADLINE_GUARD_MS``: kept in hand of every start budget."""
    deadline_prebuffer_ms: float
    """``EDGEMON_DEADLINE_PREBUFFER_MS``: the players' cushion and the delivery to them."""
    deadline_second_chunk_frames: int
    """``EDGEMON_DEADLINE_SECOND_CHUNK_FRAMES``: the second chunk a player waits for."""
    slo_start_ms: float
    """``EDGEMON_SLO_START_MS``: the start SLO."""
    omni_pipelines: bool
    """``EDGEMON_OMNI_PIPELINES``: register edgemon's vLLM-Omni pipelines."""
    parking: str = "off"
    """``EDGEMON_PARKING``: off, or the feed parking runs on (measured needs the gate's
    device: its slack feed)."""
    parking_margin_ms: float = PARKING_MARGIN_DEFAULT_MS
    """``EDGEMON_PARKING_MARGIN_MS``: the margin and delivery a parked stream rejoins with,
    beyond its next chunk."""
    parking_rows: int = 0
    """``EDGEMON_PARKING_ROWS``: the batch's rows, parked streams not counted (0: vLLM's
    ``--max-num-seqs``, whose seats then hold the parked streams too)."""

    @property
    def frame_ms(self) -> float:
        """The audio of one frame: the real-time frame when set, else a codec frame."""
        return self.realtime_frame_ms or FRAME_MS


class _Reading:
    """One pass over an environment: each variable's value, and a line for each bad one."""

    __slots__ = ("environ", "problems")

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self.problems: list[str] = []

    def text(self, name: str) -> str:
        return self.environ.get(name, "").strip()

    def value(self, variable: Variable[T]) -> T:
        """`variable`'s value (its default when unset, or when bad: then a problem)."""
        text = self.text(variable.name)
        if not text:
            return variable.default
        checked = self.checked(variable.name, variable.parse, text)
        return variable.default if checked is None else checked

    def checked(self, name: str, check: Callable[[str], T], text: str) -> T | None:
        """`check(text)`, or None with a problem naming `name` (`check` never returns None)."""
        try:
            return check(text)
        except _KindError as exc:
            self.problems.append(f"{name}: {text!r} is not {exc}")
        except ValueError as exc:
            self.problems.append(f"{name}: {exc}")
        return None

    def done(self) -> None:
        """Raise `EnvironError` if a variable was bad."""
        if self.problems:
            raise EnvironError(self.problems)


def gate_warnings(environ: Mapping[str, str]) -> list[str]:
    """``EDGEMON_GATE_*`` variables that no gate reads (a misspelling would otherwise be
    ignored silently), each with the closest name it may have meant."""
    problems = []
    for name in sorted(environ):
        prefix = GATE_PREFIX
        if not name.upper().startswith(prefix) or name[len(prefix) :] in GATE_VARIABLES:
            continue
        close = difflib.get_close_matches(name[len(prefix) :].upper(), GATE_VARIABLES, n=1)
        hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
        known = ", ".join(sorted(GATE_VARIABLES))
        problems.append(f"{name} is not a gate setting, ignored{hint}; the gate reads {prefix}"
                        f"{{{known}}}")  # fmt: skip
    return problems


def _gate(reading: _Reading) -> GateEnviron | None:
    """The gate's variables (warning of any it does not read); None without a device."""
    for problem in gate_warnings(reading.environ):
        _log.warning("edgemon gate: %s", problem)
    device = reading.text(f"{GATE_PREFIX}DEVICE")
    if not device:
        return None
    devices = reading.checked(f"{GATE_PREFIX}DEVICE", check_devices, device)
    url = reading.text(f"{GATE_PREFIX}BROKER") or DEFAULT_BROKER
    broker = reading.checked(f"{GATE_PREFIX}BROKER", parse_broker_url, url)
    prefix = reading.text(f"{GATE_PREFIX}TOPIC_PREFIX") or TOPIC_PREFIX
    reading.checked(f"{GATE_PREFIX}TOPIC_PREFIX", check_topic_prefix, prefix)
    max_hold_ms = reading.value(GATE_MAX_HOLD_MS)
    connection: dict[str, str] = {}
    for group in _CONNECTION if broker is not None else ():
        given = {key: text for suffix, key in group if (text := reading.text(GATE_PREFIX + suffix))}
        if not given:
            continue
        blamed = next(GATE_PREFIX + suffix for suffix, key in group if key in given)
        tried = connection | given
        checked = reading.checked(blamed, _broker_with(tried), url)
        if checked is not None:
            broker, connection = checked, tried
    if devices is None or broker is None or reading.problems:
        return None
    return GateEnviron(
        device=device,
        devices=devices,
        broker_url=url,
        broker=broker,
        connection=connection,
        max_hold_ms=max_hold_ms,
        topic_prefix=prefix,
    )


def _broker_with(connection: Mapping[str, str]) -> Callable[[str], Broker]:
    """A parser of broker URLs with `connection`'s keywords (credentials, TLS files)."""
    keywords: dict[str, Any] = dict(connection)
    return lambda url: parse_broker_url(url, **keywords)


def read_gate_environ(environ: Mapping[str, str]) -> GateEnviron | None:
    """The gate's variables; None without ``EDGEMON_GATE_DEVICE``. `EnvironError` names each
    bad one."""
    reading = _Reading(environ)
    gate = _gate(reading)
    reading.done()
    return gate


def read_engine_environ(environ: Mapping[str, str]) -> EngineEnviron:
    """Every variable of an engine's process. `EnvironError` names each bad one."""
    reading = _Reading(environ)
    engine = EngineEnviron(
        gate=_gate(reading),
        realtime_frame_ms=reading.value(REALTIME_FRAME_MS),
        deadlines=reading.value(DEADLINES),
        deadline_guard_ms=reading.value(DEADLINE_GUARD_MS),
        deadline_prebuffer_ms=reading.value(DEADLINE_PREBUFFER_MS),
        deadline_second_chunk_frames=reading.value(DEADLINE_SECOND_CHUNK_FRAMES),
        slo_start_ms=reading.value(SLO_START_MS),
        omni_pipelines=reading.value(OMNI_PIPELINES),
        parking=reading.value(PARKING),
        parking_margin_ms=reading.value(PARKING_MARGIN_MS),
        parking_rows=reading.value(PARKING_ROWS),
    )
    if engine.parking == "measured" and engine.gate is None:
        reading.problems.append(
            "EDGEMON_PARKING: measured parks on edgemon's slack feed of EDGEMON_GATE_DEVICE, "
            "which is not set"
        )
    reading.done()
    return engine


def read_variable(environ: Mapping[str, str], variable: Variable[T]) -> T:
    """One variable's value. `EnvironError` if it is bad."""
    reading = _Reading(environ)
    value = reading.value(variable)
    reading.done()
    return value
