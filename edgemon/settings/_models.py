"""The settings models: one pydantic model per section of the config file (README)."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FilePath,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from edgemon.broker_url import Broker, BrokerUrlError, parse_broker_url
from edgemon.engine.config import (
    ClockMode,
    DeviceOverride,
    EngineConfig,
    Limits,
    PlayerModel,
    SlackPolicy,
    SloPolicy,
)
from edgemon.protocol import topic_prefix_problem
from edgemon.settings._errors import ConfigError, CrossFieldError

ENV_PREFIX = "EDGEMON_"
#: A device id, as in the topic `P/{device}/events` (docs/protocol.md).
DEVICE_ID_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"

NonNegativeMs = Annotated[float, Field(ge=0)]
PositiveMs = Annotated[float, Field(gt=0)]
Count = Annotated[int, Field(ge=1)]
NonEmpty = Annotated[str, Field(min_length=1)]
DeviceId = Annotated[str, Field(pattern=DEVICE_ID_PATTERN)]


def parse_mqtt_url(url: str) -> Broker:
    """`url` as the daemon takes it: `mqtt://host[:port]`, `mqtts://host[:port]` or
    `embedded`, no credentials in it (they are `mqtt.username` and `mqtt.password_file`).
    ValueError with the reason alone: the settings name the key and the value."""
    try:
        return parse_broker_url(url, url_credentials=False, embedded=True)
    except BrokerUrlError as exc:
        raise ValueError(exc.reason) from None


def default_client_id(hostname: str) -> str:
    """`edgemon-<host>`, the host name cut to its first label and to topic-safe characters
    (the client id is also a topic level of the status topic)."""
    host = re.sub(r"[^A-Za-z0-9_-]", "-", hostname.split(".", 1)[0])[:40].strip("-")
    return f"edgemon-{host}" if host else "edgemon"


def parse_listen(listen: str) -> tuple[str, int]:
    """`HOST:PORT` (an IPv6 host in brackets) as (host, port); port 0 picks a free one."""
    host, sep, port_text = listen.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError("must be HOST:PORT, e.g. 0.0.0.0:9857 or [::1]:9857")
    return host, int(port_text)


def _both_or_neither(first: str, a: object, second: str, b: object) -> list[tuple[str, str]]:
    if a is not None and b is None:
        return [(second, f"must be set together with {first}")]
    if b is not None and a is None:
        return [(first, f"must be set together with {second}")]
    return []


def _read_secret(key: str, value: SecretStr | None, path: Path | None) -> SecretStr | None:
    """The secret given directly (environment, flags), else its file's text minus the newline."""
    if value is not None or path is None:
        return value
    try:
        text = path.read_text(encoding="utf-8").rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError([f"{key}: cannot read {path}: {reason}"]) from None
    if not text:
        raise ConfigError([f"{key}: {path} is empty"])
    return SecretStr(text)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class MqttSettings(_Section):
    """`[mqtt]`: the broker connection and the topic layout."""

    url: str = "mqtt://127.0.0.1:1883"
    #: `edgemon-<host name>`: two instances on two boxes never share a session by default.
    client_id: NonEmpty = Field(default_factory=lambda: default_client_id(socket.gethostname()))
    username: NonEmpty | None = None
    #: From the environment or flags only; the file names `password_file` instead.
    password: SecretStr | None = None
    password_file: FilePath | None = None
    ca_file: FilePath | None = None
    cert_file: FilePath | None = None
    key_file: FilePath | None = None
    topic_prefix: str = "edgemon/v1"
    qos: int = 1
    persistent_session: bool = True
    #: The devices this instance owns (static partitioning): it subscribes to their topics
    #: only and never publishes a throttle for another. None: every device under the prefix.
    devices: Annotated[tuple[DeviceId, ...], Field(min_length=1)] | None = None
    keepalive_s: Annotated[int, Field(ge=1, le=65535)] = 30
    #: How often the retained `online` status is republished (a gate counts an instance not
    #: heard from for 3 heartbeats as offline).
    heartbeat_s: Annotated[float, Field(ge=0.1, le=3600)] = 5.0
    #: How often the slack feed (`P/{device}/slack`, QoS 0) may go out per device (ms); 0: never.
    feed_ms: Annotated[float, Field(ge=0, le=60_000)] = 150.0
    #: MQTT protocol version; "5" keeps the persistent session with a session expiry.
    protocol: Literal["3.1.1", "5"] = "3.1.1"
    #: MQTT 5: how long the broker keeps the session (and queues QoS 1 messages) while away.
    session_expiry_s: Annotated[int, Field(ge=0, le=2**32 - 1)] = 86_400

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        parse_mqtt_url(value)
        return value

    @field_validator("topic_prefix")
    @classmethod
    def _check_topic_prefix(cls, value: str) -> str:
        problem = topic_prefix_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("qos")
    @classmethod
    def _check_qos(cls, value: int) -> int:
        if value not in {0, 1}:
            raise ValueError("must be 0 or 1")
        return value

    @model_validator(mode="after")
    def _check_together(self) -> Self:
        problems = _both_or_neither("cert_file", self.cert_file, "key_file", self.key_file)
        tls_files = (self.ca_file, self.cert_file, self.key_file)
        if not self.broker.tls and any(f is not None for f in tls_files):
            problems.append(("url", "TLS files are set, so the url must be mqtts://"))
        has_password = self.password is not None or self.password_file is not None
        if has_password and self.username is None:
            problems.append(("username", "must be set when a password is"))
        if self.devices is not None and len(set(self.devices)) != len(self.devices):
            problems.append(("devices", "a device is listed twice"))
        if self.protocol == "5" and self.broker.embedded:
            problems.append(("protocol", "the embedded broker speaks MQTT 3.1.1 only"))
        if problems:
            raise CrossFieldError(problems)
        return self

    @property
    def broker(self) -> Broker:
        """The parsed `url`."""
        return parse_mqtt_url(self.url)

    def resolve_password(self) -> SecretStr | None:
        """`password` if given, else the content of `password_file`; read at call time."""
        return _read_secret("mqtt.password_file", self.password, self.password_file)


