"""How the clients' connections behave (`PahoLink`): the gate says that its broker cannot be
reached in one WARNING naming the broker, however many attempts fail (`wait_connected` False
meanwhile and True once a broker is there); every connection sends without Nagle's delay."""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import TYPE_CHECKING

import pytest

from edgemon.broker_url import Broker
from edgemon.client import ThrottleGate
from edgemon.client._mqtt import PahoLink

from ports import MosquittoServer

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration


def test_an_unreachable_broker_is_said_once_by_the_gate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The gate's first failed attempt is a WARNING naming the broker; the next ones are debug
    lines; when the broker comes, `wait_connected` says True and the gate is connected."""
    caplog.set_level(logging.DEBUG, logger="edgemon.client")
    server = MosquittoServer(tmp_path)
    gate = ThrottleGate(server.url, "dev1").open()
    try:
        assert not gate.wait_connected(2.5)
        deadline = time.monotonic() + 30
        while sum("failed again" in r.message for r in caplog.records) < 1:
            assert time.monotonic() < deadline, [r.message for r in caplog.records]
            time.sleep(0.05)
        server.start()
        assert gate.wait_connected(30)
    finally:
        gate.close()
        server.stop()
    warnings = [r.message for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert f"{server.host}:{server.port}" in warnings[0]


def test_a_client_connection_sends_without_nagles_delay(
    mosquitto_server: MosquittoServer,
) -> None:
    """Every connection of a `PahoLink` (the Reporter's, the gate's, the engine's links, the
    simulator's) has `TCP_NODELAY` set, the one made after the broker restarted too: a report
    published just after the client's PUBACK of a throttle object would otherwise wait for
    the broker's delayed ACK of it."""
    broker = Broker(mosquitto_server.host, mosquitto_server.port)
    connected = threading.Event()

    def up(_client: object) -> None:
        connected.set()

    link = PahoLink(
        broker, who="nodelay test", client_id="nodelay-test", on_up=up, on_down=lambda _: False
    )
    client = link.open()
    try:
        for restart in (True, False):  # the first connection, then the one after a restart
            assert connected.wait(30)
            sock = client.socket()
            assert isinstance(sock, socket.socket)
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
            if restart:
                connected.clear()
                mosquitto_server.stop()
                mosquitto_server.start()
    finally:
        link.close(10)
