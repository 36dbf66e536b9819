"""The settings layer: file, environment and flag precedence, validation messages, secrets."""

from __future__ import annotations

import math
import socket
from pathlib import Path
from types import MappingProxyType

import pytest

from edgemon.engine.config import DeviceOverride, EngineConfig, Limits, SlackPolicy, SloPolicy
from edgemon.settings import (
    Broker,
    ConfigError,
    MqttSettings,
    Settings,
    environment_warnings,
    load_settings,
    masked_dump,
    parse_listen,
    parse_mqtt_url,
    permission_warnings,
)
from edgemon.settings._models import default_client_id

FULL = """
[mqtt]
url = "mqtts://broker.example:8884"
client_id = "edge-7"
username = "edgemon"
password_file = "mqtt-password"
topic_prefix = "site/a/edgemon"
qos = 0
persistent_session = false
devices = ["kitchen", "hall"]
keepalive_s = 15

[http]
listen = "[::1]:9999"
basic_auth_user = "prom"
basic_auth_password_file = "http-password"

[slack]
player = "rebuffer"
default_margin_ms = 100
hysteresis_ms = 5
min_on_ms = 0
default_chunk_gap_ms = 150.5
stream_idle_timeout_ms = 1000
clock = "trust"

[limits]
max_devices = 10
max_streams_per_device = 4
max_payload_bytes = 4096
max_batch_events = 8
per_stream_series = 0

[slo]
start_ms = 2500
gap_ms = 80
objective = 0.995

[devices.kitchen-01]
margin_ms = 40

[devices."cam.1"]
player = "conceal"

[log]
format = "json"
level = "WARNING"

[state]
dir = "/srv/edgemon"
snapshot_interval_s = 2.5
"""


def write(directory: Path, text: str, name: str = "edgemon.toml") -> Path:
    """Write `text` to `directory/name` and return the path."""
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def write_secrets(directory: Path) -> None:
    """The password files FULL names, owner-only as they should be."""
    for name, secret in (("mqtt-password", "s3cret-mqtt\n"), ("http-password", "s3cret-http")):
        write(directory, secret, name).chmod(0o600)


NO_FILE = Path("/nonexistent/edgemon.toml")


def problems_of(path: Path | None, environ: dict[str, str] | None = None) -> list[str]:
    """The problems `load_settings` reports (no default file), failing if it reports none."""
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ=environ or {}, default_path=NO_FILE)
    return list(info.value.problems)


# ------------------------------------------------------------------ sources and precedence


def test_defaults_without_a_file(tmp_path: Path) -> None:
    """With no file at the default path the defaults of README apply."""
    settings = load_settings(None, environ={}, default_path=tmp_path / "absent.toml")
    assert settings == Settings()
    assert settings.mqtt.url == "mqtt://127.0.0.1:1883"
    assert settings.mqtt.broker == Broker("127.0.0.1", 1883)
    assert settings.mqtt.client_id == default_client_id(socket.gethostname())
    assert settings.mqtt.topic_prefix == "edgemon/v1"
    assert (settings.mqtt.qos, settings.mqtt.persistent_session) == (1, True)
    assert settings.mqtt.keepalive_s == 30
    assert settings.http.address == ("0.0.0.0", 9857)
    assert settings.slack.default_margin_ms == 80
    assert (settings.slack.hysteresis_ms, settings.slack.min_on_ms) == (20, 250)
    assert settings.slack.stream_idle_timeout_ms == 30_000
    assert settings.limits.max_payload_bytes == 262_144
    assert settings.devices == {}
    assert (settings.log.format, settings.log.level) == ("auto", "info")
    assert settings.state.dir == Path("/var/lib/edgemon")
    assert settings.state.wal is True


def test_default_path_is_read_when_it_exists(tmp_path: Path) -> None:
    """With no path given, the file at the default path is read if there is one."""
    default = write(tmp_path, "[slack]\ndefault_margin_ms = 33\n")
    assert load_settings(None, environ={}, default_path=default).slack.default_margin_ms == 33


