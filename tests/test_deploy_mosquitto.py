"""The shipped Mosquitto config and ACL (`deploy/mosquitto/`), enforced by a real broker.

The broker runs the shipped `mosquitto.conf` with only what a test must change (port,
persistence directory, password file, log) and the shipped `acl` file unchanged. A denied
publish is dropped silently, so each "not delivered" check publishes the denied message with
QoS 1 (the broker has handled it once the PUBACK is back), then an allowed marker: the
subscriber's next message must be the marker.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from typing import TYPE_CHECKING

import aiomqtt
import pytest
from shipped_broker import ACL, CONF, launch_shipped, launch_shipped_with_websockets

from edgemon.broker_url import parse_broker_url
from edgemon.settings import LimitsSettings
from edgemon.shedding.middleware import CapacityView
from edgemon.shedding.topic import CapacityPublisher, TopicConfig

from brokers import MosquittoStartError
from links import until
from pki import make_pki
from ports import end_process
from tools import require_tool

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator
    from pathlib import Path

PASSWORDS = {
    "dev1": "pw-dev1",
    "dev2": "pw-dev2",
    "edgemon": "pw-edgemon",
    "tts-engine": "pw-tts-engine",
}
RECEIVE_S = 3.0  # only ever waited for in full when a test fails
T = 30.0  # generous: a loaded machine


def _directives(text: str) -> dict[str, list[str]]:
    """Active (uncommented) directives: name → the rest of each of its lines."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        name, _, rest = line.strip().partition(" ")
        if name and not name.startswith("#"):
            found.setdefault(name, []).append(rest.strip())
    return found


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[int]:
    """The shipped config and ACL on a free port, users dev1, dev2, edgemon and tts-engine:
    the port."""
    require_tool("mosquitto", "mosquitto_passwd")
    try:
        process, port = launch_shipped(tmp_path, PASSWORDS)
    except MosquittoStartError as error:
        pytest.fail(str(error))
    try:
        yield port
    finally:
        end_process(process)


@pytest.fixture
def wss_broker(tmp_path: Path) -> Iterator[tuple[int, int, Path]]:
    """The shipped config with its web players' wss:// listener uncommented (a throw-away
    certificate): (MQTT port, wss:// port, the CA that signed the certificate)."""
    require_tool("mosquitto", "mosquitto_passwd", "openssl")
    pki = make_pki(tmp_path)
    try:
        process, port, wss_port = launch_shipped_with_websockets(
            tmp_path, PASSWORDS, cert=pki.server_cert, key=pki.server_key
        )
    except MosquittoStartError as error:
        pytest.fail(str(error))
    try:
        yield port, wss_port, pki.ca
    finally:
        end_process(process)


@contextlib.asynccontextmanager
async def connect(port: int, user: str) -> AsyncIterator[aiomqtt.Client]:
    """An MQTT 3.1.1 client logged in as `user`."""
    async with aiomqtt.Client(
        "127.0.0.1", port, username=user, password=PASSWORDS[user], identifier=f"test-{user}"
    ) as client:
        yield client


async def next_message(client: aiomqtt.Client) -> tuple[str, bytes]:
    """The next message the client receives: (topic, payload)."""
    async with asyncio.timeout(RECEIVE_S):
        message = await anext(client.messages)
    assert isinstance(message.payload, bytes)
    return str(message.topic), message.payload


def test_message_size_limit_is_edgemons_max_payload() -> None:
    """The broker drops exactly the payloads edgemon would reject as oversized."""
    limit = _directives(CONF.read_text())["message_size_limit"]
    assert limit == [str(LimitsSettings().max_payload_bytes)]


def test_config_requires_login_and_persists() -> None:
    """No anonymous access, password and ACL files, persistence on."""
    directives = _directives(CONF.read_text())
    assert directives["allow_anonymous"] == ["false"]
    assert directives["persistence"] == ["true"]
    assert directives["persistence_location"]
    assert directives["password_file"]
    assert directives["acl_file"]
    assert directives["per_listener_settings"] == ["false"]  # the same rules on every listener


