"""The gate's environment (docs/client.md): which `EDGEMON_GATE_*` variables exist, what a
gate is made of them, and a warning for any other (a misspelt `EDGEMON_GATE_BROKR` would
otherwise be ignored silently)."""

from __future__ import annotations

import difflib
import math
from typing import TYPE_CHECKING, Any

from edgemon.broker_url import parse_broker_url
from edgemon.client import _mqtt
from edgemon.protocol import TOPIC_PREFIX, check_topic_prefix

if TYPE_CHECKING:
    from collections.abc import Mapping

ENV = "EDGEMON_GATE_"
#: Every `EDGEMON_GATE_*` variable a gate reads.
GATE_VARIABLES = frozenset(
    {
        "DEVICE", "BROKER", "MAX_HOLD_MS", "TOPIC_PREFIX",
        "USERNAME", "PASSWORD_FILE", "CA_FILE", "CERT_FILE", "KEY_FILE",
    }
)  # fmt: skip


def environment_warnings(environ: Mapping[str, str]) -> list[str]:
    """`EDGEMON_GATE_*` variables that no gate reads (a misspelling would otherwise be
    ignored silently), each with the closest name it may have meant."""
    problems = []
    for name in sorted(environ):
        if not name.upper().startswith(ENV) or name[len(ENV) :] in GATE_VARIABLES:
            continue
        close = difflib.get_close_matches(name[len(ENV) :].upper(), GATE_VARIABLES, n=1)
        hint = f" (did you mean {ENV}{close[0]}?)" if close else ""
        known = ", ".join(sorted(GATE_VARIABLES))
        problems.append(f"{name} is not a gate setting, ignored{hint}; the gate reads {ENV}"
                        f"{{{known}}}")  # fmt: skip
    return problems


def gate_arguments(environ: Mapping[str, str]) -> tuple[str, str, dict[str, Any]] | None:
    """`(broker_url, device, keywords)` of a `ThrottleGate` from `EDGEMON_GATE_*`; None
    without `EDGEMON_GATE_DEVICE`. A bad value raises ValueError naming the variable; a
    variable no gate reads is logged as a warning."""
    for problem in environment_warnings(environ):
        _mqtt.log.warning("edgemon gate: %s", problem)
    device = environ.get(f"{ENV}DEVICE", "").strip()
    if not device:
        return None
    kwargs: dict[str, Any] = {}
    hold = environ.get(f"{ENV}MAX_HOLD_MS", "").strip()
    if hold:
        try:
            kwargs["max_hold_ms"] = float(hold)
        except ValueError:
            raise ValueError(f"{ENV}MAX_HOLD_MS: {hold!r} is not a number") from None
        if not math.isfinite(kwargs["max_hold_ms"]):
            raise ValueError(f"{ENV}MAX_HOLD_MS: {hold!r} is not a finite number")
    prefix = environ.get(f"{ENV}TOPIC_PREFIX", "").strip()
    if prefix:
        kwargs["topic_prefix"] = prefix
    broker = environ.get(f"{ENV}BROKER", "").strip() or "mqtt://127.0.0.1:1883"
    kwargs |= connection_from_environ(environ, broker)
    for name, check in (
        ("DEVICE", lambda: _mqtt.check_devices(device)),
        ("BROKER", lambda: parse_broker_url(broker)),
        ("TOPIC_PREFIX", lambda: check_topic_prefix(prefix or TOPIC_PREFIX)),
    ):
        try:
            check()
        except ValueError as exc:
            raise ValueError(f"{ENV}{name}: {exc}") from None
    return broker, device, kwargs


def connection_from_environ(environ: Mapping[str, str], broker: str) -> dict[str, Any]:
    """`username`, `password_file` and `ca_file` from `EDGEMON_GATE_*`, each checked against
    `broker` (ValueError naming the variable)."""
    kwargs: dict[str, Any] = {}
    for name, key in (
        ("USERNAME", "username"),
        ("PASSWORD_FILE", "password_file"),
        ("CA_FILE", "ca_file"),
    ):
        value = environ.get(f"{ENV}{name}", "").strip()
        if not value:
            continue
        try:
            parse_broker_url(broker, **(kwargs | {key: value}))
        except ValueError as exc:
            raise ValueError(f"{ENV}{name}: {exc}") from None
        kwargs[key] = value
    return kwargs
