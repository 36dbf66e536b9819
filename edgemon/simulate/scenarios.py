"""What happens to a box besides its steady Poisson load: slowdowns, bursts, a slow network.

Pure and seeded. A `Scenario` is steady plus at most one of:

- **slowdown** `F:W:P`: every step takes F times as long for the last W seconds of every P
  seconds (the first window begins at P − W, so a run starts steady). The default 1.3:20:60
  is an assumption, not a measurement: Jetson Orin power modes differ by 36–47 % in token rate
  in public benchmarks (step time ×1.36–1.47 between neighbouring modes), and thermal
  throttling or another job on the same GPU does the same for a while; ×1.3 is a little below
  the smallest of those, for a third of the time;
- **burst** `K:T`: K requests at once every T seconds (at T, 2T, …) on top of the Poisson
  load, drawn from the same workload (a group of people asking at once, a notification);
- **network** `D:S:P`: every chunk's delivery to its player takes D ms longer during the last
  S seconds of every P seconds (a Wi-Fi link that degrades now and then; every player of the
  box shares it). A stream's chunks are never reordered;
- **contention** `W:P:SHARE`: another job takes SHARE of the engine's compute for the last W
  seconds of every P seconds. On the real engine (`benchmarks/real_engine.py`) a co-tenant
  process does it; here it is the step slowdown that co-tenant was measured to cause on the
  profile's box (`Profile.contention_factor`), applied as a slowdown in those windows;
- **pause**, **wifi**, **device**, **prebuffer**: listeners and players doing what the server
  cannot see (`edgemon.simulate.listeners`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgemon.simulate.listeners import (
    DEFAULT_DEVICE,
    DEFAULT_PAUSE,
    DEFAULT_PREBUFFER,
    DEFAULT_WIFI,
    LISTENER_SCENARIOS,
    Listening,
    listening,
)
from edgemon.simulate.workload import Arrivals, Request, draw

if TYPE_CHECKING:
    from edgemon.simulate.profiles import Workload

SCENARIOS = ("steady", "slowdown", "burst", "network", "contention", *LISTENER_SCENARIOS)
DEFAULT_SLOWDOWN = "1.3:20:60"
DEFAULT_BURST = "6:30"
DEFAULT_NETWORK = "300:5:30"
DEFAULT_CONTENTION = "20:60:0.5"


@dataclass(frozen=True, slots=True)
class Windows:
    """The last `window_s` seconds of every `period_s` seconds."""

    window_s: float
    period_s: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.period_s) and self.period_s > 0):
            raise ValueError("the period must be a number > 0")
        if not (math.isfinite(self.window_s) and 0 < self.window_s <= self.period_s):
            raise ValueError("the window must be > 0 and at most the period")

    def active(self, t_ms: float) -> bool:
        """Whether `t_ms` (ms since the run's start) falls in a window."""
        period_ms = self.period_s * 1000.0
        return t_ms % period_ms >= period_ms - self.window_s * 1000.0


@dataclass(frozen=True, slots=True)
class Slowdown:
    """Steps take `factor` times as long inside the windows."""

    factor: float
    windows: Windows

    def factor_at(self, t_ms: float) -> float:
        """The step-time factor at `t_ms`."""
        return self.factor if self.windows.active(t_ms) else 1.0


@dataclass(frozen=True, slots=True)
class Burst:
    """`size` extra requests at once every `every_s` seconds."""

    size: int
    every_s: float


@dataclass(frozen=True, slots=True)
class Network:
    """Chunk deliveries take `delay_ms` longer inside the windows."""

    delay_ms: float
    windows: Windows

    def extra_ms(self, t_ms: float) -> float:
        """The extra delivery delay of a chunk sent at `t_ms`."""
        return self.delay_ms if self.windows.active(t_ms) else 0.0


@dataclass(frozen=True, slots=True)
class Scenario:
    """Steady load plus what the scenario adds (see the module doc)."""

    name: str = "steady"
    slowdown: Slowdown | None = None
    burst: Burst | None = None
    network: Network | None = None
    listeners: Listening | None = None
    """What the listeners do that the server cannot see (`edgemon.simulate.listeners`)."""

    def step_factor(self, t_ms: float) -> float:
        """Step-time factor at `t_ms` (1 outside a slowdown)."""
        return 1.0 if self.slowdown is None else self.slowdown.factor_at(t_ms)

    def network_ms(self, t_ms: float) -> float:
        """Extra delivery delay at `t_ms` (0 outside a network episode)."""
        return 0.0 if self.network is None else self.network.extra_ms(t_ms)

    def describe(self) -> str:
        """The parameters, as the flags that give them."""
        if self.slowdown is not None:
            s = self.slowdown
            return f"{self.name} {s.factor:g}:{s.windows.window_s:g}:{s.windows.period_s:g}"
        if self.burst is not None:
            return f"burst {self.burst.size}:{self.burst.every_s:g}"
        if self.network is not None:
            n = self.network
            return f"network {n.delay_ms:g}:{n.windows.window_s:g}:{n.windows.period_s:g}"
        if self.listeners is not None:
            return self.listeners.describe()
        return "steady"


STEADY = Scenario()
"""No slowdown, no burst, no network episode."""


def _numbers(text: str, count: int, flag: str) -> list[float]:
    parts = text.split(":")
    try:
        values = [float(part) for part in parts]
    except ValueError:
        values = []
    if len(values) != count or not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"{flag} takes {count} numbers > 0 separated by ':', not {text!r}")
    return values


