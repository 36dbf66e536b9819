"""The MQTT link's client: how it is built for the broker."""

from __future__ import annotations

import logging
import socket

import pytest

from edgemon.adapters.state import ConnectionState
from edgemon.daemon.mqtt import LinkHooks, MqttLink
from edgemon.settings import MqttSettings
from edgemon.wire.topics import Topics


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
