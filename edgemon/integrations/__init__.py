"""Engine integrations: schedulers that obey edgemon's throttle (docs/client.md).

Each integration lives in its own module and imports its engine there, so importing this
package imports no engine:

- `edgemon.integrations.vllm`: `EdgemonScheduler` (and `EdgemonAsyncScheduler`) for vLLM V1;
- `edgemon.integrations.vllm_omni`: `EdgemonOmniARScheduler` (and the async flavour) for the
  talker stage of vLLM-Omni.
"""

from __future__ import annotations
