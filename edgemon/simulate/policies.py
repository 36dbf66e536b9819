"""What an engine does with new requests: the policies the closed-loop benchmark compares.

A policy is written as parts joined by `+`:

- `open`: vLLM's own scheduling with the profile's `max_num_seqs`, no gate;
- `cap:N`: a static `max_num_seqs = N`, no gate (what an operator can do without edgemon);
- `queued:N:M`: `--max-num-seqs N --max-num-queued-reqs M`: vLLM's API server refuses (503)
  a request arriving while M are in flight (`edgemon.simulate.serving`);
- `tokens:N:T`: `--max-num-seqs N --max-num-queued-tokens T`: it refuses one arriving while
  the prefill backlog is at least T prompt tokens;
- `chunked:B` or `chunked:B:L`: `--max-num-batched-tokens B` and
  `--long-prefill-token-threshold L` (chunked prefill: a step's token budget, and the most
  prompt tokens one request prefills in a step);
- `estimated-park` or `estimated-park:PARK_MS:RESUME_MS`: the peers' pacing by the server's
  estimate of each client's buffer (`edgemon.simulate.estimated`): a stream whose estimated
  lead passes 1000 ms leaves the batch until it would be down to 400 ms (sglang-omni #1903);
- `estimated-edf` or `estimated-edf:K`: at most K streams decode a step, earliest estimated
  run-dry first (vLLM-Omni PR #6600; K defaults to the profile's N*, the largest batch whose
  step fits a frame);
- `gate:MARGIN_MS:HOLD_MS`: edgemon's throttle (the seed's rule, players asking for
  `MARGIN_MS`) obeyed through the gate with `max_hold_ms = HOLD_MS`; after a hold of that
  length one step is let through;
- `lasting:MARGIN_MS:HOLD_MS`: the same, but the release lasts until a step admits a waiting
  request or the queue is empty;
- `realtime` or `realtime:F`: real-time admission (`edgemon.policy.realtime`): never
  more requests running than the measured decode step fits in F frames (default 1);
- `budget`, `budget:FRAMES`, `budget:FRAMES:ALLOW_MS` or `budget:FRAMES:ALLOW_MS:MODE`:
  budget-aware admission (`edgemon.simulate.budget`): a waiting request is admitted only if
  its predicted cost (its prefill plus FRAMES more decodes, default 12) fits the spendable
  headroom edgemon's last throttle object carried, plus ALLOW_MS (default 0); MODE `refill`
  (default), `stale` or `fresh` (an upper bound, see there). Measured, not shipped;
- `deadline`, `deadline:ORDER`, `deadline:ORDER:SHED`, `deadline:ORDER:SHED:GUARD_MS` or
  `deadline:ORDER:SHED:GUARD_MS:BATCH`: the deadline policy
  (`edgemon.policy.deadlines`): every waiting request's hold ends at its start deadline;
  ORDER `fcfs` (default) or `edf` (earliest deadline first); SHED `shed` (default: refuse what
  cannot start within the start SLO, at arrival or while queued), `arrival` (at arrival
  only), `queued` (while queued only) or `queue` (never); GUARD_MS taken off every start
  budget (default 0); BATCH `amortized` (default: the batch whose steps average a frame with
  prefills spread over requests' frames) or `decode` (the real-time admission's decode-only
  batch). With `realtime` it uses the measured real-time batch; with a gate, the gate's hold
  is bounded by each deadline;
- `park:FEED`: edgemon's parking (`edgemon.policy.parking`): a running stream whose player
  holds well over what it needs sits steps out while a request waits for its row, and rejoins
  in time; FEED `measured` (the players' own reports, edgemon's slack feed) or `estimated`
  (the server's estimate, the peers' formula);
- `feed:FEED`: what edgemon's policy is fed of its players, for the deadline policy's headroom
  and the parking: `measured`, `estimated`, `none` (neither: no headroom, no parking), or
  `oracle` (parking on each player's true buffer at every instant, pauses known when they
  begin: an upper bound on what any feed could buy; the headroom as `measured`);
- `edgemon`: the policy edgemon ships, `EDGEMON` below (also as a part: `edgemon+budget`).

So `cap:11`, `queued:10:12`, `gate:80:2000`, `realtime+lasting:80:2000`. Pure;
`policy(text, profile)` raises ValueError naming what is wrong (`profile` gives `edgemon`
its margin, and `estimated-edf` its window).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from edgemon.policy.deadlines import GUARD_MS, ORDERS, DeadlineSettings
from edgemon.simulate.budget import AHEAD_FRAMES, BUDGET_MODES, BudgetSetting
from edgemon.simulate.estimated import PARK_MS, RESUME_MS, PacingSetting
from edgemon.simulate.parked import FEEDS, PARKING_FEEDS
from edgemon.simulate.serving import OPEN_SERVING, Serving

if TYPE_CHECKING:
    from edgemon.simulate.profiles import Profile

BUDGET_ARGS = ("FRAMES", "ALLOW_MS", "MODE")
"""What `budget:` takes, in order, each optional."""
DEADLINE_ARGS = ("ORDER", "SHED", "GUARD_MS", "BATCH")
"""What `deadline:` takes, in order, each optional."""
SHED_WORDS = ("shed", "arrival", "queued", "queue")
"""`deadline:`'s SHED: at arrival and while queued, at arrival only, while queued only, never."""
BATCH_WORDS = ("amortized", "decode")

