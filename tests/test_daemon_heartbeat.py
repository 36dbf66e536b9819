"""The daemon's heartbeat on a real Mosquitto: its retained `online` status, republished every
`[mqtt] heartbeat_s`, and nothing after the farewell's `offline`."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from edgemon.daemon import Daemon
from edgemon.settings import HttpSettings, MqttSettings, Settings

from daemons import running
from mqtt_probe import probe

if TYPE_CHECKING:
    from collections.abc import Callable

    from brokers import Broker
    from mqtt_probe import Probe, Seen

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def test_online_is_republished_every_heartbeat(mosquitto_broker: Broker) -> None:
    """With `heartbeat_s = 0.2` a subscriber sees `online` again and again, each carrying
    `heartbeat_s` and the same `started_ms`; after a clean stop the last status is `offline`
    (no heartbeat after the farewell) and is the retained one."""
    broker = mosquitto_broker
    instance = broker.client_id("edgemon-beat")
    status = broker.topic("_edgemon", instance, "status")
    settings = Settings(
        mqtt=MqttSettings(
            url=broker.url, client_id=instance, topic_prefix=broker.prefix, heartbeat_s=0.2
        ),
        http=HttpSettings(listen="127.0.0.1:0"),
    )
    daemon = Daemon(settings, environ={}, install_signal_handlers=False, snapshots=False)
    with probe(broker.host, broker.port, status) as watcher:
        async with running(daemon):
            assert await _wait(watcher, lambda seen: len(seen) >= 4)
        assert await _wait(watcher, lambda seen: seen[-1].json()["state"] == "offline")
        statuses = [m.json() for m in watcher.seen]
    online = [s for s in statuses if s["state"] == "online"]
    assert {s["heartbeat_s"] for s in online} == {0.2}
    assert len({s["started_ms"] for s in statuses}) == 1
    assert [s["state"] for s in statuses[len(online) :]] == ["offline"]
    with probe(broker.host, broker.port, status) as late:
        assert await _wait(late, lambda seen: len(seen) == 1)
        assert late.seen[0].retain
        assert late.seen[0].json()["state"] == "offline"


async def _wait(watcher: Probe, predicate: Callable[[list[Seen]], bool]) -> bool:
    """`watcher.wait_for(predicate)` off the event loop (the daemon runs on it)."""
    return await asyncio.to_thread(watcher.wait_for, predicate, 15.0)
