"""Engine integrations: schedulers that obey edgemon's throttle (docs/client.md).

Each integration lives in its own module and imports its engine there, so importing this
package imports no engine:

- `edgemon.integrations.vllm`: `EdgemonScheduler` (and `EdgemonAsyncScheduler`) for vLLM V1;
- `edgemon.integrations.vllm_omni`: `EdgemonOmniARScheduler` (and the async flavour) for the
  talker stage of vLLM-Omni;
- `edgemon.integrations.shed`: `EdgemonShedMiddleware`, the ASGI middleware that answers 503
  with ``Retry-After`` when the box cannot start a request within its start SLO (vLLM's
  ``--middleware`` option), from the capacity object the schedulers publish
  (`edgemon.integrations.capacity_topic`).
"""

from __future__ import annotations