def test_every_key_of_the_file_is_read(tmp_path: Path) -> None:
    """Each section's values come from the TOML file; relative paths are beside the file."""
    write_secrets(tmp_path)
    settings = load_settings(write(tmp_path, FULL), environ={})
    assert settings.mqtt.broker == Broker("broker.example", 8884, tls=True)
    assert settings.mqtt.password_file == tmp_path / "mqtt-password"
    password = settings.mqtt.resolve_password()
    assert password is not None
    assert password.get_secret_value() == "s3cret-mqtt"
    assert (settings.mqtt.qos, settings.mqtt.persistent_session) == (0, False)
    assert settings.mqtt.devices == ("kitchen", "hall")
    assert settings.http.address == ("::1", 9999)
    secret = settings.http.resolve_basic_auth_password()
    assert secret is not None
    assert secret.get_secret_value() == "s3cret-http"
    assert settings.slack.player == "rebuffer"
    assert settings.slack.default_chunk_gap_ms == 150.5
    assert settings.limits.per_stream_series == 0
    assert settings.devices["cam.1"].player == "conceal"
    assert settings.log.level == "warning"
    assert settings.state.snapshot_interval_s == 2.5
    assert (settings.slo.start_ms, settings.slo.gap_ms, settings.slo.objective) == (
        2500,
        80,
        0.995,
    )


def test_environment_beats_the_file(tmp_path: Path) -> None:
    """`EDGEMON_<SECTION>__<KEY>` overrides the file's value; other file values stay."""
    path = write(tmp_path, '[slack]\ndefault_margin_ms = 100\nplayer = "rebuffer"\n')
    environ = {
        "EDGEMON_SLACK__DEFAULT_MARGIN_MS": "120",
        "EDGEMON_MQTT__URL": "mqtt://10.0.0.5",
        "EDGEMON_MQTT__PERSISTENT_SESSION": "false",
        "EDGEMON_DEVICES__SPK1__MARGIN_MS": "7",
        "UNRELATED": "x",
    }
    settings = load_settings(path, environ=environ)
    assert settings.slack.default_margin_ms == 120
    assert settings.slack.player == "rebuffer"
    assert settings.mqtt.broker == Broker("10.0.0.5", 1883)
    assert settings.mqtt.persistent_session is False
    assert settings.devices["SPK1"].margin_ms == 7  # device ids keep their case


def test_overrides_beat_environment_and_file(tmp_path: Path) -> None:
    """Flags (`overrides`) win over both the environment and the file."""
    path = write(tmp_path, "[slack]\nmin_on_ms = 1\nhysteresis_ms = 2\n")
    settings = load_settings(
        path,
        environ={"EDGEMON_SLACK__MIN_ON_MS": "10"},
        overrides={"slack": {"min_on_ms": 100}, "mqtt": {"url": "embedded"}},
    )
    assert settings.slack.min_on_ms == 100
    assert settings.slack.hysteresis_ms == 2
    assert settings.mqtt.broker.embedded


def test_environment_is_read_at_call_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without `environ`, `os.environ` is read when loading; `Settings()` never reads it."""
    monkeypatch.setenv("EDGEMON_SLACK__HYSTERESIS_MS", "3")
    assert load_settings(None, default_path=tmp_path / "absent.toml").slack.hysteresis_ms == 3
    assert Settings().slack.hysteresis_ms == 20


def test_missing_explicit_path_is_an_error(tmp_path: Path) -> None:
    """A path that was asked for and does not exist is an error, not silently the defaults."""
    missing = tmp_path / "nope.toml"
    problems = problems_of(missing)
    assert problems == [f"{missing}: no such file"]


# ------------------------------------------------------------------ problems


def test_unknown_key_is_named_with_a_suggestion(tmp_path: Path) -> None:
    """A misspelt key is refused by its dotted name, with the key it was probably meant to be."""
    problems = problems_of(write(tmp_path, "[slack]\ndefault_margn_ms = 5\n"))
    assert problems == [
        "slack.default_margn_ms: unknown key (did you mean slack.default_margin_ms?)"
    ]


def test_unknown_section_is_named(tmp_path: Path) -> None:
    """An unknown top-level table is refused by name."""
    assert problems_of(write(tmp_path, "[metrics]\nport = 1\n")) == ["metrics: unknown section"]


def test_every_problem_is_listed(tmp_path: Path) -> None:
    """All problems of a file are reported at once, each naming its key and the bad value."""
    text = """
