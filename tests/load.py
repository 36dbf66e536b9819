"""How far this machine fell behind while a test ran, measured outside the process under test.

On a loaded 2-core machine a process may not run for a second. A test whose bound depends on
the machine keeping up (an event sent within a second of its time, a healthy device that never
underran in real time) widens that bound by what `MachineLag` saw, and always asserts it.

The probe is a process of its own: a thread of the test's process, or a task on its event loop,
would be slowed by the very regression the test exists to catch, and would hide it.
"""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:
    from types import TracebackType

#: How often the probe wakes, in seconds.
TICK_S = 0.02
#: An oversleep longer than this is a stall: the machine did not run the probe for that long.
STALL_S = 0.25

#: The probe: sleeps `TICK_S` until its stdin closes, then prints each oversleep longer than
#: 1 ms (seconds, one a line).
PROBE = f"""
import sys, threading, time
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
late = []
while not done.is_set():
    began = time.monotonic()
    time.sleep({TICK_S})
    over = time.monotonic() - began - {TICK_S}
    if over > 0.001:
        late.append(over)
print("\\n".join(f"{{s:.6f}}" for s in late))
"""


class MachineLag:
    """`with MachineLag() as lag:` — after the block, `lag.oversleeps_s`: each time a
    `TICK_S` sleep of a separate process woke more than 1 ms late, by how much."""

    def __init__(self) -> None:
        self.oversleeps_s: list[float] = []
        self._probe: subprocess.Popen[str] | None = None

    def __enter__(self) -> Self:
        self._probe = subprocess.Popen(
            [sys.executable, "-c", PROBE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._probe is not None
        out, _ = self._probe.communicate(timeout=60)
        self.oversleeps_s = [float(line) for line in out.split()]

    @property
    def total_s(self) -> float:
        """All the time the probe lost, in seconds: the most any process can have been held
        back by the machine during the block, if it was held back no longer than the probe."""
        return sum(self.oversleeps_s)

    @property
    def stalls(self) -> int:
        """How many times the machine did not run the probe for longer than `STALL_S`."""
        return sum(over > STALL_S for over in self.oversleeps_s)
