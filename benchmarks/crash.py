"""Chunks lost to a SIGKILL, with and without the write-ahead log.

Run: `.venv/bin/python benchmarks/crash.py [--streams 20] [--seconds 19] [--wal true|false]`.
A real Mosquitto on a free loopback port and `python -m edgemon run` as a subprocess (fixed
client id, persistent session, state in a temporary directory, default snapshot interval).
A publisher sends `--streams` streams (on 4 devices) at 10 chunks/s each, QoS 1, 100 ms of
audio per chunk with `audio_total_ms`. After 5 s edgemon is restarted (SIGTERM, start
again); 3 s after that restart it is killed (SIGKILL) and started again at once. The
publisher goes on for `--seconds` in all, then sends each stream's `final` chunk. Printed:
chunks the broker acknowledged, `edgemon_chunks_total` of the last process once it has
counted them all (or stopped counting), and the difference: chunks lost.
"""

from __future__ import annotations

import argparse
import json
import signal
import tempfile
import threading
import time
from pathlib import Path

from _support import Edgemon, http_get, mosquitto, samples
from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion

DEVICES = 4
PERIOD_S = 0.1
AUDIO_MS = 100.0


class Publisher(threading.Thread):
    """The devices: one chunk per stream every `PERIOD_S`, QoS 1, until `seconds` are up."""

    def __init__(self, port: int, streams: int, seconds: float) -> None:
        super().__init__(name="publisher", daemon=True)
        self.streams = streams
        self.seconds = seconds
        self.sent = 0
        self.acked = 0
        self._lock = threading.Lock()
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id="crash-publisher")
        client.max_inflight_messages_set(1000)
        client.on_publish = self._on_publish
        client.connect("127.0.0.1", port)
        client.loop_start()
        self._client = client

    def _on_publish(self, *_: object) -> None:
        with self._lock:
            self.acked += 1

    def run(self) -> None:
        began = time.monotonic()
        tick = 0
        while True:
            final = time.monotonic() - began >= self.seconds
            for i in range(self.streams):
                event = {
                    "type": "chunk", "stream": f"s{i}", "t_ms": time.time() * 1000.0,
                    "seq": tick, "audio_ms": AUDIO_MS, "audio_total_ms": AUDIO_MS * (tick + 1),
                    "eta_ms": PERIOD_S * 1000, "final": final,
                }  # fmt: skip
                self._client.publish(f"edgemon/v1/c{i % DEVICES}/events", json.dumps(event), qos=1)
                self.sent += 1
            if final:
                return
            tick += 1
            time.sleep(max(0.0, began + tick * PERIOD_S - time.monotonic()))

    def wait_acked(self, timeout: float = 30) -> None:
        """Until the broker acknowledged every chunk sent."""
        deadline = time.monotonic() + timeout
        while self.acked < self.sent and time.monotonic() < deadline:
            time.sleep(0.05)
        self._client.loop_stop()
        self._client.disconnect()


def chunks(edgemon: Edgemon) -> float:
    """`edgemon_chunks_total` summed over devices."""
    _, text = http_get(f"http://127.0.0.1:{edgemon.http_port}/metrics")
    return sum(samples(text, "edgemon_chunks_total").values())


def main() -> None:
    """Restart, kill, count."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=19.0)
    parser.add_argument("--wal", choices=("true", "false"), help="[state] wal (default: ours)")
    args = parser.parse_args()
    config = "" if args.wal is None else f"wal = {args.wal}\n"
    with (
        tempfile.TemporaryDirectory(prefix="edgemon-crash-") as tmp,
        mosquitto(Path(tmp)) as port,
    ):
        directory = Path(tmp)
        edgemon = Edgemon(directory, port, config=config)
        edgemon.ready()
        publisher = Publisher(port, args.streams, args.seconds)
        publisher.start()
        time.sleep(5.0)
        edgemon.close()  # SIGTERM: snapshot, then a restart
        edgemon = Edgemon(directory, port, config=config)
        edgemon.ready()
        time.sleep(3.0)
        edgemon.process.send_signal(signal.SIGKILL)
        edgemon.process.wait()
        killed_at = publisher.sent
        edgemon = Edgemon(directory, port, config=config)
        try:
            edgemon.ready()
            publisher.join()
            publisher.wait_acked()
            last, still = -1.0, 0
            while still < 20:  # until the count stops moving for 2 s (or is complete)
                now = chunks(edgemon)
                if now >= publisher.acked:
                    break
                still = still + 1 if now == last else 0
                last = now
                time.sleep(0.1)
            applied = chunks(edgemon)
        finally:
            edgemon.close()
    lost = publisher.acked - applied
    print(
        f"crash: {args.streams} streams × 10 chunks/s, restart at 5 s, SIGKILL 3 s after it "
        f"(chunk {killed_at:,}), wal {args.wal or 'default'}"
    )
    print(
        f"  broker acknowledged {publisher.acked:,} chunks; edgemon applied {applied:,.0f}; "
        f"lost {lost:,.0f} ({lost / args.streams:.0f} per stream)"
    )


if __name__ == "__main__":
    main()
