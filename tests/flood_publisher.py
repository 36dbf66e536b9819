"""A paho publisher flooding edgemon with chunks, as a process of its own (written once for
the flow-control and overload tests and `benchmarks/flood.py`).

Run `python tests/flood_publisher.py PORT count MESSAGES STREAMS DEVICES [CLIENT_ID]`: sends
MESSAGES single-chunk QoS 1 messages as fast as paho can, round-robin over STREAMS streams on
DEVICES devices (`s<n>` on `d<n % DEVICES>`; seq 0, 1, … per stream, each chunk with
`audio_total_ms`), waits for every acknowledgement and prints `{"acked", "seconds"}`.

Run `python tests/flood_publisher.py PORT batches NAME QOS SECONDS`: for SECONDS, batches of
1000 chunks over 200 streams of device NAME at QoS QOS (the costliest input: every event is
applied); prints how many batches it published.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from paho.mqtt.client import Client
from paho.mqtt.enums import CallbackAPIVersion

#: This script, for `subprocess` / `asyncio.create_subprocess_exec(sys.executable, SCRIPT, …)`.
SCRIPT = str(Path(__file__).resolve())


def count(port: int, messages: int, streams: int, devices: int, client_id: str) -> None:
    """The counted flood; prints acknowledgements and seconds as JSON."""
    client = Client(CallbackAPIVersion.VERSION2, client_id=client_id)
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    acked = 0

    def on_publish(*_: object) -> None:
        nonlocal acked
        acked += 1

    client.on_publish = on_publish
    client.connect("127.0.0.1", port)
    client.loop_start()
    began = time.monotonic()
    for n in range(messages):
        stream, seq = n % streams, n // streams
        event = {
            "type": "chunk",
            "stream": f"s{stream}",
            "t_ms": time.time() * 1000.0,
            "seq": seq,
            "audio_ms": 40,
            "audio_total_ms": 40 * (seq + 1),
            "eta_ms": 40,
        }
        client.publish(f"edgemon/v1/d{stream % devices}/events", json.dumps(event), qos=1)
    deadline = time.monotonic() + 300
    while acked < messages and time.monotonic() < deadline:
        time.sleep(0.01)
    print(json.dumps({"acked": acked, "seconds": time.monotonic() - began}))
    client.loop_stop()
    client.disconnect()


def batches(port: int, name: str, qos: int, seconds: float) -> None:
    """Batches for `seconds`; prints how many were published."""
    client = Client(CallbackAPIVersion.VERSION2, client_id=name)
    client.max_inflight_messages_set(200)
    client.connect("127.0.0.1", port)
    client.loop_start()
    topic = f"edgemon/v1/{name}/events"
    seq = 0
    sent = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.time() * 1000.0
        batch = [
            {
                "type": "chunk",
                "stream": f"s{i % 200}",
                "t_ms": t,
                "seq": seq + i // 200,
                "audio_ms": 40,
                "eta_ms": 40,
            }
            for i in range(1000)
        ]
        seq += 5
        info = client.publish(topic, json.dumps(batch), qos=qos)
        sent += 1
        if qos and sent % 50 == 0:
            info.wait_for_publish(timeout=5)
    client.loop_stop()
    client.disconnect()
    print(sent)


def main(argv: list[str]) -> None:
    """Dispatch on the mode (see the module's docstring)."""
    port, mode, *rest = argv
    if mode == "count":
        messages, streams, devices = (int(a) for a in rest[:3])
        count(int(port), messages, streams, devices, rest[3] if len(rest) > 3 else "flood")
    else:
        name, qos, seconds = rest
        batches(int(port), name, int(qos), float(seconds))


if __name__ == "__main__":
    main(sys.argv[1:])
