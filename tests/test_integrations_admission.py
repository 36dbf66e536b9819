"""The engine-independent part of the schedulers: gate ownership, counters, idle back-off, the
guards (errors, drift, a release that admits) and the vLLM plugin's lightness."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import deque
from typing import TYPE_CHECKING

import pytest

from edgemon.integrations._admission import IDLE_SLEEP_S, AdmissionControl, AdmissionStats
from edgemon.integrations._queue import put_back
from edgemon.integrations._versions import require_hook

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path


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
    """`import edgemon.integrations`, and the driver the schedulers share with its parts, load
    neither vLLM nor vLLM-Omni nor torch, and the vLLM plugin is a no-op where vLLM-Omni is
    not installed (as here)."""
    code = (
        "import sys, edgemon.integrations, edgemon.integrations._scheduler\n"
        "from edgemon.integrations.plugin import register_omni_pipelines\n"
        "register_omni_pipelines()\n"
        "heavy = {'vllm', 'vllm_omni', 'torch'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


class _BrokenGate:
    """A gate whose every call fails: the fault the guards exist for."""

    def should_throttle_prefills(self) -> bool:
        raise RuntimeError("gate broken")

    def admitted(self) -> None:
        raise RuntimeError("gate broken")


class _ReleasingGate(_Gate):
    """A hand-set gate that records `admitted()` reports."""

    def __init__(self) -> None:
        super().__init__(throttle=False)
        self.releasing = True
        self.admissions = 0

    def admitted(self) -> None:
        self.admissions += 1
        self.releasing = False


def test_an_error_in_the_gate_answers_do_not_hold(caplog: pytest.LogCaptureFixture) -> None:
    """A gate that raises never reaches the scheduler: `should_hold` is False, each error is
    counted, the first alone is logged (with its traceback); `stepped` is guarded too."""
    control = AdmissionControl(_BrokenGate())
    with caplog.at_level("ERROR", logger="edgemon.integrations"):
        assert [control.should_hold() for _ in range(3)] == [False] * 3
        control.stepped(admitted=True)
    assert control.stats.errors == 4
    assert len(caplog.records) == 1
    assert caplog.records[0].exc_info is not None
    assert "should_throttle_prefills" in caplog.records[0].getMessage()


def test_the_drift_guard_disables_the_gate_once(caplog: pytest.LogCaptureFixture) -> None:
    """A held step that admitted one of the requests it held: the gate is disabled for good
    (no more holds), with one error naming the request; a clean held step changes nothing."""
    gate = _Gate(throttle=True)
    control = AdmissionControl(gate)
    control.check_drift({"a", "b"}, {"c"})
    assert control.should_hold()
    with caplog.at_level("ERROR", logger="edgemon.integrations"):
        control.check_drift({"a", "b"}, {"b"})
        control.check_drift({"a"}, {"a"})
    assert not control.should_hold()
    assert control.stats.disabled
    assert len(caplog.records) == 1
    assert "['b']" in caplog.records[0].getMessage()


def test_a_step_that_admits_ends_a_release() -> None:
    """`stepped(admitted=True)` tells a gate with `admitted()` (ending its release);
    `stepped(admitted=False)` does not."""
    gate = _ReleasingGate()
    control = AdmissionControl(gate)
    assert control.releasing
    control.stepped(admitted=False)
    assert gate.admissions == 0
    control.stepped(admitted=True)
    assert gate.admissions == 1
    assert not control.releasing


class _Queue(deque[str]):
    """vLLM's FCFS queue's interface (a deque); `refuse` makes `prepend_requests` raise."""

    refuse = False

    def add_request(self, request: str) -> None:
        self.append(request)

    def prepend_requests(self, requests: Iterable[str]) -> None:
        if self.refuse:
            raise RuntimeError("injected")
        self.extendleft(requests)


def test_put_back_restores_the_order_in_front() -> None:
    """What a step took out goes back in front, in its own order; nothing is counted."""
    control = AdmissionControl(None)
    queue = _Queue(["c", "d"])
    put_back(queue, ["a", "b"], control, "test")
    assert list(queue) == ["a", "b", "c", "d"]
    assert control.stats.errors == 0


def test_a_queue_that_refuses_gets_them_at_the_back(caplog: pytest.LogCaptureFixture) -> None:
    """`prepend_requests` raises: the requests go to the back rather than being lost, once
    each, and the error is counted and logged."""
    control = AdmissionControl(None)
    queue = _Queue(["c", "d"])
    queue.refuse = True
    with caplog.at_level("ERROR", logger="edgemon.integrations"):
        put_back(queue, ["a", "c"], control, "putting back")
    assert list(queue) == ["c", "d", "a"]
    assert control.stats.errors == 1
    assert [r.getMessage().split(",")[0] for r in caplog.records] == [
        "edgemon: an error in putting back"
    ]


def test_a_missing_hook_fails_at_import() -> None:
    """`require_hook` raises ImportError naming the class and the hook it lacks."""

    class Parent:
        def _should_defer_waiting_admission(self) -> bool:
            return False

    require_hook(Parent, "_should_defer_waiting_admission")
    with pytest.raises(ImportError, match=r"Bare has no _should_defer_waiting_admission\(\)"):
        require_hook(type("Bare", (), {}), "_should_defer_waiting_admission")


def _plugin_run(tmp_path: Path, environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run edgemon's vLLM plugin in a fresh interpreter that finds a stand-in `vllm_omni`
    package (it records its import and has no pipeline registry), and report whether
    `vllm_omni` was imported."""
    package = tmp_path / "vllm_omni"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    code = (
        "import sys\n"
        "from edgemon.integrations.plugin import register_omni_pipelines\n"
        "register_omni_pipelines()\n"
        "print('vllm_omni' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "EDGEMON_OMNI_PIPELINES"}
    path = os.pathsep.join(filter(None, (str(tmp_path), env.get("PYTHONPATH"))))
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env | {"PYTHONPATH": path} | environ,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )


@pytest.mark.integration  # starts a process
def test_the_plugin_imports_no_vllm_omni_in_a_plain_process(tmp_path: Path) -> None:
    """In a process where vLLM-Omni is installed but not in use (a plain `vllm serve`),
    edgemon's general plugin imports nothing of it; with EDGEMON_OMNI_PIPELINES=1 it does try
    to register (here it cannot: the stand-in has no registry, so it logs and goes on)."""
    plain = _plugin_run(tmp_path, {})
    assert plain.stdout.strip() == "False"
    assert plain.stderr == ""
    asked = _plugin_run(tmp_path, {"EDGEMON_OMNI_PIPELINES": "1"})
    assert asked.stdout.strip() == "True"
    assert "qwen3_tts_edgemon is not registered" in asked.stderr
