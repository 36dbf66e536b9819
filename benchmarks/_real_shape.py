"""The real engine's step shape, and the capacity that the runs' loads are shares of.

`measure` measures the shape on a server with vLLM's own scheduler (`_real_steps`: token gaps
at 1-16 streams, the stall a prefill causes, and optionally the slowdown a co-tenant taking
given shares of the engine's core causes) and fits it (`StepModel`). `calibrate` measures
one co-tenant's slowdown.

`Scale` is what a run's load is a share of: the capacity (`Profile.capacity_rps`: the arrival
rate at which steps average one frame) of the run's profile and workload on the step model
fitted on this box, measured just before the runs or read from a shape written before
(`--shape-file`): a shared machine's step can drift by 2x from hour to hour, so the fixed
profile's capacity would make "load 0.85" a light load one hour and an overload the next. Every row
records the scale (`Scale.record`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from _real_model import SIZES
from _real_server import CORE, CoTenant
from _real_steps import SHORT_PROMPT, decode_shape, fit, prefill_stall, shape_json, slowdown
from closed_loop import measured_steps

from edgemon.simulate.scenarios import Windows

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from _real_server import VllmServer

    from edgemon.simulate.profiles import Profile

SHAPE_COUNTS = [1, 2, 4, 8, 10, 12, 16]
STALL_STREAMS = 8
STALL_PROMPT = 300
CALIBRATION_STREAMS = 8
SHAPE_SHARES = (0.25, 0.5, 0.75)
"""The co-tenant's shares `--shape` measures the slowdown of (the profile's `contention`)."""


def calibrate(share: float, server: VllmServer, vocab: int, model_size: str) -> dict[str, float]:
    """The decode step of 8 streams without and with a co-tenant taking `share` of the
    engine's core, on the model of `model_size`."""

    def contend() -> Any:
        always = Windows(1.0, 1.0)  # on all the time while measuring
        tenant = CoTenant(CORE, share, always, time.time()).start()
        return tenant.close

    alone, shared, ratio = slowdown(
        server.url, CALIBRATION_STREAMS, contend, vocab=vocab, output=long_output(model_size)
    )
    server.wait_idle()
    return {"step_ms": alone, "contended_step_ms": shared, "ratio": round(ratio, 3)}


def long_output(model_size: str) -> int:
    """A measurement stream's `max_tokens`: all the model's length leaves after its prompt."""
    return SIZES[model_size].max_model_len - SHORT_PROMPT


def measure(
    server: VllmServer,
    *,
    vocab: int,
    model_size: str,
    shares: tuple[float, ...] = SHAPE_SHARES,
    say: Callable[[str], None] = lambda _text: None,
) -> dict[str, Any]:
    """The step shape on `server` (vLLM's scheduler, nothing else running) and its fit: the
    decode steps, a prefill's stall and the co-tenant's slowdown at each of `shares` (none:
    not measured); `say` hears the measurements as they come."""
    output = long_output(model_size)
    shapes = decode_shape(server.url, SHAPE_COUNTS, vocab=vocab, output=output)
    say(f"# decode steps (ms: median, p90, gaps): {shape_json(shapes)}")
    stall = prefill_stall(server.url, STALL_STREAMS, STALL_PROMPT, vocab=vocab, output=output)
    contention = {}
    for share in shares:
        measured = calibrate(share, server, vocab, model_size)
        say(f"# a co-tenant taking {share:g} of the core: {measured}")
        contention[share] = measured["ratio"]
    model = fit(shapes, stall, stall_streams=STALL_STREAMS, prompt_tokens=STALL_PROMPT)
    return {
        "model_size": model_size,
        "measured_at": f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}",
        "decode_ms": {s.streams: [s.median_ms, s.p90_ms] for s in shapes},
        "stall_ms": {"streams": STALL_STREAMS, "prompt": STALL_PROMPT, "ms": stall},
        "contention": contention,
        "fit": {
            "base_ms": model.base_ms,
            "per_decode_seq_ms": model.per_decode_seq_ms,
            "per_prefill_token_ms": model.per_prefill_token_ms,
        },
    }


@dataclass(frozen=True, slots=True)
class Scale:
    """The capacity a run's load is a share of (see the module doc)."""

    profile: Profile
    """The run's profile on the measured step model."""
    shape: dict[str, Any]
    source: str
    """Where the shape came from: `measured` (at the start) or the file it was read from."""

    @classmethod
    def of(cls, profile: Profile, path: Path, source: str) -> Scale:
        """`profile` scaled by the shape in `path` (a `--shape --json` line, the last one
        there); ValueError naming the file if it holds none."""
        try:
            scaled = measured_steps(profile, path)
            lines = path.read_text(encoding="utf-8").splitlines()
            shape = json.loads([line for line in lines if line.startswith("{")][-1])
        except (OSError, ValueError, IndexError) as exc:
            raise ValueError(
                f"--shape-file {path}: not a shape from real_engine.py --shape "
                f"({exc.__cause__ or exc})"
            ) from None
        return cls(scaled, shape, source)

    @property
    def capacity_rps(self) -> float:
        """The measured capacity for the run's workload, requests a second."""
        return self.profile.capacity_rps()

    def record(self) -> dict[str, Any]:
        """What every row records of the scale: the fit, the capacity, when and where from."""
        step = self.profile.step
        return {
            "fit": {
                "base_ms": step.base_ms,
                "per_decode_seq_ms": step.per_decode_seq_ms,
                "per_prefill_token_ms": step.per_prefill_token_ms,
            },
            "capacity_rps": round(self.capacity_rps, 4),
            "measured_at": self.shape.get("measured_at"),
            "model_size": self.shape.get("model_size"),
            "source": self.source,
        }