[mqtt]
url = "http://broker"
qos = 2
topic_prefix = "a/#"
[slack]
default_margin_ms = -5
player = "fast"
default_chunk_gap_ms = 0
[limits]
max_devices = 0
max_batch_events = "many"
[log]
format = "xml"
"""
    problems = problems_of(write(tmp_path, text))
    assert problems == [
        "mqtt.url: must be mqtt://host[:port], mqtts://host[:port] or embedded (got 'http://broker')",
        "mqtt.topic_prefix: must not contain the wildcards '+' or '#' (got 'a/#')",
        "mqtt.qos: must be 0 or 1 (got 2)",
        "slack.player: must be 'conceal' or 'rebuffer' (got 'fast')",
        "slack.default_margin_ms: must be ≥ 0 (got -5)",
        "slack.default_chunk_gap_ms: must be > 0 (got 0)",
        "limits.max_devices: must be ≥ 1 (got 0)",
        "limits.max_batch_events: must be an integer (got 'many')",
        "log.format: must be 'auto', 'json' or 'console' (got 'xml')",
    ]


def test_slo_problems_are_listed_and_the_environment_sets_the_slo(tmp_path: Path) -> None:
    """`[slo]`: thresholds are durations ≥ 0 and the objective a share strictly between 0 and
    1 (at 1 no stream may fail, and a burn rate has no budget to divide by); each key can be
    set by `EDGEMON_SLO__<KEY>` like the other sections'."""
    text = '[slo]\nstart_ms = -1\ngap_ms = "short"\nobjective = 1\n'
    assert problems_of(write(tmp_path, text)) == [
        "slo.start_ms: must be ≥ 0 (got -1)",
        "slo.gap_ms: must be a number (got 'short')",
        "slo.objective: must be < 1 (got 1)",
    ]
    assert problems_of(None, {"EDGEMON_SLO__OBJECTIVE": "0"}) == [
        "slo.objective: must be > 0 (got '0') (from EDGEMON_SLO__OBJECTIVE)"
    ]
    environ = {"EDGEMON_SLO__START_MS": "1500", "EDGEMON_SLO__GAP_MS": "40"}
    slo = load_settings(None, environ=environ, default_path=NO_FILE).engine_config().slo
    assert slo == SloPolicy(start_ms=1500, gap_ms=40, objective=0.99)


def test_error_message_counts_the_problems(tmp_path: Path) -> None:
    """`ConfigError` is a ValueError whose one-line message counts and joins the problems."""
    path = write(tmp_path, "[limits]\nmax_devices = 0\nmax_streams_per_device = 0\n")
    with pytest.raises(ValueError, match=r"^2 problems in .*edgemon\.toml: limits\.max_devices"):
        load_settings(path, environ={})


def test_environment_problems_name_the_variable() -> None:
    """A bad value from the environment says which variable set it; unknown sections too."""
    environ = {"EDGEMON_SLACK__MIN_ON_MS": "-1", "EDGEMON_SLAK__MIN_ON_MS": "1"}
    problems = problems_of(None, environ)
    assert problems == [
        "EDGEMON_SLAK__MIN_ON_MS: no such section [slak]",
        "slack.min_on_ms: must be ≥ 0 (got '-1') (from EDGEMON_SLACK__MIN_ON_MS)",
    ]