class HttpSettings(_Section):
    """`[http]`: the metrics and API endpoint."""

    listen: str = "0.0.0.0:9857"
    cert_file: FilePath | None = None
    key_file: FilePath | None = None
    basic_auth_user: NonEmpty | None = None
    #: From the environment or flags only; the file names `basic_auth_password_file` instead.
    basic_auth_password: SecretStr | None = None
    basic_auth_password_file: FilePath | None = None
    #: HAProxy's agent check (docs/fleet.md): HOST:PORT to answer it on; off when unset.
    agent_listen: str | None = None
    #: The device whose capacity the agent check answers for; unset: every device, summed.
    agent_device: DeviceId | None = None

    @field_validator("listen", "agent_listen")
    @classmethod
    def _check_listen(cls, value: str | None) -> str | None:
        if value is not None:
            parse_listen(value)
        return value

    @model_validator(mode="after")
    def _check_together(self) -> Self:
        problems = _both_or_neither("cert_file", self.cert_file, "key_file", self.key_file)
        has_password = (
            self.basic_auth_password is not None or self.basic_auth_password_file is not None
        )
        problems += _both_or_neither(
            "basic_auth_user",
            self.basic_auth_user,
            "basic_auth_password_file",
            True if has_password else None,
        )
        if problems:
            raise CrossFieldError(problems)
        return self

    @property
    def address(self) -> tuple[str, int]:
        """The parsed `listen` as (host, port)."""
        return parse_listen(self.listen)

    @property
    def agent_address(self) -> tuple[str, int] | None:
        """The parsed `agent_listen` as (host, port); None when the agent check is off."""
        return None if self.agent_listen is None else parse_listen(self.agent_listen)

    def resolve_basic_auth_password(self) -> SecretStr | None:
        """`basic_auth_password` if given, else the content of its file; read at call time."""
        return _read_secret(
            "http.basic_auth_password_file",
            self.basic_auth_password,
            self.basic_auth_password_file,
        )


class SlackSettings(_Section):
    """`[slack]`: how slack, risk and the throttle are judged (docs/semantics.md)."""

    player: PlayerModel = "conceal"
    default_margin_ms: NonNegativeMs = 80.0
    hysteresis_ms: NonNegativeMs = 20.0
    min_on_ms: NonNegativeMs = 250.0
    default_chunk_gap_ms: PositiveMs = 200.0
    stream_idle_timeout_ms: PositiveMs = 30_000.0
    clock: ClockMode = "estimate"
    allowed_lateness_ms: NonNegativeMs = 1_000.0


