"""The running daemon publishes each device's slack feed on `P/{device}/slack` (QoS 0), as
docs/protocol.md "Slack feed" says, and not at all with `[mqtt] feed_ms = 0`."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import aiomqtt
import pytest

from edgemon.daemon.app import Daemon

from clients import WAIT_S, chunk, device, now_ms, scrape, send, settings_for
from daemons import running

if TYPE_CHECKING:
    from brokers import Broker

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def test_a_devices_players_measured_slack_is_published(
    mosquitto_broker: Broker,
) -> None:
    """A stream given 2 s of audio appears in its device's feed with the slack that audio
    leaves at the feed's instant, playing, and the feeds are counted on `/metrics`."""
    broker = mosquitto_broker
    daemon = Daemon(settings_for(broker), environ={}, install_signal_handlers=False)
    reader_id = broker.client_id("feed-reader")
    async with (
        aiomqtt.Client(broker.host, broker.port, identifier=reader_id) as reader,
        running(daemon),
        device(broker) as client,
    ):
        await reader.subscribe(broker.topic("+", "slack"), qos=0)
        first = chunk("s1", 0, 2_000, 50)
        await send(client, "dev1", {"type": "start", "stream": "s1", "t_ms": now_ms()}, first)
        feed: dict[str, Any] = {}
        async with asyncio.timeout(WAIT_S):
            async for message in reader.messages:
                assert message.topic.value == broker.topic("dev1", "slack")
                assert not message.retain
                assert isinstance(message.payload, bytes)
                feed = json.loads(message.payload)
                if feed["streams"]:
                    break
        (entry,) = feed["streams"]
        assert feed["device"] == "dev1"
        assert entry["stream"] == "s1"
        assert entry["playing"] is True
        assert entry["play_start_ms"] == pytest.approx(first["t_ms"], abs=1e-3)
        assert entry["slack_ms"] == pytest.approx(2_000 - (feed["t_ms"] - first["t_ms"]), abs=2e-3)
        status, text = await scrape(daemon.http_port or 0, "/metrics")
    assert status == 200
    assert "edgemon_slack_feeds_published_total" in text


async def test_feed_ms_zero_publishes_no_feed(mosquitto_broker: Broker) -> None:
    """With `[mqtt] feed_ms = 0` the daemon runs no feed: its counter is not exported."""
    settings = settings_for(mosquitto_broker)
    settings = settings.model_copy(
        update={"mqtt": settings.mqtt.model_copy(update={"feed_ms": 0.0})}
    )
    daemon = Daemon(settings, environ={}, install_signal_handlers=False)
    async with running(daemon):
        assert daemon.slack_feed is None
        status, text = await scrape(daemon.http_port or 0, "/metrics")
    assert status == 200
    assert "edgemon_slack_feeds_published_total" not in text
