"""edgemon's vLLM general plugin: registers the vLLM-Omni pipelines with edgemon's talker.

vLLM runs every ``vllm.general_plugins`` entry point in each process it starts, before it
parses its command line (``vllm serve``, ``vllm-omni serve``) and again in engine processes.
Registering imports vLLM-Omni's pipeline registry, which imports every model vLLM-Omni ships,
so the plugin registers only when asked: with ``EDGEMON_OMNI_PIPELINES=1`` in the environment
(set it for ``vllm-omni serve``, next to the ``EDGEMON_GATE_*`` variables). Anywhere else, a
plain ``vllm serve`` included, it returns at once and imports nothing. (Whether ``vllm_omni``
is imported already says nothing: vLLM-Omni's own general plugin imports it in every vLLM
process of an environment where it is installed.) A
plugin must never stop vLLM: if vLLM-Omni's pipeline registry cannot be imported here, it
logs why and registers nothing.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from edgemon.environ import OMNI_PIPELINES, EnvironError, read_variable

if TYPE_CHECKING:
    from collections.abc import Mapping

_log = logging.getLogger(__name__)


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether to register here: ``EDGEMON_OMNI_PIPELINES`` is 1, true, yes or on. A value
    that is not a flag is logged as a warning and registers nothing (a plugin must never stop
    vLLM)."""
    try:
        return read_variable(environ, OMNI_PIPELINES)
    except EnvironError as exc:
        _log.warning("edgemon: %s; edgemon's vLLM-Omni pipelines are not registered", exc)
        return False


def register_omni_pipelines() -> None:
    """Register ``qwen3_tts_edgemon`` and ``qwen3_tts_edgemon_realtime`` where vLLM-Omni is in
    use (see the module doc; idempotent)."""
    if not wanted():
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
            "qwen3_tts_edgemon is not registered in this process (nor its _realtime twin)",
            exc_info=True,
        )
