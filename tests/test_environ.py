"""The engine process's `EDGEMON_*` variables (`edgemon.environ`): read once, typed, every bad
variable one line of one error."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from edgemon.environ import (
    DEADLINES,
    EnvironError,
    read_engine_environ,
    read_gate_environ,
    read_variable,
)
from edgemon.integrations._deadlines import deadline_settings
from edgemon.integrations.plugin import wanted

if TYPE_CHECKING:
    from pathlib import Path


def test_unset_or_blank_variables_take_their_defaults() -> None:
    """An empty environment, or blank values, give every default: no gate, real-time frame
    80 ms, deadlines off, guard 400 ms, the recommended player's prebuffer (200 ms and the
    25-frame second chunk), start SLO 3 s, no vLLM-Omni pipelines."""
    names = (
        "EDGEMON_GATE_DEVICE", "EDGEMON_REALTIME_FRAME_MS", "EDGEMON_DEADLINES",
        "EDGEMON_DEADLINE_GUARD_MS", "EDGEMON_SLO_START_MS", "EDGEMON_OMNI_PIPELINES",
    )  # fmt: skip
    blank = dict.fromkeys(names, "  ")
    for environ in ({}, blank):
        engine = read_engine_environ(environ)
        assert engine.gate is None
        assert (engine.realtime_frame_ms, engine.frame_ms) == (80.0, 80.0)
        assert engine.deadlines == "off"
        assert (engine.deadline_guard_ms, engine.slo_start_ms) == (400.0, 3000.0)
        assert (engine.deadline_prebuffer_ms, engine.deadline_second_chunk_frames) == (200.0, 25)
        assert engine.omni_pipelines is False


def test_each_variable_is_read_and_typed() -> None:
    """Every variable is read, stripped, as its type (the mode case-insensitive); a frame of
    0 turns real-time admission off and leaves the policy a codec frame."""
    engine = read_engine_environ(
        {
            "EDGEMON_REALTIME_FRAME_MS": " 0 ",
            "EDGEMON_DEADLINES": " Shed ",
            "EDGEMON_DEADLINE_GUARD_MS": "250",
            "EDGEMON_DEADLINE_PREBUFFER_MS": " 50 ",
            "EDGEMON_DEADLINE_SECOND_CHUNK_FRAMES": "4",
            "EDGEMON_SLO_START_MS": "1500",
            "EDGEMON_OMNI_PIPELINES": "Yes",
        }
    )
    assert (engine.realtime_frame_ms, engine.frame_ms) == (0.0, 80.0)
    assert engine.deadlines == "shed"
    assert (engine.deadline_guard_ms, engine.slo_start_ms) == (250.0, 1500.0)
    assert (engine.deadline_prebuffer_ms, engine.deadline_second_chunk_frames) == (50.0, 4)
    assert engine.omni_pipelines is True


@pytest.mark.parametrize(
    ("name", "text", "what"),
    [
        ("EDGEMON_REALTIME_FRAME_MS", "-1", "a number of milliseconds ≥ 0"),
        ("EDGEMON_REALTIME_FRAME_MS", "fast", "a number of milliseconds ≥ 0"),
        ("EDGEMON_REALTIME_FRAME_MS", "inf", "a number of milliseconds ≥ 0"),
        ("EDGEMON_DEADLINES", "drop", "one of off, hold, shed"),
        ("EDGEMON_DEADLINE_GUARD_MS", "nan", "a number of milliseconds ≥ 0"),
        ("EDGEMON_DEADLINE_PREBUFFER_MS", "-1", "a number of milliseconds ≥ 0"),
        ("EDGEMON_DEADLINE_SECOND_CHUNK_FRAMES", "2.5", "a whole number of frames ≥ 0"),
        ("EDGEMON_DEADLINE_SECOND_CHUNK_FRAMES", "many", "a whole number of frames ≥ 0"),
        ("EDGEMON_SLO_START_MS", "0", "a number of milliseconds > 0"),
        ("EDGEMON_SLO_START_MS", "soon", "a number of milliseconds > 0"),
        ("EDGEMON_GATE_MAX_HOLD_MS", "0", "a number of milliseconds 0 < x ≤ 3600000"),
        ("EDGEMON_OMNI_PIPELINES", "maybe", "1, true, yes or on (or 0, false, no or off)"),
    ],
)
def test_a_bad_value_is_one_line_naming_its_variable(name: str, text: str, what: str) -> None:
    """A value a variable does not take stops the start with one line: the variable, the
    value and what it takes."""
    environ = {"EDGEMON_GATE_DEVICE": "box-1", name: text}
    with pytest.raises(EnvironError) as raised:
        read_engine_environ(environ)
    assert raised.value.problems == (f"{name}: {text!r} is not {what}",)
    assert str(raised.value) == f"{name}: {text!r} is not {what}"
    assert isinstance(raised.value, ValueError)


def test_every_bad_variable_is_named_once() -> None:
    """Several bad variables: one error with one line for each, in the order they are read
    (a bad real-time frame among them: the deadline policy's frame no longer falls back to
    80 ms in silence)."""
    with pytest.raises(EnvironError) as raised:
        read_engine_environ(
            {
                "EDGEMON_GATE_DEVICE": "a/b",
                "EDGEMON_GATE_BROKER": "http://x",
                "EDGEMON_REALTIME_FRAME_MS": "fast",
                "EDGEMON_DEADLINES": "drop",
                "EDGEMON_SLO_START_MS": "-5",
            }
        )
    names = [problem.partition(":")[0] for problem in raised.value.problems]
    assert names == [
        "EDGEMON_GATE_DEVICE",
        "EDGEMON_GATE_BROKER",
        "EDGEMON_REALTIME_FRAME_MS",
        "EDGEMON_DEADLINES",
        "EDGEMON_SLO_START_MS",
    ]


def test_the_gates_variables() -> None:
    """No device: no gate. With one: the devices checked and sorted, the broker parsed, the
    hold and the prefix as given, and a `ThrottleGate`'s keywords from them."""
    assert read_gate_environ({"EDGEMON_GATE_BROKER": "mqtt://x"}) is None
    gate = read_gate_environ(
        {
            "EDGEMON_GATE_DEVICE": "b, a",
            "EDGEMON_GATE_BROKER": "mqtts://user:pw@broker.local",
            "EDGEMON_GATE_MAX_HOLD_MS": "750",
            "EDGEMON_GATE_TOPIC_PREFIX": "site/a",
        }
    )
    assert gate is not None
    assert (gate.device, gate.devices) == ("b, a", ("a", "b"))
    assert (gate.broker.host, gate.broker.port, gate.broker.tls) == ("broker.local", 8883, True)
    assert gate.gate_keywords() == {"max_hold_ms": 750.0, "topic_prefix": "site/a"}
    default = read_gate_environ({"EDGEMON_GATE_DEVICE": "box-1"})
    assert default is not None
    assert (default.broker_url, default.topic_prefix) == ("mqtt://127.0.0.1:1883", "edgemon/v1")
    assert default.gate_keywords() == {"topic_prefix": "edgemon/v1"}


