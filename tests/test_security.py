"""Security (docs/runbook.md, docs/reliability.md): MQTT over TLS and with a password from a
file, against a real Mosquitto and a throw-away CA made here by `openssl`; HTTP with TLS and
basic auth through the real daemon; secrets that never show; SIGHUP reloading a real
`edgemon run` process; the clients' TLS, client certificates and password files."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import aiomqtt
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edgemon.client import Reporter, ThrottleGate
from edgemon.daemon import Daemon
from edgemon.settings import HttpSettings, MqttSettings, Settings, StateSettings

from brokers import RUN_AS_ROOT, Broker, MosquittoStartError, launch_mosquitto
from daemons import logged, running
from pki import Pki, make_pki
from ports import end_process
from scrapes import sample
from tools import require_tool

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator, Mapping, MutableMapping, Sequence

pytestmark = pytest.mark.integration

P = "edgemon/v1"
#: A state directory that cannot exist: in-process daemons take no snapshots.
NO_STATE = Path(os.devnull) / "edgemon-state"
#: How long a refused daemon may take for its attempts with backoff (0.25–0.5 s, then 0.5–1 s
#: before the second and third): only waited in full when a test fails; a loaded machine.
REFUSED_WATCH_S = 30.0
#: paho-mqtt 2.2 does not close its socket when the TLS handshake fails (`_ssl_wrap_socket`);
#: the garbage collector closes it, with a ResourceWarning. Not edgemon's leak, but reported.
PAHO_TLS_SOCKET_LEAK = pytest.mark.filterwarnings(
    "ignore:Exception ignored in.*ssl.SSLSocket:pytest.PytestUnraisableExceptionWarning"
)


# ---------------------------------------------------------------------- a throw-away CA
@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A throw-away PKI made by `openssl` (EC P-256 keys: fast to make)."""
    return make_pki(tmp_path_factory.mktemp("pki"))


# ---------------------------------------------------------------------- a configurable Mosquitto


@dataclass(frozen=True)
class Ports:
    """`devices`: a plain anonymous listener for the test's devices and watchers;
    `edgemon`: the listener under test."""

    devices: int
    edgemon: int


@contextlib.contextmanager
def mosquitto(directory: Path, edgemon_listener: str) -> Iterator[Ports]:
    """A Mosquitto with per-listener settings: an anonymous plain listener for the test's own
    clients, and one for edgemon configured by `edgemon_listener` (Mosquitto config lines)."""
    require_tool("mosquitto")
    try:
        process, (devices, edgemon) = launch_mosquitto(
            directory,
            lambda ports: (
                f"per_listener_settings true\npersistence false\nlog_dest stderr\n{RUN_AS_ROOT}"
                f"listener {ports[0]} 127.0.0.1\nallow_anonymous true\n"
                f"listener {ports[1]} 127.0.0.1\n{edgemon_listener}\n"
            ),
            listeners=2,
            name="mosquitto-security",
        )
    except MosquittoStartError as error:
        pytest.fail(str(error))
    try:
        yield Ports(devices, edgemon)
    finally:
        end_process(process)


def tls_listener(pki: Pki, *extra: str) -> str:
    return "\n".join(
        [
            f"cafile {pki.ca}",
            f"certfile {pki.server_cert}",
            f"keyfile {pki.server_key}",
            "allow_anonymous true",
            *extra,
        ]
    )


def mosquitto_password_file(path: Path, user: str, password: str) -> Path:
    """A Mosquitto password file made by `mosquitto_passwd -b -c`."""
    subprocess.run(
        [require_tool("mosquitto_passwd"), "-b", "-c", str(path), user, password],
        check=True, capture_output=True, timeout=10,
    )  # fmt: skip
    path.chmod(0o600)
    return path


def secret_file(path: Path, text: str) -> Path:
    path.write_text(text + "\n", encoding="utf-8")
    path.chmod(0o600)
    return path


# ---------------------------------------------------------------------- the daemon, in-process
def mqtt_settings(url: str, **fields: Any) -> MqttSettings:
    return MqttSettings(url=url, client_id=f"edgemon-sec-{time.monotonic_ns()}", **fields)


@contextlib.asynccontextmanager
async def started(
    mqtt: MqttSettings,
    *,
    http: HttpSettings | None = None,
    ready: bool = True,
    logs: Sequence[Mapping[str, Any]] = (),
) -> AsyncIterator[Daemon]:
    """Run a daemon for the block (expecting it subscribed within 5 s when `ready`, else its
    HTTP server listening), then stop it as SIGTERM does and expect exit code 0 within 6 s.
    `logs`, the captured lines, are shown if it fails."""
    settings = Settings(
        mqtt=mqtt,
        http=http or HttpSettings(listen="127.0.0.1:0"),
        state=StateSettings(dir=NO_STATE),
    )
    daemon = Daemon(settings, environ={}, install_signal_handlers=False)
    async with running(daemon, until="ready" if ready else "http", stop_within_s=6, logs=logs):
        yield daemon


