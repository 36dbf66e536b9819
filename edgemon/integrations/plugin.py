"""edgemon's vLLM general plugin: registers the vLLM-Omni pipelines with edgemon's talker.

vLLM runs every ``vllm.general_plugins`` entry point in each process it starts, before it
parses its command line (``vllm serve``, ``vllm-omni serve``) and again in engine processes.
Registering imports vLLM-Omni's pipeline registry, which imports every model vLLM-Omni ships,
so the plugin registers only where vLLM-Omni is in use:

- the process has imported ``vllm_omni`` already (``vllm-omni serve`` and its stages), or
- ``EDGEMON_OMNI_PIPELINES=1`` is set (the sure way for ``vllm-omni serve``: set it in the
  service's environment next to the ``EDGEMON_GATE_*`` variables).

Anywhere else, a plain ``vllm serve`` included, it returns at once and imports nothing. A
plugin must never stop vLLM: if vLLM-Omni's pipeline registry cannot be imported here, it
logs why and registers nothing.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

_log = logging.getLogger(__name__)

#: Set to 1 (or true/yes/on) to register edgemon's vLLM-Omni pipelines in every process.
ENV = "EDGEMON_OMNI_PIPELINES"


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether to register here: vLLM-Omni already imported, or `EDGEMON_OMNI_PIPELINES`."""
    flag = environ.get(ENV, "").strip().lower()
    return "vllm_omni" in sys.modules or flag in {"1", "true", "yes", "on"}


def register_omni_pipelines() -> None:
    """Register ``qwen3_tts_edgemon`` where vLLM-Omni is in use (see the module doc;
    idempotent)."""
    if not wanted():
        return
    try:
        from edgemon.integrations.vllm_omni import register_pipelines  # noqa: PLC0415

        register_pipelines()
    except Exception:  # noqa: BLE001 - whatever vLLM-Omni raises, vLLM must still start
        _log.warning(
            "edgemon: vLLM-Omni's pipelines could not be loaded here; "
            "qwen3_tts_edgemon is not registered in this process",
            exc_info=True,
        )
