"""Real-time admission on vLLM-Omni's real talker scheduler (vLLM-Omni 0.30 on vLLM 0.30),
and the `qwen3_tts_edgemon_realtime` pipeline that selects it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("vllm_omni.core.sched.omni_ar_scheduler", exc_type=ImportError)

from realtime_cases import *  # noqa: F403 - the shared real-time admission tests run here
from vllm_omni.model_executor.models.qwen3_tts.pipeline import QWEN3_TTS_PIPELINE

from edgemon.integrations.vllm_omni_realtime import (
    EdgemonOmniRealtimeAsyncScheduler,
    EdgemonOmniRealtimeScheduler,
    realtime_pipeline,
    register_realtime_pipelines,
)

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture(
    params=[EdgemonOmniRealtimeScheduler, EdgemonOmniRealtimeAsyncScheduler],
    ids=lambda cls: cls.__name__,
)
def flavour(request: pytest.FixtureRequest) -> type[Any]:
    """Both flavours."""
    cls: type[Any] = request.param
    return cls


def test_the_realtime_pipeline_puts_the_scheduler_on_the_talker_only(tiny_model: Path) -> None:
    """`qwen3_tts_edgemon_realtime`: stage 0 runs edgemon's real-time talker scheduler, the
    other stages are Qwen3-TTS's own; registering twice changes nothing and replaces nothing."""
    del tiny_model
    pipeline = realtime_pipeline(QWEN3_TTS_PIPELINE)
    assert pipeline.model_type == "qwen3_tts_edgemon_realtime"
    talker, *others = pipeline.stages
    assert talker.scheduler_cls == (
        "edgemon.integrations.vllm_omni_realtime.EdgemonOmniRealtimeAsyncScheduler"
    )
    assert [s.scheduler_cls for s in others] == [
        s.scheduler_cls for s in QWEN3_TTS_PIPELINE.stages[1:]
    ]
    registry: dict[str, Any] = {"qwen3_tts": QWEN3_TTS_PIPELINE}
    register_realtime_pipelines(registry=registry)
    first = registry["qwen3_tts_edgemon_realtime"]
    register_realtime_pipelines(registry=registry)
    assert registry["qwen3_tts_edgemon_realtime"] is first
    assert registry["qwen3_tts"] is QWEN3_TTS_PIPELINE
