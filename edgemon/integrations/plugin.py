"""edgemon's vLLM general plugin: registers the vLLM-Omni pipelines with edgemon's talker.

vLLM runs every ``vllm.general_plugins`` entry point in each process it starts, before it
parses its command line (``vllm serve``, ``vllm-omni serve``) and again in engine processes.
This module imports nothing heavy, so the plugin costs a plain vLLM nothing: without vLLM-Omni
it does nothing. A plugin must never stop vLLM: if vLLM-Omni's pipeline registry cannot be
imported here, it logs why and registers nothing.
"""

from __future__ import annotations

import logging
from importlib.util import find_spec

_log = logging.getLogger(__name__)


def register_omni_pipelines() -> None:
    """Register ``qwen3_tts_edgemon`` and ``qwen3_tts_edgemon_realtime`` when vLLM-Omni is
    installed (idempotent)."""
    if find_spec("vllm_omni") is None:
        return
    try:
        from edgemon.integrations.vllm_omni import register_pipelines  # noqa: PLC0415
        from edgemon.integrations.vllm_omni_realtime import (  # noqa: PLC0415
            register_realtime_pipelines,
        )

        register_pipelines()
        register_realtime_pipelines()
    except Exception:  # noqa: BLE001 - whatever vLLM-Omni raises, vLLM must still start
        _log.warning(
            "edgemon: vLLM-Omni's pipelines could not be loaded here; "
            "qwen3_tts_edgemon is not registered in this process",
            exc_info=True,
        )