class LimitsSettings(_Section):
    """`[limits]`: what bounds memory whatever devices send (docs/reliability.md)."""

    max_devices: Count = 1_000
    max_streams_per_device: Count = 256
    max_payload_bytes: Count = 262_144
    max_batch_events: Count = 1_000
    per_stream_series: Annotated[int, Field(ge=0)] = 20
    device_idle_s: Annotated[float, Field(gt=0)] = 600.0


class DeviceSettings(_Section):
    """`[devices.<id>]`: the operator's word for one device beats what it says itself."""

    margin_ms: NonNegativeMs | None = None
    player: PlayerModel | None = None


class SloSettings(_Section):
    """`[slo]`: when an ended stream served its listener well (docs/semantics.md, "Service
    level"), and the share of such streams the burn-rate alerts defend."""

    start_ms: NonNegativeMs = 3_000.0
    gap_ms: NonNegativeMs = 100.0
    objective: Annotated[float, Field(gt=0, lt=1)] = 0.99


class LogSettings(_Section):
    """`[log]`: `auto` is console on a terminal, JSON otherwise."""

    format: Literal["auto", "json", "console"] = "auto"
    level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("format", "level", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value


#: systemd's `StateDirectory=edgemon`; without it the XDG state directory is used.
DEFAULT_STATE_DIR = Path("/var/lib/edgemon")


class StateSettings(_Section):
    """`[state]`: where stream state is snapshotted across restarts, and the write-ahead log
    that makes a crash lose nothing (docs/reliability.md)."""

    dir: Path = DEFAULT_STATE_DIR
    snapshot_interval_s: Annotated[float, Field(gt=0)] = 10.0
    wal: bool = True


class Settings(BaseSettings):
    """The whole configuration. Build it with `load_settings`, which adds file and environment."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", frozen=True
    )

    mqtt: MqttSettings = Field(default_factory=MqttSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    slack: SlackSettings = Field(default_factory=SlackSettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    devices: dict[DeviceId, DeviceSettings] = Field(default_factory=dict)
    slo: SloSettings = Field(default_factory=SloSettings)
    log: LogSettings = Field(default_factory=LogSettings)
    state: StateSettings = Field(default_factory=StateSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],  # noqa: ARG003
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,  # noqa: ARG003
        dotenv_settings: PydanticBaseSettingsSource,  # noqa: ARG003
        file_secret_settings: PydanticBaseSettingsSource,  # noqa: ARG003
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Only what is passed in: the environment is merged by `load_settings`, at call time."""
        return (init_settings,)

    def engine_config(self) -> EngineConfig:
        """The plain frozen values the pure engine is built from."""
        slack = self.slack
        limits = self.limits
        return EngineConfig(
            slack=SlackPolicy(
                player=slack.player,
                default_margin_ms=slack.default_margin_ms,
                hysteresis_ms=slack.hysteresis_ms,
                min_on_ms=slack.min_on_ms,
                default_chunk_gap_ms=slack.default_chunk_gap_ms,
                stream_idle_timeout_ms=slack.stream_idle_timeout_ms,
                clock=slack.clock,
                allowed_lateness_ms=slack.allowed_lateness_ms,
            ),
            limits=Limits(
                max_devices=limits.max_devices,
                max_streams_per_device=limits.max_streams_per_device,
                max_payload_bytes=limits.max_payload_bytes,
                max_batch_events=limits.max_batch_events,
                per_stream_series=limits.per_stream_series,
                device_idle_ms=limits.device_idle_s * 1000.0,
            ),
            devices=MappingProxyType(
                {
                    device: DeviceOverride(margin_ms=override.margin_ms, player=override.player)
                    for device, override in self.devices.items()
                }
            ),
            topic_prefix=self.mqtt.topic_prefix,
            slo=SloPolicy(
                start_ms=self.slo.start_ms, gap_ms=self.slo.gap_ms, objective=self.slo.objective
            ),
        )
