"""Shared fixtures. Each one is self-contained and says what it provides."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import structlog
from hypothesis import HealthCheck, settings
from structlog.testing import capture_logs

from edgemon.protocol import TOPIC_PREFIX

from amqtt_broker import AmqttStartError, launch_amqtt
from brokers import (
    RUN_AS_ROOT,
    Broker,
    MosquittoStartError,
    accepts,
    end_process,
    free_port,
    launch_mosquitto,
    plain_listener,
)
from ports import MosquittoServer, Servers
from properties import DEEP
from tools import require_tool

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, MutableMapping, Sequence
    from typing import Any

    from structlog.typing import EventDict, WrappedLogger


# ------------------------------------------------------------------ Hypothesis
# No deadline: on a loaded 2-core machine one example may take seconds, which says nothing
# about the property. Examples stay random (not derandomized); a failure prints the blob
# that reproduces it (`@reproduce_failure`), whatever the example database holds. A property
# that names no count runs 25 examples, or Hypothesis's 100 under `make test-deep`
# (properties.py).
settings.register_profile(
    "edgemon",
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
    max_examples=100 if DEEP else 25,
)
settings.load_profile("edgemon")


# ------------------------------------------------------------------ markers that are right
#: Set by `make test-fast`: no test there may start a process.
FAST_ENV = "EDGEMON_TEST_FAST"
#: Fixtures that start external programs: a test using one is an integration test.
_PROGRAM_FIXTURES = frozenset(
    {
        "mosquitto_broker", "private_broker", "mosquitto_server", "servers", "any_broker",
        "subscriptions_denied_broker",
    }
)  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that uses a fixture starting a program must be marked `integration` (so that
    `make test-fast`, `-m "not integration"`, never needs a broker): else the run stops."""
    unmarked = [
        item.nodeid
        for item in items
        if _PROGRAM_FIXTURES & set(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("integration") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "tests that start programs must be marked integration: " + ", ".join(unmarked)
        )


@pytest.fixture(autouse=True)
def _no_process_outside_integration_tests(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the fast tier (`make test-fast` sets `EDGEMON_TEST_FAST=1`), a test not marked
    `integration` may start no process (`subprocess`, and asyncio's subprocesses, which use
    it): it fails saying so, and the marker is added where it belongs."""
    if not os.environ.get(FAST_ENV) or request.node.get_closest_marker("integration"):
        return
    nodeid = request.node.nodeid

    def refuse(*_args: object, **_kwargs: object) -> None:
        pytest.fail(f"{nodeid} starts a process: mark it `integration`", pytrace=False)

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


# ------------------------------------------------------------------ logs and environment
def _monotonic_s(_logger: WrappedLogger, _method: str, line: EventDict) -> EventDict:
    line["monotonic_s"] = time.monotonic()
    return line


@pytest.fixture
def captured_logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """Every line logged through structlog during the test, as a dict: `event`, `log_level`,
    `monotonic_s` (when, by `time.monotonic()`) and the fields (`daemons.logged()` picks them
    out). Loggers must be made (`structlog.get_logger()`, a `Daemon`) inside the test. Every
    level is captured: structlog's configuration is reset first (an in-process `edgemon demo`
    sets its own), and again after the test."""
    structlog.reset_defaults()
    try:
        with capture_logs(processors=[_monotonic_s]) as logs:
            yield logs
    finally:
        structlog.reset_defaults()


@pytest.fixture(autouse=True)
def own_xdg_state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon started by a test without a state directory falls back to
    `$XDG_STATE_HOME/edgemon` (docs/reliability.md): each test gets its own, never the user's."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))


# ------------------------------------------------------------------ mosquitto_broker
class _WorkerMosquitto:
    """The one Mosquitto of this pytest process (an xdist worker, or the whole run) that the
    tests using `mosquitto_broker` share, and the tags that make each test's topics and
    client ids its own."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.process = process
        self.port = port
        self.log = log
        self._tags = itertools.count(1)

    def next_tag(self) -> str:
        """A tag no other test of this process had: `t1`, `t2`, ..."""
        return f"t{next(self._tags)}"

    def check_running(self, when: str) -> None:
        """Fail, showing its log, if the shared Mosquitto has exited (`when`: before or
        during the test)."""
        code = self.process.poll()
        if code is not None:
            text = self.log.read_text(encoding="utf-8", errors="replace")[-3000:]
            pytest.fail(f"the worker's shared Mosquitto exited ({code}) {when}; its log:\n{text}")


@pytest.fixture(scope="session")
def _worker_mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_WorkerMosquitto]:
    """One Mosquitto for the whole session of this process (session scope is per worker
    under pytest-xdist): anonymous, without persistence, on 127.0.0.1 and a free port, its
    log in the session's `mosquitto/mosquitto.log`. Stopped when the session ends."""
    require_tool("mosquitto")
    directory = tmp_path_factory.mktemp("mosquitto")
    try:
        process, (port,) = launch_mosquitto(directory, lambda ports: plain_listener(ports[0]))
    except MosquittoStartError as error:
        pytest.fail(str(error))
    try:
        yield _WorkerMosquitto(process, port, directory / "mosquitto.log")
    finally:
        end_process(process)