async def get(
    url: str,
    *,
    auth: tuple[str, str] | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> tuple[int, str, dict[str, str]]:
    headers = {}
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers=headers, ssl=ssl_context or True) as response,
    ):
        return response.status, await response.text(), dict(response.headers)


def now_ms() -> float:
    return time.time() * 1000.0


async def expect_throttle(devices_port: int, device_id: str) -> dict[str, Any]:
    """Publish a starving chunk for `device_id` from the devices' listener; return the throttle
    object edgemon publishes for it (proof that it is subscribed and processing)."""
    async with aiomqtt.Client("127.0.0.1", devices_port) as client:
        await client.subscribe(f"{P}/{device_id}/throttle", qos=1)
        event = {"type": "chunk", "stream": "s", "t_ms": now_ms(), "seq": 0, "audio_ms": 30}
        await client.publish(f"{P}/{device_id}/events", json.dumps(event), qos=1)
        async with asyncio.timeout(3):
            async for message in client.messages:
                assert isinstance(message.payload, bytes)
                obj: dict[str, Any] = json.loads(message.payload)
                return obj
    raise AssertionError("unreachable")  # pragma: no cover


async def assert_refused_and_retrying(
    daemon: Daemon,
    logs: Sequence[Mapping[str, Any]],
    error: str,
    within_s: float = REFUSED_WATCH_S,
) -> None:
    """Once two attempts have failed (within `within_s`): never subscribed, `/readyz` 503,
    `edgemon_mqtt_connected 0`, the daemon alive, each failure naming `error`, the attempts
    spaced by backoff."""
    async with asyncio.timeout(within_s):
        while len(logged(logs, "mqtt_connect_failed")) < 2:  # noqa: ASYNC110 - captured logs
            await asyncio.sleep(0.02)
    assert not daemon.ready.is_set()
    base = f"http://127.0.0.1:{daemon.http_port}"
    status, body, _ = await get(f"{base}/readyz")
    assert (status, body) == (503, "not ready: not connected to the MQTT broker\n")
    _, metrics, _ = await get(f"{base}/metrics")
    assert sample(metrics, "edgemon_mqtt_connected") == 0.0
    assert (await get(f"{base}/healthz"))[0] == 200
    failures = logged(logs, "mqtt_connect_failed")
    assert len(failures) >= 2, logs
    assert all(error in failure["error"] for failure in failures), failures
    delays = [fields["delay_s"] for fields in logged(logs, "mqtt_reconnect_scheduled")]
    for attempt, delay in enumerate(delays):  # Backoff(first 0.5 s): 0.5·2ⁿ × [0.5, 1]
        assert 0.25 * 2**attempt - 1e-3 <= delay <= 0.5 * 2**attempt + 1e-3, delays


# ---------------------------------------------------------------------- 1. MQTT over TLS
@pytest.mark.asyncio
async def test_mqtts_with_the_right_ca_connects_and_processes(pki: Pki, tmp_path: Path) -> None:
    """`mqtts://127.0.0.1` with `ca_file` set to the CA that signed Mosquitto's certificate:
    edgemon verifies the broker (name by IP SAN), subscribes, and answers a starving chunk with
    a throttle object; `/readyz` 200 and `edgemon_mqtt_connected 1`."""
    with mosquitto(tmp_path, tls_listener(pki)) as ports:
        mqtt = mqtt_settings(f"mqtts://127.0.0.1:{ports.edgemon}", ca_file=pki.ca)
        async with started(mqtt) as daemon:
            throttle = await expect_throttle(ports.devices, "tls1")
            base = f"http://127.0.0.1:{daemon.http_port}"
            assert (await get(f"{base}/readyz"))[0] == 200
            _, metrics, _ = await get(f"{base}/metrics")
    assert throttle["throttle"] is True
    assert throttle["device"] == "tls1"
    assert sample(metrics, "edgemon_mqtt_connected") == 1.0
    assert sample(metrics, "edgemon_chunks_total", {"device": "tls1"}) == 1.0


@pytest.mark.asyncio
async def test_mqtts_with_a_wrong_ca_is_refused_and_retried(
    pki: Pki, tmp_path: Path, captured_logs: list[MutableMapping[str, Any]]
) -> None:
    """With a CA that did not sign the broker's certificate the TLS handshake fails
    (certificate verify failed): never connected, `/readyz` 503, `edgemon_mqtt_connected 0`,
    and the daemon keeps retrying with backoff without crashing; it stops cleanly."""
    with mosquitto(tmp_path, tls_listener(pki)) as ports:
        mqtt = mqtt_settings(f"mqtts://127.0.0.1:{ports.edgemon}", ca_file=pki.other_ca)
        async with started(mqtt, ready=False, logs=captured_logs) as daemon:
            await assert_refused_and_retrying(daemon, captured_logs, "CERTIFICATE_VERIFY_FAILED")


