"""EdgemonOmniARScheduler on vLLM-Omni's real OmniARScheduler (vLLM-Omni 0.30 on vLLM 0.30)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("vllm_omni.core.sched.omni_ar_scheduler", exc_type=ImportError)

import vllm
import vllm_omni
from vllm_omni.config.stage_config import load_deploy_config, merge_pipeline_deploy
from vllm_omni.core.sched.omni_ar_scheduler import OmniARScheduler
from vllm_omni.model_executor.models.qwen3_tts.pipeline import QWEN3_TTS_PIPELINE

from edgemon.client import ThrottleGate
from edgemon.integrations._versions import untested
from edgemon.integrations.vllm_omni import (
    EdgemonOmniARAsyncScheduler,
    EdgemonOmniARScheduler,
    edgemon_pipeline,
    register_pipelines,
)

from admission_cases import *  # noqa: F403 - the shared admission tests run here too
from admission_cases import decoding
from harness import FlagGate, build_scheduler, make_request, run_step, waiting_ids
from mqtt_probe import probe

if TYPE_CHECKING:
    from pathlib import Path

    from brokers import Broker

_EDGEMON_TALKER = "edgemon.integrations.vllm_omni.EdgemonOmniARAsyncScheduler"
T = 30.0  # generous: a loaded machine


@pytest.fixture(
    params=[EdgemonOmniARScheduler, EdgemonOmniARAsyncScheduler], ids=lambda cls: cls.__name__
)
def flavour(request: pytest.FixtureRequest) -> type[Any]:
    """The scheduler class under test: both flavours."""
    cls: type[Any] = request.param
    return cls


class _OmniDefers(OmniARScheduler):  # type: ignore[misc]  # vLLM-Omni is untyped for mypy here
    """A vLLM-Omni scheduler whose own hook defers admission while `defer` is set."""

    defer = False

    def _should_defer_waiting_admission(self) -> bool:
        return self.defer


class _EdgemonOverDeferring(EdgemonOmniARScheduler, _OmniDefers):
    """edgemon's hook stacked on a parent that has its own deferral (as on OmniCFGARScheduler)."""


def test_parent_deferral_still_holds(tiny_model: Path) -> None:
    """The hook is the parent's answer OR the gate's: the parent's deferral holds with the gate
    open, and is not counted as edgemon's hold; the gate holds with the parent's open."""
    gate = FlagGate()
    scheduler = build_scheduler(_EdgemonOverDeferring, tiny_model, edgemon_gate=gate)
    decoding(scheduler, "run-a")
    scheduler.add_request(make_request("new", 10))
    scheduler.defer = True
    assert run_step(scheduler).admitted == []
    scheduler.defer = False
    gate.throttle = True
    assert run_step(scheduler).admitted == []
    assert scheduler.edgemon_stats.held_steps == 1
    gate.throttle = False
    assert run_step(scheduler).admitted == ["new"]


@pytest.mark.xfail(
    strict=True,
    reason="vLLM-Omni 0.30 restores re-queued requests reversed (prepend_requests is extendleft)",
)
def test_preempted_requests_keep_vllms_order(tiny_model: Path) -> None:
    """Requests a deferred step preempts should come back in vLLM's order (p-3 before p-4, as
    vLLM's own scheduler leaves them); vLLM-Omni's restore reverses them. edgemon only answers
    the hook here, so it inherits this; `EdgemonScheduler` on plain vLLM keeps the order."""
    gate = FlagGate()
    scheduler = build_scheduler(
        EdgemonOmniARScheduler,
        tiny_model,
        edgemon_gate=gate,
        num_blocks=7,
        max_num_batched_tokens=512,
    )
    for request_id, prompt in (("p-1", 32), ("p-2", 32), ("p-3", 4), ("p-4", 4)):
        scheduler.add_request(make_request(request_id, prompt, max_tokens=200))
    run_step(scheduler)
    scheduler.add_request(make_request("queued", 8))
    gate.throttle = True
    assert run_step(scheduler).preempted == ["p-3", "p-4"]
    assert waiting_ids(scheduler) == ["p-3", "p-4", "queued"]


def test_pipeline_puts_edgemon_on_the_talker_only(tmp_path: Path) -> None:
    """`qwen3_tts_edgemon` resolves, through vLLM-Omni's own deploy merge, to edgemon's talker
    scheduler on stage 0 with async scheduling as vLLM-Omni's own, and leaves code2wav
    untouched."""
    shipped = vllm_omni.__path__[0] + "/deploy/qwen3_tts.yaml"
    overlay = tmp_path / "deploy.yaml"
    overlay.write_text(f"base_config: {shipped}\npipeline: qwen3_tts_edgemon\n")
    deploy = load_deploy_config(overlay)
    assert deploy.pipeline == "qwen3_tts_edgemon"

    registry: dict[str, Any] = {"qwen3_tts": QWEN3_TTS_PIPELINE}
    register_pipelines(registry=registry)
    register_pipelines(registry=registry)
    assert set(registry) == {"qwen3_tts", "qwen3_tts_edgemon"}
    assert registry["qwen3_tts_edgemon"] == edgemon_pipeline(QWEN3_TTS_PIPELINE)

    plain = merge_pipeline_deploy(QWEN3_TTS_PIPELINE, load_deploy_config(overlay))
    gated = merge_pipeline_deploy(registry["qwen3_tts_edgemon"], deploy)
    assert [stage.scheduler_cls for stage in gated] == [
        _EDGEMON_TALKER,
        plain[1].scheduler_cls,
    ]
    assert plain[0].scheduler_cls.endswith(".OmniARAsyncScheduler")
    assert gated[0].yaml_engine_args["async_scheduling"] is True
    assert gated[1] == plain[1]