EDGEMON = "realtime+deadline:fcfs:shed:{guard}+headroom"
"""The shipped policy: real-time admission with steps up to a frame, as the schedulers allow,
and the deadline policy: the batch whose steps average a frame with
prefills counted, waiting requests admitted in arrival order, every hold bounded by the
request's start deadline, and what cannot start within the start SLO refused, with
`SHIPPED_GUARD_MS` taken off every start budget. Chosen by goodput (README "Does it help?"):
edgemon's gate on top of it (`+lasting:{margin}:1100`, the shipped policy before deadlines)
measured no better on `jetson` and 4–5 points lower on `x86-gpu` in overload."""
SHIPPED_GUARD_MS = GUARD_MS
"""What the shipped policy keeps in hand of every start budget (`deadlines.GUARD_MS`)."""
PREVIOUS = "realtime:1.02+lasting:{margin}:1100"
"""The shipped policy before deadlines (real-time admission and edgemon's gate)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """One policy setting, as the engine applies it."""

    label: str
    max_num_seqs: int | None = None
    serving: Serving = OPEN_SERVING
    """vLLM's other flags (`queued:`, `tokens:`, `chunked:`)."""
    pacing: PacingSetting | None = None
    """The peers' pacing by estimated buffers (`estimated-park`, `estimated-edf`)."""
    gated: bool = False
    margin_ms: float | None = None
    max_hold_ms: float = 2000.0
    lasting: bool = False
    realtime: bool = False
    realtime_frames: float = 1.0
    """Real-time admission's allowed step, in frames."""
    budget: BudgetSetting | None = None
    """Budget-aware admission (`edgemon.simulate.budget`)."""
    deadlines: DeadlineSettings | None = None
    """The deadline policy (`edgemon.policy.deadlines`)."""
    parking: str | None = None
    """edgemon's parking, on `measured`, `estimated` or `oracle` leads (None: none)."""
    feed: str | None = None
    """Where the deadline policy's headroom comes from: `measured` or `oracle` (edgemon's
    slack feed), `estimated` (the server's estimate), `none`; None: edgemon's throttle
    objects, as the gate carries them."""

    @property
    def kind(self) -> str:
        """`open`, `cap` (a static configuration of vLLM's flags), `estimated` (the peers'
        pacing), `gate` or `mine` (the families the report compares)."""
        mine = self.budget is not None or self.deadlines is not None or self.parking is not None
        if self.realtime or self.lasting or mine:
            return "mine"
        if self.gated:
            return "gate"
        if self.pacing is not None:
            return "estimated"
        if self.max_num_seqs is not None or self.serving != OPEN_SERVING:
            return "cap"
        return "open"