@pytest.mark.asyncio
async def test_mqtts_without_a_ca_file_uses_the_system_cas(
    pki: Pki, tmp_path: Path, captured_logs: list[MutableMapping[str, Any]]
) -> None:
    """Without `ca_file` the system CAs are used: a broker certificate from a private CA is
    refused (no silent fallback to an unverified connection)."""
    with mosquitto(tmp_path, tls_listener(pki)) as ports:
        mqtt = mqtt_settings(f"mqtts://127.0.0.1:{ports.edgemon}")
        async with started(mqtt, ready=False, logs=captured_logs) as daemon:
            await assert_refused_and_retrying(daemon, captured_logs, "CERTIFICATE_VERIFY_FAILED")


def client_certificate_listener(pki: Pki) -> str:
    return tls_listener(pki, "require_certificate true", "use_identity_as_username true")


@pytest.mark.asyncio
async def test_mqtts_client_certificate(pki: Pki, tmp_path: Path) -> None:
    """A listener with `require_certificate true` and `use_identity_as_username true`:
    edgemon with the client certificate and key connects (as the certificate's CN) and
    processes events; the same settings without them never get a session (`/readyz` 503,
    `edgemon_mqtt_connected 0`), the broker saying why, and the daemon stays up."""
    with mosquitto(tmp_path, client_certificate_listener(pki)) as ports:
        url = f"mqtts://127.0.0.1:{ports.edgemon}"
        with_cert = mqtt_settings(
            url, ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key
        )
        async with started(with_cert):
            throttle = await expect_throttle(ports.devices, "tls2")
        assert throttle["throttle"] is True
        broker_log = tmp_path / "mosquitto-security.log"
        async with started(mqtt_settings(url, ca_file=pki.ca), ready=False) as daemon:
            async with asyncio.timeout(REFUSED_WATCH_S):  # the broker refused an attempt
                while "peer did not return a certificate" not in broker_log.read_text():  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            assert not daemon.ready.is_set()
            base = f"http://127.0.0.1:{daemon.http_port}"
            assert (await get(f"{base}/readyz"))[0] == 503
            assert sample((await get(f"{base}/metrics"))[1], "edgemon_mqtt_connected") == 0.0
    broker_text = broker_log.read_text()
    assert "u'edgemon-client'" in broker_text  # the certificate's CN became the user name


@pytest.mark.asyncio
async def test_refused_client_certificate_is_retried_with_backoff(
    pki: Pki, tmp_path: Path, captured_logs: list[MutableMapping[str, Any]]
) -> None:
    """Without the required client certificate the attempt fails at once and is retried
    with backoff (as with a wrong CA): two failed attempts within 8 s (backoff needs at most
    1.5 s; an attempt that waited for the 10 s connect timeout would make one), and a stop is
    clean (no `shutdown_cancelled`). The TLS 1.3 alert that refuses the certificate is read
    with the CONNACK: it must end the attempt at once."""
    with mosquitto(tmp_path, client_certificate_listener(pki)) as ports:
        url = f"mqtts://127.0.0.1:{ports.edgemon}"
        refused = mqtt_settings(url, ca_file=pki.ca)
        async with started(refused, ready=False, logs=captured_logs) as daemon:
            await assert_refused_and_retrying(daemon, captured_logs, "", within_s=8.0)
        assert logged(captured_logs, "shutdown_cancelled") == []


@pytest.mark.asyncio
async def test_mqtt_password_from_a_file(
    tmp_path: Path, captured_logs: list[MutableMapping[str, Any]]
) -> None:
    """`username` + `password_file` against `allow_anonymous false` and a `mosquitto_passwd`
    file: the right password (file ends in a newline, stripped) connects and events flow; a
    wrong one is refused (CONNACK not authorised) and retried with growing delays."""
    broker_passwords = mosquitto_password_file(tmp_path / "passwd", "edgemon", "right horse")
    listener = f"allow_anonymous false\npassword_file {broker_passwords}"
    right = secret_file(tmp_path / "right", "right horse")
    wrong = secret_file(tmp_path / "wrong", "wrong horse")
    with mosquitto(tmp_path, listener) as ports:
        url = f"mqtt://127.0.0.1:{ports.edgemon}"
        async with started(mqtt_settings(url, username="edgemon", password_file=right)):
            throttle = await expect_throttle(ports.devices, "pw1")
        assert throttle["throttle"] is True
        refused = mqtt_settings(url, username="edgemon", password_file=wrong)
        captured_logs.clear()  # the lines of the refused daemon only
        async with started(refused, ready=False, logs=captured_logs) as daemon:
            await assert_refused_and_retrying(daemon, captured_logs, "")
    reasons = " ".join(failure["error"] for failure in logged(captured_logs, "mqtt_connect_failed"))
    assert "authori" in reasons.lower() or "password" in reasons.lower(), reasons


