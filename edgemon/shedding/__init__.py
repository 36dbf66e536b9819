"""Shedding at arrival over MQTT: the engine's capacity object and the API server's refusals.

- `edgemon.shedding.topic`: the capacity topic (``P/{device}/capacity``): its settings, the
  object as read, and the engine's publisher (`CapacityPublisher`, built by edgemon's vLLM
  schedulers);
- `edgemon.shedding.middleware`: `EdgemonShedMiddleware`, the ASGI middleware that answers 503
  with ``Retry-After`` when the box cannot start a request within its start SLO, from the
  objects it follows (`CapacityView`); vLLM's ``--middleware`` takes it as
  ``edgemon.integrations.shed.EdgemonShedMiddleware``.

Both keep a retained object up to date over one paho connection each (`_retained`), on the
client's public helpers (`edgemon.client.mqtt`). Nothing here imports an engine.
"""

from __future__ import annotations
