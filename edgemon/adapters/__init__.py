"""Adapters: what connects the pure engine to the outside (MQTT, HTTP, Prometheus metrics).

- `state`: the broker connection state the MQTT adapter keeps and the others read.
- `metrics`: a Prometheus collector that reads the engine at scrape time, and its registry.
- `http`: the aiohttp application (`/metrics`, `/healthz`, `/readyz`, `/api/v1/streams`)
  and a small server that reports the port it bound.
"""
