"""The MQTT link's client: how it is built for the broker."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import TYPE_CHECKING, Any

import pytest
import structlog

from edgemon.adapters.state import ConnectionState
from edgemon.daemon import Daemon
from edgemon.daemon.mqtt import LinkHooks, MqttLink
from edgemon.settings import MqttSettings
from edgemon.wire.topics import Topics

from clients import settings_for
from daemons import logged, running

if TYPE_CHECKING:
    from collections.abc import MutableMapping


@pytest.mark.asyncio
async def test_the_link_disables_nagle_so_throttles_are_not_held_back() -> None:
    """The client socket is built with TCP_NODELAY: a throttle object written right after the
    PUBACK of the chunk that caused it must not wait ~40 ms for the broker's delayed ACK."""
    hooks = LinkHooks(
        on_message=lambda *_: None,
        status_payload=lambda state: state.encode(),
    )
    link = MqttLink(
        MqttSettings(),
        topics=Topics(),
        connection=ConnectionState(),
        hooks=hooks,
        log=logging.getLogger("test"),
    )
    client = link._new_client()
    assert (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1) in client._socket_options


@pytest.mark.integration
@pytest.mark.asyncio
async def test_two_instances_sharing_a_client_id_are_reported_and_back_off(
    mosquitto_broker: tuple[str, int], captured_logs: list[MutableMapping[str, Any]]
) -> None:
    """Two daemons with the same client id take each other's session in a loop. Each notices
    that its sessions keep ending right after they begin and logs `mqtt_session_taken_over`
    (an error naming the client id and the likely cause), and its reconnect delays keep
    growing instead of restarting from the first one after every short session."""
    _, port = mosquitto_broker
    twins = ("a", "b")

    def lines(twin: str) -> list[MutableMapping[str, Any]]:
        return [line for line in captured_logs if line.get("twin") == twin]

    async with contextlib.AsyncExitStack() as stack:
        for twin in twins:  # each logs through the real logger, its lines marked `twin`
            logger = structlog.get_logger("edgemon").bind(twin=twin)
            daemon = Daemon(
                settings_for(port, "edgemon-twin"), environ={}, log=logger,
                install_signal_handlers=False,
            )  # fmt: skip
            await stack.enter_async_context(running(daemon, until="started", logs=captured_logs))
        async with asyncio.timeout(30):
            while not logged(captured_logs, "mqtt_session_taken_over"):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
    twin = next(twin for twin in twins if logged(lines(twin), "mqtt_session_taken_over"))
    log = lines(twin)
    report = logged(log, "mqtt_session_taken_over")[0]
    assert report["client_id"] == "edgemon-twin"
    assert report["sessions_lost"] >= 3
    assert "same client id" in report["cause"]
    delays = [fields["delay_s"] for fields in logged(log, "mqtt_reconnect_scheduled")]
    assert len(delays) >= 3
    assert delays[2] >= 0.5 * 2**2 * 0.5 - 1e-3  # the third delay: no reset in between
