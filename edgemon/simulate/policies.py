"""What an engine does with new requests: the policies the closed-loop benchmark compares.

A policy is written as parts joined by `+`:

- `open`: vLLM's own scheduling with the profile's `max_num_seqs`, no gate;
- `cap:N`: a static `max_num_seqs = N`, no gate (what an operator can do without edgemon);
- `gate:MARGIN_MS:HOLD_MS`: edgemon's throttle (the seed's rule, players asking for
  `MARGIN_MS`) obeyed through the gate with `max_hold_ms = HOLD_MS`; after a hold of that
  length one step is let through;
- `lasting:MARGIN_MS:HOLD_MS`: the same, but the release lasts until a step admits a waiting
  request or the queue is empty;
- `realtime` or `realtime:F`: real-time admission (`edgemon.integrations.realtime`): never
  more requests running than the measured decode step fits in F frames (default 1);
- `budget`, `budget:FRAMES`, `budget:FRAMES:ALLOW_MS` or `budget:FRAMES:ALLOW_MS:MODE`:
  budget-aware admission (`edgemon.simulate.budget`): a waiting request is admitted only if
  its predicted cost (its prefill plus FRAMES more decodes, default 12) fits the spendable
  headroom edgemon's last throttle object carried, plus ALLOW_MS (default 0); MODE `refill`
  (default), `stale` or `fresh` (an upper bound, see there). Measured, not shipped;
- `deadline`, `deadline:ORDER`, `deadline:ORDER:SHED` or `deadline:ORDER:SHED:GUARD_MS`: the
  deadline policy (`edgemon.integrations.deadlines`): every waiting request's hold ends at its
  start deadline; ORDER `fcfs` (default) or `edf` (earliest deadline first); SHED `shed`
  (default: refuse what cannot start within the start SLO, at arrival or while queued) or
  `queue`; GUARD_MS taken off every start budget (default 0); BATCH `amortized` (default:
  the batch whose steps average a frame with prefills spread over requests' frames) or
  `decode` (the real-time admission's decode-only batch). With `realtime` it uses the
  measured real-time batch; with a gate, the gate's hold is bounded by each deadline;
- `edgemon`: the policy edgemon ships, `EDGEMON` below (also as a part: `edgemon+budget`).

So `cap:11`, `gate:80:2000`, `realtime+lasting:80:2000`. Pure; `policy(text, profile)`
raises ValueError naming what is wrong (`profile` gives `edgemon` its margin).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgemon.integrations.deadlines import GUARD_MS, ORDERS, DeadlineSettings
from edgemon.simulate.budget import AHEAD_FRAMES, BUDGET_MODES, BudgetSetting

if TYPE_CHECKING:
    from edgemon.simulate.profiles import Profile

BUDGET_ARGS = ("FRAMES", "ALLOW_MS", "MODE")
"""What `budget:` takes, in order, each optional."""
DEADLINE_ARGS = ("ORDER", "SHED", "GUARD_MS", "BATCH")
"""What `deadline:` takes, in order, each optional."""
SHED_WORDS = ("shed", "queue")
BATCH_WORDS = ("amortized", "decode")

EDGEMON = "realtime+deadline:fcfs:shed:{guard}"
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
    """The deadline policy (`edgemon.integrations.deadlines`)."""

    @property
    def kind(self) -> str:
        """`open`, `cap`, `gate` or `mine` (the families the report compares)."""
        if self.realtime or self.lasting or self.budget is not None or self.deadlines is not None:
            return "mine"
        if self.gated:
            return "gate"
        return "cap" if self.max_num_seqs is not None else "open"


def policy(text: str, profile: Profile) -> Policy:
    """Parse `text` (see the module doc)."""
    label = text.strip()
    shipped = EDGEMON.format(margin=f"{profile.margin_ms:g}", guard=f"{SHIPPED_GUARD_MS:g}")
    expanded = "+".join(shipped if part.strip() == "edgemon" else part for part in label.split("+"))
    cap: int | None = None
    gate: tuple[float | None, float, bool] | None = None  # margin, hold, lasting
    realtime = False
    frames = 1.0
    budget: BudgetSetting | None = None
    deadlines: DeadlineSettings | None = None
    for part in expanded.split("+"):
        name, _, rest = part.strip().partition(":")
        args = rest.split(":") if rest else []
        if name == "open" and not args:
            continue
        if name == "cap" and len(args) == 1:
            cap = _count(args[0], text)
        elif name in {"gate", "lasting"} and len(args) == 2:
            margin, hold = (_number(a, text) for a in args)
            if hold <= 0:
                raise ValueError(f"policy {text!r}: the hold must be > 0 ms")
            gate = (margin, hold, name == "lasting")
        elif name == "realtime" and len(args) <= 1:
            realtime = True
            frames = _number(args[0], text) if args else 1.0
            if frames <= 0:
                raise ValueError(f"policy {text!r}: the frames must be > 0")
        elif name == "budget" and len(args) <= len(BUDGET_ARGS):
            budget = _budget(args, text)
        elif name == "deadline" and len(args) <= len(DEADLINE_ARGS):
            deadlines = _deadlines(args, text)
        else:
            raise ValueError(
                f"unknown policy {text!r}: open, cap:N, gate:MARGIN_MS:HOLD_MS, "
                "lasting:MARGIN_MS:HOLD_MS, realtime[:F], budget[:FRAMES[:ALLOW_MS[:MODE]]], "
                "deadline[:ORDER[:SHED[:GUARD_MS]]], edgemon, or parts joined by '+'"
            )
    gate_margin, gate_hold, gate_lasting = (None, 2000.0, False) if gate is None else gate
    return Policy(
        label=label,
        max_num_seqs=cap,
        gated=gate is not None,
        margin_ms=gate_margin,
        max_hold_ms=gate_hold,
        lasting=gate_lasting,
        realtime=realtime,
        realtime_frames=frames,
        budget=budget,
        deadlines=deadlines,
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
        order=order, shed=word == "shed", guard_ms=guard, amortize=batch == "amortized"
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