@pytest.mark.asyncio
async def test_unreadable_password_file_at_a_reconnect_is_retried(
    tmp_path: Path, captured_logs: list[MutableMapping[str, Any]]
) -> None:
    """The password file is read again on each attempt; if it is missing or empty at one
    (removed, or caught mid-rotation) the attempt fails like a refused one: logged
    (`mqtt_credentials_unreadable`, naming the setting), retried with backoff (twice at
    least), never subscribed, and the daemon keeps running."""
    broker_passwords = mosquitto_password_file(tmp_path / "passwd", "edgemon", "right")
    password = secret_file(tmp_path / "mqtt-password", "wrong")
    with mosquitto(tmp_path, f"allow_anonymous false\npassword_file {broker_passwords}") as ports:
        url = f"mqtt://127.0.0.1:{ports.edgemon}"
        refused = mqtt_settings(url, username="edgemon", password_file=password)
        async with started(refused, ready=False, logs=captured_logs) as daemon:
            async with asyncio.timeout(3):
                while not logged(captured_logs, "mqtt_connect_failed"):  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            password.unlink()
            async with asyncio.timeout(REFUSED_WATCH_S):
                while len(logged(captured_logs, "mqtt_credentials_unreadable")) < 2:  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            unreadable = logged(captured_logs, "mqtt_credentials_unreadable")
            assert all(
                any("mqtt.password_file" in problem for problem in line["problems"])
                for line in unreadable
            ), unreadable
            assert not daemon.ready.is_set()
            assert logged(captured_logs, "daemon_failed") == []
            assert (await get(f"http://127.0.0.1:{daemon.http_port}/healthz"))[0] == 200
            assert (await get(f"http://127.0.0.1:{daemon.http_port}/readyz"))[0] == 503


# ---------------------------------------------------------------------- 2. HTTP: TLS, basic auth
@pytest.mark.asyncio
async def test_http_tls_and_basic_auth_through_the_daemon(
    pki: Pki, tmp_path: Path, mosquitto_broker: Broker
) -> None:
    """The daemon's HTTP endpoint with `cert_file`/`key_file` and basic auth (password from a
    file): over HTTPS verified by the CA, `/metrics`, `/readyz` and `/api/v1/streams` answer
    401 with a challenge to no, wrong-password and wrong-user credentials and 200 to the
    right ones; `/healthz` answers 200 without credentials (a liveness probe carries none);
    plain HTTP to the TLS port and HTTPS without trusting the CA both fail."""
    broker = mosquitto_broker
    password = "correct horse:battery staple"  # a colon in the password is allowed
    http = HttpSettings(
        listen="127.0.0.1:0",
        cert_file=pki.server_cert,
        key_file=pki.server_key,
        basic_auth_user="scraper",
        basic_auth_password_file=secret_file(tmp_path / "http-password", password),
    )
    trust = ssl.create_default_context(cafile=str(pki.ca))
    mqtt = mqtt_settings(broker.url, topic_prefix=broker.prefix)
    async with started(mqtt, http=http) as daemon:
        base = f"https://127.0.0.1:{daemon.http_port}"
        for path in ("/metrics", "/readyz", "/api/v1/streams"):
            wrong = [None, ("scraper", "wrong"), ("root", password), ("scraper", password[:-1])]
            for auth in wrong:
                status, _, headers = await get(base + path, auth=auth, ssl_context=trust)
                assert status == 401, (path, auth)
                assert headers["WWW-Authenticate"].startswith('Basic realm="edgemon"')
            assert (await get(base + path, auth=("scraper", password), ssl_context=trust))[0] == 200
        assert (await get(base + "/healthz", ssl_context=trust))[:2] == (200, "ok\n")
        with pytest.raises(aiohttp.ClientError):
            await get(f"http://127.0.0.1:{daemon.http_port}/healthz")
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await get(base + "/healthz")  # the system CAs do not know the test CA


# ---------------------------------------------------------------------- edgemon run, a process
def clean_environ() -> dict[str, str]:
    """This environment without EDGEMON_ variables (the process sees only its file)."""
    return {name: value for name, value in os.environ.items() if not name.startswith("EDGEMON_")}