def test_the_engines_here_are_tested_versions() -> None:
    """vLLM-Omni and the vLLM under it are in claimed series: if CI installs another, this
    fails."""
    assert untested("vLLM-Omni", vllm_omni.__version__) is None
    assert untested("vLLM under vLLM-Omni", vllm.__version__) is None


def test_a_talker_on_tested_versions_warns_of_nothing(
    tiny_model: Path, flavour: type[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Building edgemon's talker scheduler here logs no warning of edgemon's."""
    with caplog.at_level(logging.WARNING, logger="edgemon.integrations"):
        build_scheduler(flavour, tiny_model)
    assert [r.getMessage() for r in caplog.records if r.name == "edgemon.integrations"] == []


def test_plugin_entry_point_is_declared() -> None:
    """edgemon's install declares its vLLM general plugin, which vLLM runs at start-up in every
    process; the plugin's module imports nothing heavy."""
    plugins = {ep.name: ep for ep in entry_points(group="vllm.general_plugins")}
    assert plugins["edgemon_omni_pipelines"].value == (
        "edgemon.integrations.plugin:register_omni_pipelines"
    )
    code = (
        "import sys\n"
        "from edgemon.integrations.plugin import register_omni_pipelines\n"
        "assert not {'vllm', 'vllm_omni', 'torch'} & set(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def _after_vllm_plugins(environ: dict[str, str]) -> dict[str, bool]:
    """In a fresh interpreter of this environment (vLLM-Omni installed), run vLLM's own
    general-plugin loading as a plain `vllm serve` does, and say whether edgemon's vLLM-Omni
    module and vLLM-Omni's pipeline registry (every model it ships) were imported."""
    code = (
        "import json, sys\n"
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins()\n"
        "print(json.dumps({'edgemon': 'edgemon.integrations.vllm_omni' in sys.modules,\n"
        "                  'registry': 'vllm_omni.config.pipeline_registry' in sys.modules}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "EDGEMON_OMNI_PIPELINES"} | environ
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, bool] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_plain_vllm_process_imports_no_vllm_omni() -> None:
    """vLLM's plugin loading in a plain vLLM process (vLLM-Omni installed, not in use) runs
    edgemon's plugin, which leaves vLLM-Omni's pipeline registry and models alone (vLLM-Omni's
    own plugin imports `vllm_omni` itself); with EDGEMON_OMNI_PIPELINES=1 it goes to the
    registry. (Whether the registry then imports depends on the models' own dependencies:
    `.venv-omni` lacks torchvision, and the plugin logs that and goes on, as it must.)"""
    assert _after_vllm_plugins({}) == {"edgemon": False, "registry": False}
    asked = _after_vllm_plugins({"EDGEMON_OMNI_PIPELINES": "1"})
    assert asked["edgemon"]


@pytest.mark.integration
def test_real_gate_holds_the_talker_and_fails_open(
    tiny_model: Path, private_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With its gate from EDGEMON_GATE_* on a real Mosquitto, the talker scheduler holds new
    requests while edgemon throttles, lets them in when edgemon goes offline, and closes the
    gate at shutdown."""
    host, port = private_broker.host, private_broker.port
    monkeypatch.setenv("EDGEMON_GATE_DEVICE", "omni-box")
    monkeypatch.setenv("EDGEMON_GATE_BROKER", f"mqtt://{host}:{port}")
    monkeypatch.setenv("EDGEMON_GATE_MAX_HOLD_MS", "600000")
    status = "edgemon/v1/_edgemon/e1/status"
    with probe(host, port) as edgemon:
        edgemon.publish(status, {"state": "online", "version": "test", "t_ms": 1.0e12})
        edgemon.publish(
            "edgemon/v1/omni-box/throttle",
            {"device": "omni-box", "throttle": True, "t_ms": 1.0e12, "seq": 1, "streams": []},
        )
        scheduler = build_scheduler(EdgemonOmniARAsyncScheduler, tiny_model)
        gate = scheduler.edgemon_gate
        assert isinstance(gate, ThrottleGate)
        assert gate.wait_until(lambda s: s.active, T)
        scheduler.add_request(make_request("held", 10))
        for _ in range(3):
            assert run_step(scheduler).admitted == []
        edgemon.publish(status, {"state": "offline", "version": "test", "t_ms": 1.0e12})
        assert gate.wait_until(lambda s: not s.edgemon_online, T)
        assert run_step(scheduler).admitted == ["held"]
        scheduler.shutdown()
    assert not gate.state.connected
    assert scheduler.edgemon_stats.held_steps == 3