def test_toml_syntax_error_has_a_line_number(tmp_path: Path) -> None:
    """A file that is not TOML is reported with the line of the mistake."""
    problems = problems_of(write(tmp_path, "[slack]\nplayer = \n"))
    assert len(problems) == 1
    assert problems[0].startswith("TOML syntax error:")
    assert "line 2" in problems[0]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_numbers_are_refused(tmp_path: Path, value: str) -> None:
    """TOML allows nan and inf; no millisecond setting does."""
    problems = problems_of(write(tmp_path, f"[slack]\nmin_on_ms = {value}\n"))
    assert len(problems) == 1
    assert problems[0].startswith("slack.min_on_ms: must be a finite number")


def test_password_in_the_file_is_refused(tmp_path: Path) -> None:
    """A password written into the config is an error pointing to password_file; never echoed."""
    path = write(tmp_path, '[mqtt]\nusername = "u"\npassword = "hunter2"\n')
    problems = problems_of(path)
    assert len(problems) == 1
    assert problems[0].startswith("mqtt.password: secrets are not read from the config file")
    assert "mqtt.password_file" in problems[0]
    assert "hunter2" not in problems[0]
    path = write(tmp_path, '[http]\nbasic_auth_user = "u"\nbasic_auth_password = "hunter2"\n')
    assert "http.basic_auth_password_file" in problems_of(path)[0]


def test_password_from_the_environment(tmp_path: Path) -> None:
    """A password may come from the environment, and then beats password_file."""
    write_secrets(tmp_path)
    path = write(tmp_path, '[mqtt]\nusername = "u"\npassword_file = "mqtt-password"\n')
    settings = load_settings(path, environ={"EDGEMON_MQTT__PASSWORD": "from-env"})
    secret = settings.mqtt.resolve_password()
    assert secret is not None
    assert secret.get_secret_value() == "from-env"


def test_unusable_password_files_are_problems(tmp_path: Path) -> None:
    """A password file that is missing or empty is reported when loading, not at connect time."""
    write(tmp_path, "", "empty")
    text = '[mqtt]\nusername = "u"\npassword_file = "empty"\n'
    text += '[http]\nbasic_auth_user = "u"\nbasic_auth_password_file = "missing"\n'
    problems = problems_of(write(tmp_path, text))
    assert problems == [
        f"http.basic_auth_password_file: no such file (got '{tmp_path / 'missing'}')",
    ]
    text = text.replace('"missing"', '"empty"')
    assert problems_of(write(tmp_path, text)) == [
        f"mqtt.password_file: {tmp_path / 'empty'} is empty",
        f"http.basic_auth_password_file: {tmp_path / 'empty'} is empty",
    ]


def test_keys_that_belong_together(tmp_path: Path) -> None:
    """cert/key files come in pairs, TLS files need mqtts://, a password needs a user."""
    write(tmp_path, "x", "cert.pem")
    text = '[mqtt]\ncert_file = "cert.pem"\npassword_file = "cert.pem"\n'
    text += '[http]\nkey_file = "cert.pem"\nbasic_auth_user = "prom"\n'
    assert problems_of(write(tmp_path, text)) == [
        "mqtt.key_file: must be set together with cert_file",
        "mqtt.url: TLS files are set, so the url must be mqtts://",
        "mqtt.username: must be set when a password is",
        "http.cert_file: must be set together with key_file",
        "http.basic_auth_password_file: must be set together with basic_auth_user",
    ]


@pytest.mark.parametrize("device", ["kitchen-01", "cam.1", "A_b", "x" * 64])
def test_valid_device_ids(tmp_path: Path, device: str) -> None:
    """Device ids as docs/protocol.md allows them are accepted (quoted where TOML needs it)."""
    settings = load_settings(write(tmp_path, f'[devices."{device}"]\nmargin_ms = 1\n'), environ={})
    assert settings.devices[device].margin_ms == 1


@pytest.mark.parametrize("device", ["bad id", "x" * 65, "a/b", "", "é"])
def test_invalid_device_ids(tmp_path: Path, device: str) -> None:
    """A device id that cannot be a topic level is refused by name."""
    problems = problems_of(write(tmp_path, f'[devices."{device}"]\nmargin_ms = 1\n'))
    assert len(problems) == 1
    assert problems[0].startswith("devices.")
    assert device in problems[0]
    assert problems[0].endswith(": invalid device id, must match ^[A-Za-z0-9._-]{1,64}$")