def test_only_edgemon_writes_throttle_slack_and_status() -> None:
    """No ACL line but `user edgemon`'s grants write on a throttle, slack feed or status
    topic."""
    grants = re.findall(r"^(pattern|topic|user) (\S+)(?: (\S+))?", ACL.read_text(), re.MULTILINE)
    user = None
    for kind, first, second in grants:
        if kind == "user":
            user = first
            continue
        access, topic = (first, second) if second else ("readwrite", first)
        if topic.endswith(("/throttle", "/slack")) or topic.split("/")[2] == "_edgemon":
            assert user == "edgemon" or access == "read", (kind, access, topic)


def test_no_player_writes_engine_or_capacity_objects() -> None:
    """No `pattern` line (every login gets those, players included) grants write on an engine
    or capacity topic; the users that may are edgemon's engine users (`tts-engine`)."""
    grants = re.findall(r"^(pattern|topic|user) (\S+)(?: (\S+))?", ACL.read_text(), re.MULTILINE)
    user = None
    writers = set()
    for kind, first, second in grants:
        if kind == "user":
            user = first
            continue
        access, topic = (first, second) if second else ("readwrite", first)
        if "write" in access and topic.split("/")[3:4] in (["engine"], ["capacity"]):
            assert kind == "topic", (kind, access, topic)
            writers.add(user)
    assert writers == {"tts-engine"}


@pytest.mark.integration
@pytest.mark.asyncio
async def test_device_events_and_engine_reach_edgemon(broker: int) -> None:
    """dev1 publishes its events, the engine (`tts-engine`) dev1's engine and capacity objects;
    edgemon gets them (through the wildcard, and through an exact topic as an instance with
    `[mqtt] devices` subscribes)."""
    async with (
        connect(broker, "edgemon") as edgemon,
        connect(broker, "dev1") as dev1,
        connect(broker, "tts-engine") as engine,
    ):
        await edgemon.subscribe("edgemon/v1/+/events", qos=1)
        await edgemon.subscribe("edgemon/v1/dev1/engine", qos=1)
        await edgemon.subscribe("edgemon/v1/+/capacity", qos=1)
        await dev1.publish("edgemon/v1/dev1/events", b'{"type":"end"}', qos=1)
        assert await next_message(edgemon) == ("edgemon/v1/dev1/events", b'{"type":"end"}')
        await engine.publish("edgemon/v1/dev1/engine", b"{}", qos=1, retain=True)
        assert await next_message(edgemon) == ("edgemon/v1/dev1/engine", b"{}")
        await engine.publish("edgemon/v1/dev1/capacity", b'{"running":1}', qos=1, retain=True)
        assert await next_message(edgemon) == ("edgemon/v1/dev1/capacity", b'{"running":1}')


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_player_writes_no_engine_or_capacity_object(broker: int) -> None:
    """A player's login (dev1) cannot publish its own engine or capacity object, nor its
    refusal counts, nor another device's (the middleware refuses requests and the balancer
    weighs the box by them): dropped; the engine's next object arrives instead."""
    async with (
        connect(broker, "edgemon") as edgemon,
        connect(broker, "dev1") as dev1,
        connect(broker, "tts-engine") as engine,
    ):
        await edgemon.subscribe("edgemon/v1/+/capacity", qos=1)
        await edgemon.subscribe("edgemon/v1/+/engine", qos=1)
        for topic in (
            "edgemon/v1/dev1/capacity",
            "edgemon/v1/dev1/engine",
            "edgemon/v1/dev2/capacity",
            "edgemon/v1/dev1/capacity/shed/forged",
        ):
            await dev1.publish(topic, b'{"start_wait_ms":1e9}', qos=1, retain=True)
        await engine.publish("edgemon/v1/dev1/capacity", b'{"running":2}', qos=1, retain=True)
        assert await next_message(edgemon) == ("edgemon/v1/dev1/capacity", b'{"running":2}')


