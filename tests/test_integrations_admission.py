"""The engine-independent part of the schedulers: gate ownership, counters, idle back-off."""

from __future__ import annotations

import subprocess
import sys

import pytest

from edgemon.integrations._admission import IDLE_SLEEP_S, AdmissionControl, AdmissionStats


class _Gate:
    """A hand-set gate that records whether it was closed."""

    def __init__(self, *, throttle: bool) -> None:
        self.throttle = throttle
        self.closed = False

    def should_throttle_prefills(self) -> bool:
        return self.throttle

    def close(self, timeout: float = 5.0) -> None:
        self.closed = True


def test_no_gate_never_holds() -> None:
    """Without a gate nothing is ever held and there is nothing to close."""
    control = AdmissionControl(None)
    assert control.gate is None
    assert not control.should_hold()
    control.close()


def test_hold_follows_the_gate() -> None:
    """`should_hold` is the gate's answer, asked afresh every time."""
    gate = _Gate(throttle=True)
    control = AdmissionControl(gate)
    assert control.should_hold()
    gate.throttle = False
    assert not control.should_hold()


def test_only_idle_held_steps_back_off() -> None:
    """A held step backs off (once, for IDLE_SLEEP_S) only when it scheduled nothing and
    nothing runs; every held step is counted."""
    naps: list[float] = []
    control = AdmissionControl(_Gate(throttle=True), sleep=naps.append)
    control.held(scheduled_tokens=0, running=0)
    control.held(scheduled_tokens=3, running=3)
    control.held(scheduled_tokens=0, running=1)
    assert naps == [IDLE_SLEEP_S]
    assert control.stats == AdmissionStats(held_steps=3, idle_sleeps=1)


def test_a_gate_handed_in_stays_the_callers() -> None:
    """`close()` leaves a gate it was given open: the caller owns it."""
    gate = _Gate(throttle=False)
    AdmissionControl(gate).close()
    assert not gate.closed


@pytest.mark.integration  # starts a process
def test_importing_the_package_imports_no_engine() -> None:
    """`import edgemon.integrations` loads neither vLLM nor vLLM-Omni nor torch, and the vLLM
    plugin is a no-op where vLLM-Omni is not installed (as here)."""
    code = (
        "import sys, edgemon.integrations, edgemon.integrations._admission\n"
        "from edgemon.integrations.plugin import register_omni_pipelines\n"
        "register_omni_pipelines()\n"
        "heavy = {'vllm', 'vllm_omni', 'torch'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