def test_device_section_keys_are_checked(tmp_path: Path) -> None:
    """A device override has its own keys and bounds, named with the device id."""
    text = '[devices."cam.1"]\nmargin_ms = -1\nplayer = "loop"\ncolour = 1\n'
    assert problems_of(write(tmp_path, text)) == [
        'devices."cam.1".margin_ms: must be ≥ 0 (got -1)',
        "devices.\"cam.1\".player: must be 'conceal' or 'rebuffer' (got 'loop')",
        'devices."cam.1".colour: unknown key',
    ]


@pytest.mark.parametrize(
    ("url", "broker"),
    [
        ("mqtt://h", Broker("h", 1883)),
        ("mqtts://h", Broker("h", 8883, tls=True)),
        ("mqtt://h:1", Broker("h", 1)),
        ("mqtt://[::1]:1884", Broker("::1", 1884)),
        ("embedded", Broker("127.0.0.1", 1883, embedded=True)),
    ],
)
def test_broker_urls(url: str, broker: Broker) -> None:
    """The accepted broker url forms and their default ports."""
    assert parse_mqtt_url(url) == broker


@pytest.mark.parametrize(
    "url",
    ["h:1883", "tcp://h", "mqtt://", "mqtt://h:0", "mqtt://h:99999", "mqtt://u:p@h", "mqtt://h/x"],
)
def test_bad_broker_urls(url: str) -> None:
    """Anything but mqtt://host[:port], mqtts://host[:port] or embedded is refused."""
    with pytest.raises(ValueError, match=r"must|port"):
        parse_mqtt_url(url)


@pytest.mark.parametrize("prefix", ["", "/a", "a/", "a//b", "a/+", "#", "$SYS/x"])
def test_bad_topic_prefixes(prefix: str) -> None:
    """A topic prefix must be non-empty levels without wildcards and not broker-reserved."""
    problems = problems_of(None, {"EDGEMON_MQTT__TOPIC_PREFIX": prefix})
    assert len(problems) == 1
    assert problems[0].startswith("mqtt.topic_prefix: must")


