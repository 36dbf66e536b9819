"""The shedding middleware under the name vLLM's ``--middleware`` option is given:
``--middleware edgemon.integrations.shed.EdgemonShedMiddleware``, as in the engine command line
the documentation shows (docs/how-to/vllm.md). It lives in `edgemon.shedding.middleware`, with
the capacity topic it follows.
"""

from __future__ import annotations

from edgemon.shedding.middleware import (
    GENERATION_PATHS,
    CapacityView,
    EdgemonShedMiddleware,
    Refusal,
)

__all__ = ["GENERATION_PATHS", "CapacityView", "EdgemonShedMiddleware", "Refusal"]