class DaemonProcess:
    """`python -m edgemon run --config CONFIG ...`, stdout (JSON log lines) and stderr in files."""

    def __init__(self, directory: Path, config: Path, *args: str) -> None:
        self.stdout = directory / "daemon.stdout"
        self.stderr = directory / "daemon.stderr"
        with self.stdout.open("wb") as out, self.stderr.open("wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "edgemon", "run", "--config", str(config), *args],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=clean_environ(),
            )  # fmt: skip

    def lines(self) -> list[dict[str, Any]]:
        """The log so far, one object per JSON line (a line being written is left out)."""
        lines = []
        for text in self.stdout.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                lines.append(json.loads(text))
        return lines

    def events(self, name: str) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line.get("event") == name]

    async def until(self, name: str, count: int = 1, within_s: float = 10.0) -> dict[str, Any]:
        """The `count`-th log line with event `name`, waiting for it."""
        async with asyncio.timeout(within_s):
            while len(found := self.events(name)) < count:
                assert self.process.poll() is None, self.output()
                await asyncio.sleep(0.03)
        return found[count - 1]

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    async def stop(self) -> int:
        """SIGTERM, then its exit code (killed after 8 s)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return await asyncio.to_thread(self.process.wait, 8)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()

    def output(self) -> str:
        return self.stdout.read_text(encoding="utf-8") + self.stderr.read_text(encoding="utf-8")


def check_config(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgemon", "check-config", *args],
        capture_output=True, text=True, encoding="utf-8", env=clean_environ(),
        check=False, timeout=30,
    )  # fmt: skip


async def publish(broker: Broker, device_id: str, *payloads: bytes | dict[str, Any]) -> None:
    async with aiomqtt.Client(broker.host, broker.port) as client:
        for payload in payloads:
            body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            await client.publish(broker.topic(device_id, "events"), body, qos=1)


def chunk_event(stream: str, seq: int, audio_ms: float, eta_ms: float = 50.0) -> dict[str, Any]:
    return {
        "type": "chunk", "stream": stream, "t_ms": now_ms(), "seq": seq,
        "audio_ms": audio_ms, "eta_ms": eta_ms,
    }  # fmt: skip


# ---------------------------------------------------------------------- 3. secrets never appear
@pytest.mark.asyncio
async def test_secrets_never_appear(tmp_path: Path) -> None:
    """A real `edgemon run` with an MQTT password file and an HTTP basic-auth password file
    holding unique markers, exercised end to end: a first connection refused (the file held a
    wrong password, then the right one: the file is read again on each attempt), events, a
    throttle, rejected messages, HTTP requests with wrong and right credentials, a SIGHUP
    reload, a SIGHUP with the password written into the config (refused), a clean stop. No
    marker appears in the log (debug level, JSON), stderr, the `--record` trace, the state
    directory, `/api/v1/streams`, `/metrics`, `/readyz`, or `check-config` (text, `--json`,
    and its errors for the config holding a password)."""
    mqtt_secret = f"mqtt-marker-{os.urandom(8).hex()}"
    wrong_secret = f"wrong-marker-{os.urandom(8).hex()}"
    http_secret = f"http-marker-{os.urandom(8).hex()}"
    markers = (mqtt_secret, wrong_secret, http_secret)
    broker_passwords = mosquitto_password_file(tmp_path / "passwd", "edgemon", mqtt_secret)
    mqtt_password = secret_file(tmp_path / "mqtt-password", wrong_secret)
    secret_file(tmp_path / "http-password", http_secret)
    (tmp_path / "state").mkdir()
    seen: list[str] = []  # every text a client of edgemon got to see
    with mosquitto(tmp_path, f"allow_anonymous false\npassword_file {broker_passwords}") as ports:
        config_text = (
            f'[mqtt]\nurl = "mqtt://127.0.0.1:{ports.edgemon}"\nclient_id = "secrets"\n'
            'username = "edgemon"\npassword_file = "mqtt-password"\n'
            '[http]\nlisten = "127.0.0.1:0"\nbasic_auth_user = "scraper"\n'
            'basic_auth_password_file = "http-password"\n'
            '[log]\nformat = "json"\nlevel = "debug"\n'
            f'[state]\ndir = "{tmp_path / "state"}"\nsnapshot_interval_s = 0.2\n'
        )
        config = tmp_path / "edgemon.toml"
        config.write_text(config_text, encoding="utf-8")
        config.chmod(0o600)
        daemon = DaemonProcess(tmp_path, config, "--record", str(tmp_path / "trace.jsonl"))
        try:
            http_port = (await daemon.until("http_listening"))["port"]
            await daemon.until("mqtt_connect_failed")
            # Rotated as an operator should: a new file renamed over the old one.
            secret_file(tmp_path / "mqtt-password.new", mqtt_secret).replace(mqtt_password)
            await daemon.until("mqtt_subscribed")
            await publish(
                Broker("127.0.0.1", ports.devices), "sec1",
                {"type": "start", "stream": "s", "t_ms": now_ms()},
                chunk_event("s", 0, 30),  # starving: throttle on
                b"{not json", {"type": "chunk", "stream": "s"},
            )  # fmt: skip
            await daemon.until("throttle_changed")
            await daemon.until("message_rejected")
            base = f"http://127.0.0.1:{http_port}"
            for path in ("/api/v1/streams", "/metrics", "/readyz", "/healthz"):
                for auth in (("scraper", http_secret), ("scraper", wrong_secret), None):
                    _, body, headers = await get(base + path, auth=auth)
                    seen += [body, json.dumps(headers)]
            _, body, _ = await get(base + "/api/v1/streams", auth=("scraper", http_secret))
            streams = json.loads(body)
            assert [d["device"] for d in streams["devices"]] == ["sec1"]
            config.write_text(config_text + "[slack]\ndefault_margin_ms = 90\n", encoding="utf-8")
            daemon.signal(signal.SIGHUP)
            await daemon.until("config_reloaded")
            config.write_text(
                config_text.replace("[http]", f'password = "{mqtt_secret}"\n[http]'),
                encoding="utf-8",
            )
            daemon.signal(signal.SIGHUP)
            failed = await daemon.until("config_reload_failed")
            assert failed["problems"][0].startswith("mqtt.password: secrets are not read")
            # A periodic snapshot after all of that (the log is at debug level).
            await daemon.until("snapshot_written", len(daemon.events("snapshot_written")) + 1)
            assert await daemon.stop() == 0
        finally:
            await daemon.stop()
        refused = check_config(str(config))
        config.write_text(config_text, encoding="utf-8")
        text, as_json = check_config(str(config)), check_config(str(config), "--json")
    assert refused.returncode == 2
    assert text.returncode == as_json.returncode == 0, text.stderr + as_json.stderr
    assert json.loads(as_json.stdout)["http"]["basic_auth_user"] == "scraper"
    log = daemon.output()
    for event in ("mqtt_connect_failed", "mqtt_subscribed", "message_rejected", "config_reloaded"):
        assert f'"event": "{event}"' in log, event
    texts = {
        "daemon log and stderr": log,
        "trace": (tmp_path / "trace.jsonl").read_text(encoding="utf-8"),
        "state": "".join(f.read_text(encoding="utf-8") for f in (tmp_path / "state").iterdir()),
        "http": "\n".join(seen),
        "check-config": text.stdout + text.stderr + as_json.stdout + as_json.stderr,
        "check-config error": refused.stdout + refused.stderr,
    }
    assert texts["trace"].count("\n") >= 4
    assert texts["state"]
    for where, content in texts.items():
        for marker in markers:
            assert marker not in content, f"a secret is shown in the {where}"


def loose_config(tmp_path: Path, broker: Broker) -> Path:
    """A config for `broker` whose two password files are readable by everyone and which
    everyone may change (mode 0666)."""
    secret_file(tmp_path / "mqtt-password", "pw").chmod(0o644)
    secret_file(tmp_path / "http-password", "pw").chmod(0o644)
    config = tmp_path / "edgemon.toml"
    config.write_text(
        f'[mqtt]\nurl = "{broker.url}"\nclient_id = "{broker.client_id("loose")}"\n'
        f'topic_prefix = "{broker.prefix}"\n'
        'username = "edgemon"\npassword_file = "mqtt-password"\n'
        '[http]\nlisten = "127.0.0.1:0"\nbasic_auth_user = "scraper"\n'
        'basic_auth_password_file = "http-password"\n[log]\nformat = "json"\n'
        f'[state]\ndir = "{tmp_path / "no-state"}"\n',
        encoding="utf-8",
    )
    config.chmod(0o666)
    return config


def test_check_config_warns_about_loose_permissions(tmp_path: Path) -> None:
    """`check-config` warns on stderr (exit 0: a warning, not an error) about each password
    file readable by group or others and about a config file others may write (the config
    holds no secret: anyone who can write it can redirect the daemon)."""
    config = loose_config(tmp_path, Broker("127.0.0.1", 1883))
    result = check_config(str(config))
    assert result.returncode == 0, result.stderr
    warnings = result.stderr.splitlines()
    assert len(warnings) == 4, warnings  # two secret files; the config: writable, readable
    assert "mqtt.password_file" in warnings[0]
    assert "readable by group or others (mode 0644)" in warnings[0]
    assert "http.basic_auth_password_file" in warnings[1]
    assert f"{config} is writable by group or others (mode 0666)" in warnings[2]
    for path in (config, tmp_path / "mqtt-password", tmp_path / "http-password"):
        path.chmod(0o600)
    assert check_config(str(config)).stderr == ""


@pytest.mark.asyncio
async def test_daemon_warns_about_loose_permissions_at_start(
    tmp_path: Path, mosquitto_broker: Broker
) -> None:
    """`edgemon run` with the same loose files logs the same warnings when it starts."""
    daemon = DaemonProcess(tmp_path, loose_config(tmp_path, mosquitto_broker))
    try:
        await daemon.until("mqtt_subscribed")
    finally:
        assert await daemon.stop() == 0
    log = daemon.output()
    assert "mqtt.password_file" in log
    assert "http.basic_auth_password_file" in log
    assert "readable by group or others" in log
    assert "writable by group or others" in log


# ---------------------------------------------------------------------- 4. SIGHUP
def reload_config(path: Path, broker: Broker, state_dir: Path, margin: str) -> None:
    path.write_text(
        f'[mqtt]\nurl = "{broker.url}"\nclient_id = "{broker.client_id("hup")}"\n'
        f'topic_prefix = "{broker.prefix}"\n'
        '[http]\nlisten = "127.0.0.1:0"\n[log]\nformat = "json"\n'
        f'[state]\ndir = "{state_dir}"\n[devices.devA]\nmargin_ms = {margin}\n',
        encoding="utf-8",
    )


def stream_table(view: dict[str, Any]) -> dict[tuple[str, str], tuple[float, int]]:
    """(device, stream) → (margin_ms, chunks)."""
    return {
        (device["device"], stream["stream"]): (stream["margin_ms"], stream["chunks"])
        for device in view["devices"]
        for stream in device["streams"]
    }


@pytest.mark.asyncio
async def test_sighup_reloads_margins_and_keeps_streams(
    tmp_path: Path, mosquitto_broker: Broker
) -> None:
    """A real `edgemon run` process: after the file's `[devices.devA] margin_ms` changes from
    100 to 250 and SIGHUP, `/api/v1/streams` shows 250 for devA and its streams, devB keeps
    the default 80, and all four streams are still there with their chunks. Then an invalid
    file (margin -5) and SIGHUP, then a TOML syntax error and SIGHUP: each time the log says
    why (`config_reload_failed` with the problem), the running config is kept (250), the
    streams are kept, and the process keeps running and answering."""
    broker = mosquitto_broker
    config = tmp_path / "edgemon.toml"
    reload_config(config, broker, tmp_path / "no-state", "100")
    daemon = DaemonProcess(tmp_path, config)
    try:
        http_port = (await daemon.until("http_listening"))["port"]
        await daemon.until("mqtt_subscribed")
        for device_id in ("devA", "devB"):
            await publish(
                broker, device_id,
                chunk_event("s1", 0, 60_000), chunk_event("s1", 1, 1_000),
                chunk_event("s2", 0, 60_000),
            )  # fmt: skip
        url = f"http://127.0.0.1:{http_port}/api/v1/streams"

        async def view() -> dict[tuple[str, str], tuple[float, int]]:
            status, body, _ = await get(url)
            assert status == 200
            return stream_table(json.loads(body))

        async with asyncio.timeout(5):
            while len(before := await view()) < 4:  # noqa: ASYNC110 - polling HTTP
                await asyncio.sleep(0.03)
        assert before == {
            ("devA", "s1"): (100.0, 2), ("devA", "s2"): (100.0, 1),
            ("devB", "s1"): (80.0, 2), ("devB", "s2"): (80.0, 1),
        }  # fmt: skip
        reload_config(config, broker, tmp_path / "no-state", "250")
        daemon.signal(signal.SIGHUP)
        await daemon.until("config_reloaded")
        after = await view()
        assert after == {
            ("devA", "s1"): (250.0, 2), ("devA", "s2"): (250.0, 1),
            ("devB", "s1"): (80.0, 2), ("devB", "s2"): (80.0, 1),
        }  # fmt: skip
        devices = json.loads((await get(url))[1])["devices"]
        assert {d["device"]: d["margin_ms"] for d in devices} == {"devA": 250.0, "devB": 80.0}
        for count, (margin, problem) in enumerate(
            [("-5", "devices.devA.margin_ms: must be ≥ 0"), ("= oops", "TOML syntax error")],
            start=1,
        ):
            reload_config(config, broker, tmp_path / "no-state", margin)
            daemon.signal(signal.SIGHUP)
            failed = await daemon.until("config_reload_failed", count)
            assert failed["source"] == str(config)
            assert any(problem in line for line in failed["problems"]), failed
            assert daemon.process.poll() is None
            assert await view() == after
            assert (await get(f"http://127.0.0.1:{http_port}/healthz"))[0] == 200
        assert len(daemon.events("config_reloaded")) == 1
    finally:
        assert await daemon.stop() == 0


# ---------------------------------------------------------------------- the clients
@PAHO_TLS_SOCKET_LEAK
def test_clients_over_tls_with_a_private_ca_and_a_client_certificate(
    pki: Pki, tmp_path: Path
) -> None:
    """The Reporter and the gate connect to a Mosquitto that requires a client certificate,
    trusting the private CA (`ca_file=`) and presenting `cert_file=`/`key_file=`; the
    Reporter's event arrives. Without the client certificate the broker refuses them."""
    with mosquitto(tmp_path, client_certificate_listener(pki)) as ports:
        url = f"mqtts://127.0.0.1:{ports.edgemon}"
        tls: dict[str, Any] = {
            "ca_file": pki.ca,
            "cert_file": pki.client_cert,
            "key_file": pki.client_key,
        }
        topic = f"{P}/tls3/events"
        with (
            probe_messages(ports.devices, topic) as seen,
            Reporter(url, "tls3", **tls) as reporter,
            ThrottleGate(url, "tls3", **tls) as gate,
        ):
            assert reporter.wait_connected(15)
            assert gate.wait_connected(15)
            reporter.chunk("s", audio_ms=40)
            assert reporter.flush(15)
            deadline = time.monotonic() + 15
            while not seen:
                assert time.monotonic() < deadline
                time.sleep(0.02)
        assert json.loads(seen[0])[0]["audio_ms"] == 40.0
        with Reporter(url, "tls3", ca_file=pki.ca) as refused:
            assert not refused.wait_connected(1.5)


