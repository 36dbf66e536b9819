"""The gate's environment (docs/client.md): which `EDGEMON_GATE_*` variables exist, and a warning
for any other (a misspelt `EDGEMON_GATE_BROKR` would otherwise be ignored silently)."""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

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