def test_the_connection_variables_client_certificate_included(tmp_path: Path) -> None:
    """The login and the TLS files are read and checked against the broker, the client
    certificate and its key too (before, `EDGEMON_GATE_CERT_FILE` and `KEY_FILE` were
    accepted as gate settings and never used); a certificate without its key is refused
    naming the certificate."""
    files = {name: tmp_path / name for name in ("password", "ca.pem", "cert.pem", "key.pem")}
    for path in files.values():
        path.write_text("secret\n")
    environ = {
        "EDGEMON_GATE_DEVICE": "box-1",
        "EDGEMON_GATE_BROKER": "mqtts://broker.local",
        "EDGEMON_GATE_USERNAME": "engine",
        "EDGEMON_GATE_PASSWORD_FILE": str(files["password"]),
        "EDGEMON_GATE_CA_FILE": str(files["ca.pem"]),
        "EDGEMON_GATE_CERT_FILE": str(files["cert.pem"]),
        "EDGEMON_GATE_KEY_FILE": str(files["key.pem"]),
    }
    gate = read_gate_environ(environ)
    assert gate is not None
    broker = gate.broker
    assert (broker.username, broker.password) == ("engine", "secret")
    assert (broker.ca_file, broker.cert_file, broker.key_file) == (
        str(files["ca.pem"]),
        str(files["cert.pem"]),
        str(files["key.pem"]),
    )
    assert gate.gate_keywords()["cert_file"] == str(files["cert.pem"])
    del environ["EDGEMON_GATE_KEY_FILE"]
    with pytest.raises(EnvironError) as raised:
        read_gate_environ(environ)
    (problem,) = raised.value.problems
    assert problem.startswith("EDGEMON_GATE_CERT_FILE: give cert_file= and key_file= together")


def test_one_variable_alone() -> None:
    """`read_variable` reads one variable, with its own error."""
    assert read_variable({}, DEADLINES) == "off"
    assert read_variable({"EDGEMON_DEADLINES": "HOLD"}, DEADLINES) == "hold"
    with pytest.raises(EnvironError, match=r"^EDGEMON_DEADLINES: 'drop' is not one of"):
        read_variable({"EDGEMON_DEADLINES": "drop"}, DEADLINES)


def test_the_plugin_warns_of_a_bad_flag_and_registers_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`EDGEMON_OMNI_PIPELINES` is a flag: 1, true, yes or on register the pipelines; a value
    that is none of the flags is said in a warning and registers nothing, since the plugin
    must never stop vLLM."""
    assert wanted({"EDGEMON_OMNI_PIPELINES": "on"})
    assert not wanted({"EDGEMON_OMNI_PIPELINES": "0"})
    assert not wanted({})
    with caplog.at_level("WARNING", logger="edgemon.integrations.plugin"):
        assert not wanted({"EDGEMON_OMNI_PIPELINES": "2"})
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith("edgemon: EDGEMON_OMNI_PIPELINES: '2' is not 1, true, yes or on")


def test_the_deadline_settings_from_the_environment() -> None:
    """The deadline policy's settings follow the variables: the start SLO, the guard, the
    players' prebuffer, the frame (a codec frame when real-time admission is off) and
    shedding as the mode says."""
    settings = deadline_settings(read_engine_environ({"EDGEMON_DEADLINES": "shed"}))
    assert (settings.prebuffer_ms, settings.second_chunk_frames) == (200.0, 25)
    assert (settings.start_slo_ms, settings.guard_ms, settings.frame_ms) == (3000.0, 400.0, 80.0)
    assert settings.shed
    assert settings.estimate_headroom
    settings = deadline_settings(
        read_engine_environ(
            {
                "EDGEMON_DEADLINES": "hold",
                "EDGEMON_DEADLINE_PREBUFFER_MS": "50",
                "EDGEMON_DEADLINE_SECOND_CHUNK_FRAMES": "4",
                "EDGEMON_REALTIME_FRAME_MS": "100",
            }
        ),
        token_budget=512,
    )
    assert (settings.prebuffer_ms, settings.second_chunk_frames) == (50.0, 4)
    assert (settings.frame_ms, settings.token_budget) == (100.0, 512)
    assert not settings.shed