def test_listen_addresses() -> None:
    """`HOST:PORT` with IPv6 in brackets; port 0 asks for a free port; others are refused."""
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen("[::]:9857") == ("::", 9857)
    for bad in ("9857", ":9857", "host:", "host:65536", "host:x"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_listen(bad)


# ------------------------------------------------------------------ what the rest of edgemon sees


def test_engine_config_mapping(tmp_path: Path) -> None:
    """`engine_config()` carries slack, limits, device overrides and the topic prefix."""
    write_secrets(tmp_path)
    config = load_settings(write(tmp_path, FULL), environ={}).engine_config()
    assert config == EngineConfig(
        slack=SlackPolicy(
            player="rebuffer",
            default_margin_ms=100.0,
            hysteresis_ms=5.0,
            min_on_ms=0.0,
            default_chunk_gap_ms=150.5,
            stream_idle_timeout_ms=1000.0,
            clock="trust",
        ),
        limits=Limits(
            max_devices=10,
            max_streams_per_device=4,
            max_payload_bytes=4096,
            max_batch_events=8,
            per_stream_series=0,
        ),
        devices=MappingProxyType(
            {
                "kitchen-01": DeviceOverride(margin_ms=40.0),
                "cam.1": DeviceOverride(player="conceal"),
            }
        ),
        topic_prefix="site/a/edgemon",
        slo=SloPolicy(start_ms=2500.0, gap_ms=80.0, objective=0.995),
    )
    assert isinstance(config.devices, MappingProxyType)


def test_default_engine_config_is_the_engine_default() -> None:
    """The settings' defaults and the engine's own defaults agree."""
    config = Settings().engine_config()
    assert config.slack == SlackPolicy()
    assert config.limits == Limits()
    assert config.topic_prefix == EngineConfig().topic_prefix
    assert config.slo == SloPolicy() == SloPolicy(start_ms=3000, gap_ms=100, objective=0.99)
    assert not math.isnan(config.slack.default_margin_ms)


def test_masked_dump_hides_secrets(tmp_path: Path) -> None:
    """Passwords show as *** when set, None when not; paths and user names are shown."""
    write_secrets(tmp_path)
    settings = load_settings(
        write(tmp_path, FULL), environ={"EDGEMON_HTTP__BASIC_AUTH_PASSWORD": "hunter2"}
    )
    dumped = masked_dump(settings)
    assert dumped["http"]["basic_auth_password"] == "***"
    assert dumped["mqtt"]["password"] is None
    assert dumped["mqtt"]["password_file"] == str(tmp_path / "mqtt-password")
    assert dumped["mqtt"]["username"] == "edgemon"
    assert dumped["devices"]["cam.1"] == {"margin_ms": None, "player": "conceal"}
    text = repr(dumped)
    assert "hunter2" not in text
    assert "s3cret" not in text


def test_permission_warnings(tmp_path: Path) -> None:
    """Secret files readable by group/others, and a config readable by others or writable by
    group/others, are warned about; 0600 secrets and a 0640 config are not."""
    write_secrets(tmp_path)
    path = write(tmp_path, FULL)
    path.chmod(0o640)
    settings = load_settings(path, environ={})
    assert permission_warnings(settings, path) == []
    (tmp_path / "mqtt-password").chmod(0o640)
    path.chmod(0o664)
    warnings = permission_warnings(settings, path)
    assert len(warnings) == 3
    assert warnings[0].startswith(f"mqtt.password_file: {tmp_path / 'mqtt-password'} is readable")
    assert "0640" in warnings[0]
    assert warnings[1].startswith(f"{path} is writable by group or others (mode 0664)")
    assert warnings[2].startswith(f"{path} is readable by others (mode 0664)")


def test_example_config_is_valid() -> None:
    """deploy/edgemon.toml, the documented example, loads and shows every section's defaults."""
    example = Path(__file__).parent.parent / "deploy" / "edgemon.toml"
    settings = load_settings(example, environ={})
    assert settings.slack == Settings().slack
    assert settings.mqtt == Settings().mqtt
    assert list(settings.devices) == ["example-speaker-01"]


def test_overrides_merge_key_by_key() -> None:
    """Overrides given as read-only mappings replace single keys, not whole sections."""
    overrides = MappingProxyType({"slack": MappingProxyType({"player": "rebuffer"})})
    settings = load_settings(
        None,
        overrides=overrides,
        environ={"EDGEMON_SLACK__MIN_ON_MS": "5"},
        default_path=NO_FILE,
    )
    assert (settings.slack.player, settings.slack.min_on_ms) == ("rebuffer", 5)


def test_unreadable_config_files(tmp_path: Path) -> None:
    """A directory or a file that is not UTF-8 is reported as one problem, not a crash."""
    problems = problems_of(tmp_path)
    assert problems == [f"cannot read {tmp_path}: Is a directory"]
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[mqtt]\nclient_id = "caf\xe9"\n')
    assert problems_of(path) == [f"{path} is not UTF-8 text"]


def test_bad_password_file_text(tmp_path: Path) -> None:
    """A password file that is not UTF-8 text is named, without showing its bytes."""
    (tmp_path / "pw").write_bytes(b"\xff\xfe")
    path = write(tmp_path, '[mqtt]\nusername = "u"\npassword_file = "pw"\n')
    assert problems_of(path) == [
        f"mqtt.password_file: cannot read {tmp_path / 'pw'}: not UTF-8 text"
    ]


def test_section_as_json_in_the_environment() -> None:
    """`EDGEMON_<SECTION>` may hold the whole section as JSON; bad JSON is one problem."""
    environ = {"EDGEMON_SLACK": '{"player": "rebuffer", "min_on_ms": 1}'}
    settings = load_settings(None, environ=environ, default_path=NO_FILE)
    assert (settings.slack.player, settings.slack.min_on_ms) == ("rebuffer", 1)
    problems = problems_of(None, {"EDGEMON_SLACK": "{player"})
    assert len(problems) == 1
    assert problems[0].startswith('environment: error parsing value for field "slack"')


def test_wrong_shapes_are_named(tmp_path: Path) -> None:
    """A section that is not a table, or a table where a value belongs, is named."""
    text = 'log = "debug"\n[devices]\nspk = 3\n[slack.player]\nx = 1\n'
    assert problems_of(write(tmp_path, text)) == [
        "slack.player: must be 'conceal' or 'rebuffer'",
        "devices.spk: must be a table (got 3)",
        "log: must be a table (got 'debug')",
    ]


def test_no_default_file_when_asked(tmp_path: Path) -> None:
    """`default_path=None` reads no file even if one is at the default path (replay's case)."""
    settings = load_settings(None, environ={}, default_path=None)
    assert settings == Settings()
    with pytest.raises(ConfigError) as info:
        load_settings(None, environ={}, default_path=None, overrides={"slack": {"min_on_ms": -1}})
    assert info.value.source == "the settings (no config file)"
    assert info.value.problems == ("slack.min_on_ms: must be ≥ 0 (got -1)",)


def test_device_ids_from_the_environment_keep_their_case(tmp_path: Path) -> None:
    """`EDGEMON_DEVICES__Cam1__MARGIN_MS` configures device `Cam1`, not `cam1`: device ids are
    case-sensitive topic levels, and the environment merges with the file's devices."""
    path = tmp_path / "edgemon.toml"
    path.write_text("[devices.Kiosk-2]\nmargin_ms = 90\n")
    environ = {
        "EDGEMON_DEVICES__Cam1__MARGIN_MS": "120",
        "EDGEMON_DEVICES__Cam1__PLAYER": "rebuffer",
    }
    settings = load_settings(path, environ=environ, default_path=NO_FILE)
    devices = settings.engine_config().devices
    assert set(devices) == {"Cam1", "Kiosk-2"}
    assert (devices["Cam1"].margin_ms, devices["Cam1"].player) == (120, "rebuffer")
    assert devices["Kiosk-2"].margin_ms == 90


def test_the_default_client_id_names_the_host() -> None:
    """Two instances on two boxes never share a broker session by default: the client id is
    `edgemon-<host>` (first label, topic-safe characters), not a fixed `edgemon`."""
    assert MqttSettings().client_id == default_client_id(socket.gethostname())
    assert MqttSettings().client_id.startswith("edgemon-")
    assert default_client_id("box-7.fleet.example") == "edgemon-box-7"
    assert default_client_id("we ird#host") == "edgemon-we-ird-host"
    assert default_client_id("") == "edgemon"


def test_an_edgemon_variable_that_sets_nothing_is_warned_about() -> None:
    """`EDGEMON_SLACK_DEFAULT_MARGIN_MS` (one underscore) sets nothing: it is named in a
    warning that gives the right spelling; settings and `EDGEMON_GATE_*` (the engine gate's,
    docs/client.md) are not warned about; the variable really is ignored by the settings."""
    environ = {
        "EDGEMON_SLACK_DEFAULT_MARGIN_MS": "120",
        "EDGEMON_SLACK__HYSTERESIS_MS": "5",
        "EDGEMON_GATE_DEVICE": "jetson-1",
        "EDGEMON_VERBOSE": "1",
        "HOME": "/root",
    }
    warnings = environment_warnings(environ)
    assert len(warnings) == 2
    assert warnings[0].startswith("EDGEMON_SLACK_DEFAULT_MARGIN_MS: not an edgemon setting")
    assert "did you mean EDGEMON_SLACK__DEFAULT_MARGIN_MS?" in warnings[0]
    assert warnings[1].startswith("EDGEMON_VERBOSE: not an edgemon setting")
    settings = load_settings(environ=environ, default_path=None)
    assert (settings.slack.default_margin_ms, settings.slack.hysteresis_ms) == (80, 5)
