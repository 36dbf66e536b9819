"""The shedding middleware under the name vLLM's ``--middleware`` option is given
(docs/client.md)::

    vllm serve MODEL --scheduler-cls edgemon.integrations.vllm_realtime.EdgemonRealtimeScheduler \\
        --middleware edgemon.integrations.shed.EdgemonShedMiddleware

It lives in `edgemon.shedding.middleware`, with the capacity topic it follows.
"""

from __future__ import annotations

from edgemon.shedding.middleware import (
    GENERATION_PATHS,
    CapacityView,
    EdgemonShedMiddleware,
    Refusal,
)

__all__ = ["GENERATION_PATHS", "CapacityView", "EdgemonShedMiddleware", "Refusal"]