@pytest.mark.integration
@pytest.mark.asyncio
async def test_device_cannot_speak_for_another_device(broker: int) -> None:
    """dev1's publishes to dev2's events and engine topics are dropped, its own go through."""
    async with connect(broker, "edgemon") as edgemon, connect(broker, "dev1") as dev1:
        await edgemon.subscribe("edgemon/v1/+/events", qos=1)
        await edgemon.subscribe("edgemon/v1/+/engine", qos=1)
        await dev1.publish("edgemon/v1/dev2/events", b"forged", qos=1)
        await dev1.publish("edgemon/v1/dev2/engine", b"forged", qos=1)
        await dev1.publish("edgemon/v1/dev1/events", b"marker", qos=1)
        assert await next_message(edgemon) == ("edgemon/v1/dev1/events", b"marker")


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_web_player_over_wss_speaks_only_for_its_device(
    wss_broker: tuple[int, int, Path],
) -> None:
    """A browser's login on the wss:// listener (MQTT over WebSocket and TLS) is pinned to its
    own device as on any listener: dev1's publish to dev2's events is dropped, its own goes
    through, and a wrong password is refused."""
    port, wss_port, ca = wss_broker
    tls = ssl.create_default_context(cafile=str(ca))

    def web(user: str, password: str) -> aiomqtt.Client:
        return aiomqtt.Client(
            "127.0.0.1", wss_port, username=user, password=password, identifier=f"web-{user}",
            transport="websockets", tls_context=tls,
        )  # fmt: skip

    async with connect(port, "edgemon") as edgemon, web("dev1", PASSWORDS["dev1"]) as dev1:
        await edgemon.subscribe("edgemon/v1/+/events", qos=1)
        await dev1.publish("edgemon/v1/dev2/events", b"forged", qos=1)
        await dev1.publish("edgemon/v1/dev1/events", b"marker", qos=1)
        assert await next_message(edgemon) == ("edgemon/v1/dev1/events", b"marker")
    with pytest.raises(aiomqtt.MqttError):
        async with web("dev1", "not-the-password"):
            pass


@pytest.mark.integration
@pytest.mark.asyncio
async def test_only_edgemon_writes_throttle(broker: int) -> None:
    """Throttle publishes by dev1 (its own) and dev2 (dev1's) are dropped; edgemon's arrive."""
    async with (
        connect(broker, "edgemon") as edgemon,
        connect(broker, "dev1") as dev1,
        connect(broker, "dev2") as dev2,
    ):
        await dev1.subscribe("edgemon/v1/dev1/throttle", qos=1)
        await dev1.publish("edgemon/v1/dev1/throttle", b"self", qos=1, retain=True)
        await dev2.publish("edgemon/v1/dev1/throttle", b"forged", qos=1, retain=True)
        await edgemon.publish("edgemon/v1/dev1/throttle", b"edgemon", qos=1, retain=True)
        assert await next_message(dev1) == ("edgemon/v1/dev1/throttle", b"edgemon")


@pytest.mark.integration
@pytest.mark.asyncio
async def test_the_engine_reads_the_slack_feed_only_edgemon_writes(broker: int) -> None:
    """A feed published by a player (dev1) is dropped; edgemon's reaches the engine."""
    async with (
        connect(broker, "edgemon") as edgemon,
        connect(broker, "dev1") as dev1,
        connect(broker, "tts-engine") as engine,
    ):
        await engine.subscribe("edgemon/v1/+/slack", qos=1)
        await dev1.publish("edgemon/v1/dev1/slack", b"forged", qos=1)
        await edgemon.publish("edgemon/v1/dev1/slack", b"edgemon", qos=1)
        assert await next_message(engine) == ("edgemon/v1/dev1/slack", b"edgemon")


@pytest.mark.integration
@pytest.mark.asyncio
async def test_device_reads_only_its_own_throttle(broker: int) -> None:
    """dev2 never receives dev1's (retained) throttle, by name or by wildcard; it gets its own."""
    async with connect(broker, "edgemon") as edgemon:
        await edgemon.publish("edgemon/v1/dev1/throttle", b"for-dev1", qos=1, retain=True)
        async with connect(broker, "dev2") as dev2:
            await dev2.subscribe("edgemon/v1/dev1/throttle", qos=1)
            await dev2.subscribe("edgemon/v1/+/throttle", qos=1)
            await dev2.subscribe("edgemon/v1/#", qos=1)
            await edgemon.publish("edgemon/v1/dev1/throttle", b"for-dev1", qos=1, retain=True)
            await edgemon.publish("edgemon/v1/dev2/throttle", b"for-dev2", qos=1)
            assert await next_message(dev2) == ("edgemon/v1/dev2/throttle", b"for-dev2")