def parse_contention(text: str) -> tuple[Windows, float]:
    """`W:P:SHARE` (`--contention`): the windows and the share of the core taken in them."""
    window, period, share = _numbers(text, 3, "--contention W:P:SHARE")
    if share >= 1:
        raise ValueError(f"--contention: SHARE is a share of the core below 1, not {share:g}")
    return _windows(window, period, "--contention"), share


def scenario(
    name: str,
    *,
    slowdown: str = DEFAULT_SLOWDOWN,
    burst: str = DEFAULT_BURST,
    network: str = DEFAULT_NETWORK,
    contention: str = DEFAULT_CONTENTION,
    factor: float | None = None,
    listeners: dict[str, str] | None = None,
) -> Scenario:
    """The scenario `name` with its flag's parameters (ValueError naming what is wrong).

    `contention` needs `factor`: the step slowdown its share causes (the profile's measured
    `contention_factor`); `listeners` maps `pause`, `wifi`, `device` and `prebuffer` to their
    flags' text (default: `edgemon.simulate.listeners`'s)."""
    if name == "steady":
        return STEADY
    if name == "contention":
        windows, _ = parse_contention(contention)
        if factor is None or not (math.isfinite(factor) and factor >= 1):
            raise ValueError("contention: the measured step slowdown (a factor ≥ 1) is needed")
        return Scenario(name, slowdown=Slowdown(factor, windows))
    if name == "slowdown":
        factor, window, period = _numbers(slowdown, 3, "--slowdown F:W:P")
        if factor < 1:
            raise ValueError(f"--slowdown: the factor must be ≥ 1, not {factor:g}")
        return Scenario(name, slowdown=Slowdown(factor, _windows(window, period, "--slowdown")))
    if name == "burst":
        size, every = _numbers(burst, 2, "--burst K:T")
        if size != int(size):
            raise ValueError(f"--burst: K must be a whole number, not {size:g}")
        return Scenario(name, burst=Burst(int(size), every))
    if name == "network":
        delay, window, period = _numbers(network, 3, "--network D:S:P")
        return Scenario(name, network=Network(delay, _windows(window, period, "--network")))
    if name in LISTENER_SCENARIOS:
        texts = {
            "pause": DEFAULT_PAUSE,
            "wifi": DEFAULT_WIFI,
            "device": DEFAULT_DEVICE,
            "prebuffer": DEFAULT_PREBUFFER,
        }
        texts.update(listeners or {})
        return Scenario(name, listeners=listening(name, texts[name]))
    raise ValueError(f"unknown scenario {name!r}: {', '.join(SCENARIOS)}")


def _windows(window: float, period: float, flag: str) -> Windows:
    try:
        return Windows(window, period)
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None


class RequestSource:
    """A box's requests: the Poisson `Arrivals`, plus the scenario's bursts (ids `b0`, `b1`…).

    The same interface as `Arrivals` (`due`, `next_ms`); with no burst it hands out exactly
    what `Arrivals` does.
    """

    __slots__ = (
        "_burst",
        "_count",
        "_next_burst_ms",
        "_poisson",
        "_rng",
        "until_ms",
        "workload",
    )

    def __init__(
        self,
        rate_rps: float,
        workload: Workload,
        *,
        seed: int,
        burst: Burst | None = None,
        until_ms: float = math.inf,
    ) -> None:
        self._poisson = Arrivals(rate_rps, workload, seed=seed)
        self.workload = workload
        self._burst = burst
        self._rng = random.Random(f"burst/{seed}")  # noqa: S311 - a simulation
        self._count = 0
        self._next_burst_ms = math.inf if burst is None else burst.every_s * 1000.0
        #: No request arrives after this (a run that stops its arrivals and drains).
        self.until_ms = until_ms

    @property
    def next_ms(self) -> float:
        """When the next request arrives (infinity: none will)."""
        soonest = min(self._poisson.next_ms, self._next_burst_ms)
        return soonest if soonest <= self.until_ms else math.inf

    def due(self, t_ms: float) -> list[Request]:
        """Every request arriving at or before `t_ms`, in arrival order."""
        t_ms = min(t_ms, self.until_ms)
        out = self._poisson.due(t_ms)
        burst = self._burst
        if burst is None or self._next_burst_ms > t_ms:
            return out
        while self._next_burst_ms <= t_ms:
            at = self._next_burst_ms
            out.extend(self._draw(at) for _ in range(burst.size))
            self._next_burst_ms += burst.every_s * 1000.0
        out.sort(key=lambda request: request.arrival_ms)
        return out

    def _draw(self, at_ms: float) -> Request:
        request = draw(self._rng, self.workload, f"b{self._count}", at_ms)
        self._count += 1
        return request