def tls_password_listener(pki: Pki, passwords: Path) -> str:
    return "\n".join(
        [
            f"cafile {pki.ca}",
            f"certfile {pki.server_cert}",
            f"keyfile {pki.server_key}",
            "allow_anonymous false",
            f"password_file {passwords}",
        ]
    )


@PAHO_TLS_SOCKET_LEAK
def test_clients_with_a_username_and_a_password_file_over_tls(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`username=` + `password_file=` (the file ends in a newline, stripped) over TLS with a
    private CA: the Reporter connects; the gate does too from `EDGEMON_GATE_BROKER`,
    `EDGEMON_GATE_USERNAME`, `EDGEMON_GATE_PASSWORD_FILE` and `EDGEMON_GATE_CA_FILE`. A wrong
    password is refused and said ONCE as a warning by each client."""
    caplog.set_level(logging.DEBUG, logger="edgemon.client")
    passwords = mosquitto_password_file(tmp_path / "passwd", "player", "right horse")
    right = secret_file(tmp_path / "right", "right horse")
    wrong = secret_file(tmp_path / "wrong", "wrong horse")
    with mosquitto(tmp_path, tls_password_listener(pki, passwords)) as ports:
        url = f"mqtts://127.0.0.1:{ports.edgemon}"
        environ = {
            "EDGEMON_GATE_DEVICE": "pw1",
            "EDGEMON_GATE_BROKER": url,
            "EDGEMON_GATE_USERNAME": "player",
            "EDGEMON_GATE_PASSWORD_FILE": str(right),
            "EDGEMON_GATE_CA_FILE": str(pki.ca),
        }
        gate = ThrottleGate.from_environ(environ)
        assert gate is not None
        with (
            Reporter(url, "pw1", username="player", password_file=right, ca_file=pki.ca) as ok,
            gate,
        ):
            assert ok.wait_connected(15)
            assert gate.wait_connected(15)
        bad_gate = ThrottleGate.from_environ(environ | {"EDGEMON_GATE_PASSWORD_FILE": str(wrong)})
        assert bad_gate is not None
        with (
            Reporter(url, "pw2", username="player", password_file=wrong, ca_file=pki.ca) as bad,
            bad_gate,
        ):
            assert not bad.wait_connected(3.5)  # two attempts at least (1 s, then 2 s apart)
            assert not bad_gate.wait_connected(0.1)
    warnings = [r.message for r in caplog.records if r.levelno == logging.WARNING]
    assert len([w for w in warnings if w.startswith("edgemon reporter pw2")]) == 1, warnings
    assert len([w for w in warnings if w.startswith("edgemon gate pw1")]) == 1, warnings
    assert all("right horse" not in r.message for r in caplog.records)


def test_client_connection_options_refused_at_construction(pki: Pki, tmp_path: Path) -> None:
    """Mistakes in the connection options fail at construction, naming the option or the
    variable: TLS files without mqtts://, an unreadable file, a certificate without its key,
    an empty password file, a password file without a username."""
    empty = secret_file(tmp_path / "empty", "")
    for kwargs, fragment in (
        ({"broker_url": "mqtt://h", "ca_file": pki.ca}, "need an mqtts://"),
        ({"broker_url": "mqtts://h", "ca_file": tmp_path / "absent"}, "ca_file"),
        ({"broker_url": "mqtts://h", "cert_file": pki.client_cert}, "together"),
        ({"broker_url": "mqtt://h", "username": "u", "password_file": empty}, "empty"),
        ({"broker_url": "mqtt://h", "password_file": pki.ca}, "needs a username"),
    ):
        for client in (Reporter, ThrottleGate):
            args: dict[str, Any] = dict(kwargs)
            with pytest.raises(ValueError, match=fragment):
                client(args.pop("broker_url"), "d", **args)
    base = {"EDGEMON_GATE_DEVICE": "d", "EDGEMON_GATE_BROKER": "mqtt://h"}
    for extra, name in (
        ({"EDGEMON_GATE_CA_FILE": str(pki.ca)}, "EDGEMON_GATE_CA_FILE"),
        ({"EDGEMON_GATE_PASSWORD_FILE": str(pki.ca)}, "EDGEMON_GATE_PASSWORD_FILE"),
        (
            {"EDGEMON_GATE_USERNAME": "u", "EDGEMON_GATE_PASSWORD_FILE": str(empty)},
            "EDGEMON_GATE_PASSWORD_FILE",
        ),
    ):
        with pytest.raises(ValueError, match=f"^{name}: "):
            ThrottleGate.from_environ(base | extra)


@contextlib.contextmanager
def probe_messages(port: int, topic: str) -> Iterator[list[bytes]]:
    """The payloads published on `topic`, collected by a plain paho client on `port`."""
    seen: list[bytes] = []
    client = mqtt.Client(CallbackAPIVersion.VERSION2)
    client.on_connect = lambda c, *_: c.subscribe(topic, 1)
    client.on_message = lambda _c, _u, message: seen.append(bytes(message.payload))
    subscribed = threading.Event()
    client.on_subscribe = lambda *_: subscribed.set()
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        assert subscribed.wait(15)
        yield seen
    finally:
        client.disconnect()
        client.loop_stop()