@pytest.mark.integration
@pytest.mark.asyncio
async def test_only_edgemon_writes_status_which_devices_read(broker: int) -> None:
    """A device's forged status is dropped; edgemon's status reaches the devices."""
    topic = "edgemon/v1/_edgemon/edgemon/status"
    async with connect(broker, "edgemon") as edgemon, connect(broker, "dev1") as dev1:
        await dev1.subscribe("edgemon/v1/_edgemon/+/status", qos=1)
        await dev1.publish(topic, b'{"state":"offline"}', qos=1, retain=True)
        await edgemon.publish(topic, b'{"state":"online"}', qos=1, retain=True)
        assert await next_message(dev1) == (topic, b'{"state":"online"}')


@pytest.mark.integration
@pytest.mark.asyncio
async def test_anonymous_and_wrong_password_are_refused(broker: int) -> None:
    """Connecting without credentials, or with a wrong password, fails."""
    with pytest.raises(aiomqtt.MqttError):
        async with aiomqtt.Client("127.0.0.1", broker, identifier="anonymous"):
            pass
    with pytest.raises(aiomqtt.MqttError):
        async with aiomqtt.Client(
            "127.0.0.1", broker, username="dev1", password="wrong", identifier="guess"
        ):
            pass


@pytest.mark.integration
@pytest.mark.asyncio
async def test_payload_over_the_limit_is_dropped(broker: int) -> None:
    """One byte over max_payload_bytes is dropped; exactly max_payload_bytes is delivered."""
    limit = LimitsSettings().max_payload_bytes
    async with connect(broker, "edgemon") as edgemon, connect(broker, "dev1") as dev1:
        await edgemon.subscribe("edgemon/v1/+/events", qos=1)
        await dev1.publish("edgemon/v1/dev1/events", b"x" * (limit + 1), qos=1)
        await dev1.publish("edgemon/v1/dev1/events", b"y" * limit, qos=1)
        topic, payload = await next_message(edgemon)
        assert (topic, len(payload), payload[:1]) == ("edgemon/v1/dev1/events", limit, b"y")


#: The two layouts of docs/how-to/edge-box.md: one box (the engine next to its one player),
#: and a hub whose engine serves several players.
LAYOUTS = {"one-box": ("dev1",), "hub": ("dev1", "dev2")}


@pytest.mark.integration
@pytest.mark.asyncio
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
async def test_the_engine_and_its_middleware_read_what_they_need(broker: int, layout: str) -> None:
    """In each layout, with the shipped ACL and the engine's login: the capacity publisher's
    object reaches the middleware's view on every device's topic (so it refuses when the
    predicted wait is beyond the SLO) and edgemon; the view's refusal count reaches the
    publisher's `shed_total`; no subscription of either is refused."""
    devices = LAYOUTS[layout]
    url = f"mqtt://127.0.0.1:{broker}"
    engine = parse_broker_url(url, username="tts-engine", password=PASSWORDS["tts-engine"])
    config = TopicConfig(engine, devices)
    publisher = CapacityPublisher(config, min_interval_s=0.05).open()
    view = CapacityView(config).open()
    try:
        async with connect(broker, "edgemon") as edgemon:
            await edgemon.subscribe("edgemon/v1/+/capacity", qos=1)
            await until(lambda: publisher.link.connected and view.link.connected, "connected")
            publisher.update(
                realtime_streams=4, running=4, waiting=2, start_wait_ms=9_000.0, shed={}
            )
            await until(lambda: set(view.readings()) == set(devices), "every device's object")
            refusal = view.judge(3_000.0)
            assert refusal is not None
            assert refusal.start_wait_ms == 9_000.0
            seen = {(await next_message(edgemon))[0] for _ in devices}
            assert seen == {f"edgemon/v1/{device}/capacity" for device in devices}
            view.refused()
            await until(lambda: publisher.http_shed == 1, "the refusal count at the engine")
        assert (publisher.link.refused, view.link.refused) == ((), ())
        assert publisher.link.errors == view.link.errors == 0
    finally:
        view.close()
        publisher.close()
