"""Engine integrations: vLLM schedulers that obey edgemon's throttle (docs/client.md).

Each integration lives in its own module and imports its engine there, so importing this
package imports no engine:

- `edgemon.integrations.vllm`: `EdgemonScheduler` (and `EdgemonAsyncScheduler`) for vLLM V1;
  `edgemon.integrations.vllm_realtime`: `EdgemonRealtimeScheduler`, with real-time admission;
- `edgemon.integrations.vllm_omni`: `EdgemonOmniARScheduler` (and the async flavour) for the
  talker stage of vLLM-Omni; `edgemon.integrations.vllm_omni_realtime` with real-time
  admission;
- `edgemon.integrations.shed`: `EdgemonShedMiddleware` for vLLM's ``--middleware`` option
  (`edgemon.shedding`: the capacity object the schedulers publish, and the refusals);
- `edgemon.integrations.plugin`: the vLLM general plugin that registers the vLLM-Omni
  pipelines.

The policy they apply is `edgemon.policy`'s; their settings come from `edgemon.environ`.
"""

from __future__ import annotations
