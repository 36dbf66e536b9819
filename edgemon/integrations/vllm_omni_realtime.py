"""vLLM-Omni talker schedulers with edgemon's gate and real-time admission (the `edgemon`
policy; see `edgemon.integrations.vllm_realtime` for what real-time admission does).

`EdgemonOmniRealtimeScheduler` is `edgemon.integrations.vllm_omni.EdgemonOmniARScheduler`
(the gate through vLLM-Omni's ``_should_defer_waiting_admission()`` hook) with real-time
admission around its step: a step sees only as many waiting requests as real time allows, so
vLLM-Omni's own admission, deferrals and ``kv_holding_waiting`` work as they do. Use it on the
talker (stage 0) only, like the gate: select the pipeline ``qwen3_tts_edgemon_realtime``
(registered by `register_realtime_pipelines`, which edgemon's vLLM plugin calls) in the deploy
YAML. ``EDGEMON_REALTIME_FRAME_MS`` (default 80; 0: off) and the ``EDGEMON_GATE_*`` variables
configure it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm_omni.core.sched.omni_ar_scheduler import OmniARAsyncScheduler

from edgemon.integrations.vllm_omni import (
    TALKER_PIPELINES,
    EdgemonOmniARScheduler,
    register_talker_pipelines,
    talker_pipeline,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, MutableMapping

    from vllm_omni.config.stage_config import PipelineConfig

__all__ = [
    "REALTIME_SUFFIX",
    "EdgemonOmniRealtimeAsyncScheduler",
    "EdgemonOmniRealtimeScheduler",
    "realtime_pipeline",
    "register_realtime_pipelines",
]

REALTIME_SUFFIX = "_edgemon_realtime"


class EdgemonOmniRealtimeScheduler(EdgemonOmniARScheduler):
    """`EdgemonOmniARScheduler` with real-time admission (as
    `edgemon.integrations.vllm_realtime.EdgemonRealtimeScheduler`)."""

    _edgemon_realtime_by_default = True


class EdgemonOmniRealtimeAsyncScheduler(EdgemonOmniRealtimeScheduler, OmniARAsyncScheduler):  # type: ignore[misc]
    """The ``OmniARAsyncScheduler`` flavour (Qwen3-TTS's talker default)."""


def realtime_pipeline(pipeline: PipelineConfig, *, async_scheduling: bool = True) -> PipelineConfig:
    """A copy of `pipeline` whose stage 0 runs the real-time talker scheduler."""
    scheduler = (
        EdgemonOmniRealtimeAsyncScheduler if async_scheduling else EdgemonOmniRealtimeScheduler
    )
    return talker_pipeline(pipeline, scheduler, REALTIME_SUFFIX)


def register_realtime_pipelines(
    model_types: Iterable[str] = TALKER_PIPELINES,
    *,
    registry: MutableMapping[str, Any] | None = None,
) -> None:
    """Add ``<model_type>_edgemon_realtime`` for each of `model_types` (idempotent; never
    replaces a pipeline); ``registry`` defaults to vLLM-Omni's ``OMNI_PIPELINES``."""
    register_talker_pipelines(model_types, REALTIME_SUFFIX, realtime_pipeline, registry=registry)
