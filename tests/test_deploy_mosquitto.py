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
import os
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import aiomqtt
import pytest

from edgemon.settings import LimitsSettings

from brokers import MosquittoStartError, launch_mosquitto
from ports import end_process
from tools import require_tool, tool_path

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "mosquitto"
CONF = DEPLOY / "mosquitto.conf"
ACL = DEPLOY / "acl"
MOSQUITTO_PASSWD = tool_path("mosquitto_passwd")
PASSWORDS = {"dev1": "pw-dev1", "dev2": "pw-dev2", "edgemon": "pw-edgemon"}
RECEIVE_S = 3.0  # only ever waited for in full when a test fails


def _directives(text: str) -> dict[str, list[str]]:
    """Active (uncommented) directives: name → the rest of each of its lines."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        name, _, rest = line.strip().partition(" ")
        if name and not name.startswith("#"):
            found.setdefault(name, []).append(rest.strip())
    return found


def _adapt(text: str, *, port: int, directory: Path) -> str:
    """The shipped config with what a test must change; fails if one of them is missing."""
    replacements = {
        "listener": f"listener {port} 127.0.0.1",
        "persistence_location": f"persistence_location {directory}/",
        "password_file": f"password_file {directory / 'passwd'}",
        "acl_file": f"acl_file {ACL}",
        "log_dest": "log_dest stderr",
        "pid_file": "",
        # As root mosquitto switches to "mosquitto", which cannot write into tmp_path.
        "user": "user root" if os.geteuid() == 0 else "",
    }
    seen: set[str] = set()
    lines = []
    for line in text.splitlines():
        name = line.strip().partition(" ")[0]
        if name in replacements:
            assert name not in seen, f"{name} appears twice: adapt the test"
            seen.add(name)
            line = replacements[name]  # noqa: PLW2901
        lines.append(line)
    assert seen == set(replacements), f"missing in mosquitto.conf: {set(replacements) - seen}"
    return "\n".join(lines) + "\n"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[int]:
    """The shipped config on a free port, users dev1, dev2 and edgemon: the port."""
    require_tool("mosquitto", "mosquitto_passwd")
    passwd = tmp_path / "passwd"
    for index, (user, password) in enumerate(PASSWORDS.items()):
        create = ["-c"] if index == 0 else []
        subprocess.run(
            [MOSQUITTO_PASSWD, "-b", *create, str(passwd), user, password],
            check=True,
            capture_output=True,
        )
    try:
        process, (port,) = launch_mosquitto(
            tmp_path, lambda ports: _adapt(CONF.read_text(), port=ports[0], directory=tmp_path)
        )
    except MosquittoStartError as error:
        pytest.fail(str(error))
    try:
        yield port
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


def test_only_edgemon_writes_throttle_and_status() -> None:
    """No ACL line before `user edgemon` grants write on a throttle or status topic."""
    grants = re.findall(r"^(pattern|topic|user) (\S+)(?: (\S+))?", ACL.read_text(), re.MULTILINE)
    user = None
    for kind, first, second in grants:
        if kind == "user":
            user = first
            continue
        access, topic = (first, second) if second else ("readwrite", first)
        if topic.endswith("/throttle") or topic.split("/")[2] == "_edgemon":
            assert user == "edgemon" or access == "read", (kind, access, topic)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_device_events_and_engine_reach_edgemon(broker: int) -> None:
    """dev1 publishes to its own events, engine and capacity topics; edgemon gets them (through
    the wildcard, and through an exact topic as an instance with `[mqtt] devices` subscribes)."""
    async with connect(broker, "edgemon") as edgemon, connect(broker, "dev1") as dev1:
        await edgemon.subscribe("edgemon/v1/+/events", qos=1)
        await edgemon.subscribe("edgemon/v1/dev1/engine", qos=1)
        await edgemon.subscribe("edgemon/v1/+/capacity", qos=1)
        await dev1.publish("edgemon/v1/dev1/events", b'{"type":"end"}', qos=1)
        assert await next_message(edgemon) == ("edgemon/v1/dev1/events", b'{"type":"end"}')
        await dev1.publish("edgemon/v1/dev1/engine", b"{}", qos=1, retain=True)
        assert await next_message(edgemon) == ("edgemon/v1/dev1/engine", b"{}")
        await dev1.publish("edgemon/v1/dev1/capacity", b'{"running":1}', qos=1, retain=True)
        assert await next_message(edgemon) == ("edgemon/v1/dev1/capacity", b'{"running":1}')


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
