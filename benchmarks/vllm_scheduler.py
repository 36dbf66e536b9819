"""What EdgemonScheduler adds to a vLLM scheduling step, against vLLM's own Scheduler in the
same run.

Run: `make .venv-vllm/.installed && HF_HUB_OFFLINE=1 .venv-vllm/bin/python
benchmarks/vllm_scheduler.py`. vLLM's real schedulers over a hand-made KV cache, no model:
each step is `schedule()` plus `update_from_output()` with one sampled token per running
request (the test tier's harness, `tests/vllm/harness.py`). Prints microseconds per step and
ratios for `running` decodes and `waiting` requests that cannot be admitted either way
(`max_num_seqs` is reached, so both schedulers do the same work):
  1. gate released (the common case): EdgemonScheduler / Scheduler;
  2. gate holding (the waiting queue swapped out and back every step): EdgemonScheduler /
     Scheduler.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "vllm"))

from vllm.v1.core.sched.scheduler import Scheduler

from edgemon.integrations.vllm import EdgemonScheduler

from conftest import TINY_CONFIG
from harness import FlagGate, build_scheduler, make_request, run_step


def _loaded(cls: type[Any], model: Path, running: int, waiting: int, **kwargs: Any) -> Any:
    """A scheduler with `running` decoding requests and `waiting` ones it cannot admit."""
    scheduler = build_scheduler(
        cls, model, max_num_seqs=running, max_num_batched_tokens=4096, num_blocks=20_000, **kwargs
    )
    for i in range(running):
        scheduler.add_request(make_request(f"run-{i}", 16, max_tokens=1_000_000))
    run_step(scheduler)
    for i in range(waiting):
        scheduler.add_request(make_request(f"wait-{i}", 16))
    return scheduler


def _us_per_step(scheduler: Any, steps: int) -> float:
    gc.collect()
    start = time.perf_counter()
    for _ in range(steps):
        run_step(scheduler)
    return (time.perf_counter() - start) / steps * 1e6


def main() -> None:
    """Interleaved rounds; medians and the ratio of medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--running", type=int, default=32)
    parser.add_argument("--waiting", type=int, default=16)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        model = Path(directory)
        (model / "config.json").write_text(json.dumps(TINY_CONFIG))
        released, holding = FlagGate(), FlagGate()
        schedulers = {
            "vLLM Scheduler": _loaded(Scheduler, model, args.running, args.waiting),
            "released": _loaded(
                EdgemonScheduler, model, args.running, args.waiting, edgemon_gate=released
            ),
            "holding": _loaded(
                EdgemonScheduler, model, args.running, args.waiting, edgemon_gate=holding
            ),
        }
        holding.throttle = True  # after the running requests were admitted
        times: dict[str, list[float]] = {name: [] for name in schedulers}
        names = list(schedulers)
        for round_ in range(args.rounds):
            for name in names[round_ % 3 :] + names[: round_ % 3]:  # each goes first in turn
                times[name].append(_us_per_step(schedulers[name], args.steps))
        for name, scheduler in schedulers.items():  # the model length (1024) was not reached
            assert len(scheduler.running) == args.running, f"{name}: requests finished"
    medians = {name: statistics.median(values) for name, values in times.items()}
    base = medians["vLLM Scheduler"]
    print(f"{args.running} running decodes, {args.waiting} waiting, {args.steps} steps x "
          f"{args.rounds} rounds (median µs per step)")  # fmt: skip
    for name, value in medians.items():
        print(f"  {name:15} {value:8.1f} µs   ×{value / base:.3f}")


if __name__ == "__main__":
    main()