OPEN_POLICY = Policy(label="open")
"""vLLM's own scheduling with the profile's limits."""


@dataclass(slots=True)
class _Parts:
    """What the parts of one policy text set, as they are read."""

    text: str
    cap: int | None = None
    serving: dict[str, int] = field(default_factory=dict)
    pacing: PacingSetting | None = None
    gate: tuple[float | None, float, bool] | None = None  # margin, hold, lasting
    realtime: bool = False
    frames: float = 1.0
    budget: BudgetSetting | None = None
    deadlines: DeadlineSettings | None = None
    parking: str | None = None
    feed: str | None = None

    def read(self, name: str, args: list[str], profile: Profile) -> bool:
        """Take the part `name:args`; False if it is no part."""
        if name == "open" and not args:
            return True
        return self._static(name, args, profile) or self._edgemon(name, args)

    def _static(self, name: str, args: list[str], profile: Profile) -> bool:
        """vLLM's own flags and the peers' pacing; False if `name:args` is neither."""
        whole = self.text
        if name == "cap" and len(args) == 1:
            self.cap = _count(args[0], whole)
        elif name in {"queued", "tokens"} and len(args) == 2:
            self.cap = _count(args[0], whole)
            flag = "max_num_queued_reqs" if name == "queued" else "max_num_queued_tokens"
            self.serving[flag] = _count(args[1], whole)
        elif name == "chunked" and 1 <= len(args) <= 2:
            self.serving["max_num_batched_tokens"] = _count(args[0], whole)
            if len(args) == 2:
                self.serving["long_prefill_token_threshold"] = _count(args[1], whole)
        elif name == "estimated-park" and len(args) in {0, 2}:
            park, resume = (_number(a, whole) for a in args) if args else (PARK_MS, RESUME_MS)
            if not resume < park:
                raise ValueError(f"policy {whole!r}: RESUME_MS must be below PARK_MS")
            self.pacing = PacingSetting("park", park_ms=park, resume_ms=resume)
        elif name == "estimated-edf" and len(args) <= 1:
            window = _count(args[0], whole) if args else profile.realtime_concurrency()
            self.pacing = PacingSetting("edf", window=window)
        else:
            return False
        return True

    def _edgemon(self, name: str, args: list[str]) -> bool:
        """edgemon's parts; False if `name:args` is none of them."""
        whole = self.text
        if name in {"gate", "lasting"} and len(args) == 2:
            margin, hold = (_number(a, whole) for a in args)
            if hold <= 0:
                raise ValueError(f"policy {whole!r}: the hold must be > 0 ms")
            self.gate = (margin, hold, name == "lasting")
        elif name == "realtime" and len(args) <= 1:
            self.realtime = True
            self.frames = _number(args[0], whole) if args else 1.0
            if self.frames <= 0:
                raise ValueError(f"policy {whole!r}: the frames must be > 0")
        elif name == "budget" and len(args) <= len(BUDGET_ARGS):
            self.budget = _budget(args, whole)
        elif name == "deadline" and len(args) <= len(DEADLINE_ARGS):
            self.deadlines = _deadlines(args, whole)
        elif name == "headroom" and not args:
            if self.deadlines is None:
                raise ValueError(f"policy {whole!r}: `headroom` follows a `deadline` part")
            self.deadlines = replace(self.deadlines, estimate_headroom=True)
        else:
            return self._fed(name, args)
        return True

    def _fed(self, name: str, args: list[str]) -> bool:
        """`park:` and `feed:`; False if `name:args` is neither."""
        if name == "park" and len(args) == 1 and args[0] in PARKING_FEEDS:
            self.parking = args[0]
        elif name == "feed" and len(args) == 1 and args[0] in FEEDS:
            self.feed = args[0]
            self.parking = None if args[0] == "none" else args[0]
        else:
            return False
        return True