@pytest.fixture
def mosquitto_broker(_worker_mosquitto: _WorkerMosquitto) -> Iterator[Broker]:
    """The worker's shared Mosquitto (anonymous, no persistence; started once per worker),
    as a `Broker` that is this test's own: its topic prefix `tN/edgemon/v1` and its client
    ids `tN-...` (`Broker.client_id`) are no other test's, so the test sees no other test's
    retained or live messages, and no session of theirs, provided every client and topic it
    uses comes from the `Broker` (`settings_for(broker)`, `broker.topic(...)`, ...).

    A test that needs a broker to itself (reads its log, stops it, counts on broker-wide state
    or configures it) takes `private_broker`. Skips the test when Mosquitto is not installed
    (fails it under `EDGEMON_REQUIRE_TOOLS=1`); fails it when the shared broker has exited.
    """
    shared = _worker_mosquitto
    shared.check_running("before this test")
    tag = shared.next_tag()
    yield Broker("127.0.0.1", shared.port, prefix=f"{tag}/{TOPIC_PREFIX}", tag=f"{tag}-")
    shared.check_running("during this test")


@pytest.fixture
def private_broker(tmp_path: Path) -> Iterator[Broker]:
    """A fresh Mosquitto of the test's own on 127.0.0.1 and a free port, with edgemon's
    default topic prefix and client ids as given (`Broker`).

    Anonymous, no persistence, so no retained message survives the test. Skips the test when
    Mosquitto is not installed (fails it under `EDGEMON_REQUIRE_TOOLS=1`); its log is in
    `tmp_path / "mosquitto.log"`.
    """
    require_tool("mosquitto")
    with _mosquitto(tmp_path, lambda ports: plain_listener(ports[0])) as broker:
        yield broker


@contextmanager
def _mosquitto(tmp_path: Path, config: Callable[[Sequence[int]], str]) -> Iterator[Broker]:
    """A Mosquitto with one listener, configured by `config(ports)`, for the block."""
    try:
        process, (port,) = launch_mosquitto(tmp_path, config)
    except MosquittoStartError as error:
        pytest.fail(str(error))
    try:
        yield Broker("127.0.0.1", port)
    finally:
        end_process(process)


# ------------------------------------------------------------------ subscriptions_denied_broker
#: Mosquitto's dynamic security plugin (Debian's `mosquitto` ships it). Its ACL refuses a
#: subscription in the SUBACK; Mosquitto 2.0's `acl_file` grants every subscription and only
#: withholds the messages, so no client can tell.
DYNSEC = Path("/usr/lib/x86_64-linux-gnu/mosquitto_dynamic_security.so")
#: Anonymous clients may subscribe to edgemon's statuses and the devices' events and engine
#: objects, and to nothing else (throttle and capacity topics are refused).
SOME_SUBSCRIPTIONS = {
    "defaultACLAccess": {
        "publishClientSend": True, "publishClientReceive": True,
        "subscribe": False, "unsubscribe": True,
    },
    "clients": [],
    "groups": [{"groupname": "anonymous", "roles": [{"rolename": "some"}], "clients": []}],
    "roles": [{"rolename": "some", "acls": [
        {"acltype": "subscribePattern", "topic": "edgemon/v1/_edgemon/+/status", "allow": True},
        {"acltype": "subscribePattern", "topic": "edgemon/v1/+/events", "allow": True},
        {"acltype": "subscribePattern", "topic": "edgemon/v1/+/engine", "allow": True},
    ]}],
    "anonymousGroup": "anonymous",
}  # fmt: skip


@pytest.fixture
def subscriptions_denied_broker(tmp_path: Path) -> Iterator[Broker]:
    """A Mosquitto of the test's own whose ACL (dynamic security) lets anonymous clients
    subscribe to edgemon's statuses, events and engine topics (under the default prefix) and
    refuses every other subscription in its SUBACK (0x80): a throttle or capacity filter is
    refused."""
    require_tool("mosquitto")
    assert DYNSEC.is_file(), f"{DYNSEC} is missing (Debian's mosquitto package ships it)"
    acl = tmp_path / "dynsec.json"
    acl.write_text(json.dumps(SOME_SUBSCRIPTIONS), encoding="utf-8")
    plugin = f"plugin {DYNSEC}\nplugin_opt_config_file {acl}\n{RUN_AS_ROOT}"
    with _mosquitto(tmp_path, lambda ports: plain_listener(ports[0]) + plugin) as address:
        yield address


# ------------------------------------------------------------------ any_broker
#: The MQTT brokers the daemon's broker tests run against: Mosquitto (Debian's) and amqtt
#: (the embedded broker, `edgemon[embedded]`).
BROKERS = ("mosquitto", "amqtt")


@pytest.fixture(params=BROKERS)
def any_broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Broker]:
    """Each broker in turn (the test runs once per broker; its id says which), fresh on
    127.0.0.1 and a free port, anonymous and without persistence, with edgemon's default
    topic prefix. `request.param` names it, so a test can mark what one of them does not do.
    Each is the test's own (`private_broker` for Mosquitto): these tests hold the two brokers
    to the same rules from the same blank start, and amqtt is started for each test."""
    if request.param == "mosquitto":
        yield request.getfixturevalue("private_broker")
        return
    pytest.importorskip("amqtt", reason="the embedded extra is not installed")
    try:
        process = launch_amqtt(tmp_path / "amqtt.log", port := free_port(), accepts)
    except AmqttStartError as error:
        pytest.fail(str(error))
    try:
        yield Broker("127.0.0.1", port)
    finally:
        end_process(process)


# ------------------------------------------------------------------ mosquitto_server
@pytest.fixture
def mosquitto_server(tmp_path: Path) -> Iterator[MosquittoServer]:
    """A running Mosquitto (anonymous, no persistence) that the test may stop and restart."""
    server = MosquittoServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


# ------------------------------------------------------------------ servers
@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    """A group of named processes the test starts (`servers.spawn(name, *argv)`), logging to
    `tmp_path / "<name>.log"`, all ended when the test ends. `NOTIFY_SOCKET` and `WATCHDOG_*`
    are left out of their environment (no child talks to a service manager it does not have)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
    group = Servers(tmp_path, env)
    try:
        yield group
    finally:
        group.stop_all()