def policy(text: str, profile: Profile) -> Policy:
    """Parse `text` (see the module doc)."""
    label = text.strip()
    shipped = EDGEMON.format(margin=f"{profile.margin_ms:g}", guard=f"{SHIPPED_GUARD_MS:g}")
    expanded = "+".join(shipped if part.strip() == "edgemon" else part for part in label.split("+"))
    parts = _Parts(text)
    for part in expanded.split("+"):
        name, _, rest = part.strip().partition(":")
        if not parts.read(name, rest.split(":") if rest else [], profile):
            raise ValueError(
                f"unknown policy {text!r}: open, cap:N, queued:N:M, tokens:N:T, chunked:B[:L], "
                "estimated-park[:PARK_MS:RESUME_MS], estimated-edf[:K], gate:MARGIN_MS:HOLD_MS, "
                "lasting:MARGIN_MS:HOLD_MS, realtime[:F], budget[:FRAMES[:ALLOW_MS[:MODE]]], "
                "deadline[:ORDER[:SHED[:GUARD_MS[:BATCH]]]], park:measured|estimated|oracle, "
                "feed:measured|estimated|none|oracle, edgemon, or parts joined by '+'"
            )
    gate_margin, gate_hold, gate_lasting = (
        (None, 2000.0, False) if parts.gate is None else parts.gate
    )
    try:
        serving = Serving(**parts.serving)
    except ValueError as exc:
        raise ValueError(f"policy {text!r}: {exc}") from None
    deadlines = parts.deadlines
    if parts.feed is not None and deadlines is not None:
        # The feed replaces `headroom`: the estimate only when fed the estimate.
        deadlines = replace(deadlines, estimate_headroom=parts.feed == "estimated")
    return Policy(
        label=label,
        max_num_seqs=parts.cap,
        serving=serving,
        pacing=parts.pacing,
        gated=parts.gate is not None,
        margin_ms=gate_margin,
        max_hold_ms=gate_hold,
        lasting=gate_lasting,
        realtime=parts.realtime,
        realtime_frames=parts.frames,
        budget=parts.budget,
        deadlines=deadlines,
        parking=parts.parking,
        feed=parts.feed,
    )


def _deadlines(args: list[str], whole: str) -> DeadlineSettings:
    """`deadline[:ORDER[:SHED[:GUARD_MS]]]` (`args`: the words after `deadline:`)."""
    order = next((o for o in ORDERS if o == (args[0] if args else "fcfs")), None)
    if order is None:
        raise ValueError(f"policy {whole!r}: the deadline's order is one of {', '.join(ORDERS)}")
    word = args[1] if len(args) > 1 else "shed"
    if word not in SHED_WORDS:
        raise ValueError(f"policy {whole!r}: the deadline's SHED is one of {', '.join(SHED_WORDS)}")
    guard = _number(args[2], whole) if len(args) > 2 else 0.0
    batch = args[3] if len(args) > 3 else "amortized"
    if batch not in BATCH_WORDS:
        raise ValueError(
            f"policy {whole!r}: the deadline's BATCH is one of {', '.join(BATCH_WORDS)}"
        )
    return DeadlineSettings(
        order=order,
        shed=word != "queue",
        shed_at_arrival=word != "queued",
        shed_queued=word != "arrival",
        guard_ms=guard,
        amortize=batch == "amortized",
    )


def _budget(args: list[str], whole: str) -> BudgetSetting:
    """`budget[:FRAMES[:ALLOW_MS[:MODE]]]` (`args`: the words after `budget:`)."""
    word = args[2] if len(args) == len(BUDGET_ARGS) else "refill"
    mode = next((m for m in BUDGET_MODES if m == word), None)
    if mode is None:
        raise ValueError(f"policy {whole!r}: the budget's mode is one of {', '.join(BUDGET_MODES)}")
    return BudgetSetting(
        ahead_frames=_number(args[0], whole) if args else AHEAD_FRAMES,
        allowance_ms=_number(args[1], whole) if len(args) > 1 else 0.0,
        mode=mode,
    )


def _number(text: str, whole: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"policy {whole!r}: {text!r} is not a number ≥ 0")
    return value


def _count(text: str, whole: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"policy {whole!r}: {text!r} is not a whole number ≥ 1")
    return int(text)
