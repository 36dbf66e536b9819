"""One exception root: every exception class edgemon defines derives from `EdgemonError`, the
MQTT link's from `MqttError`, and there is one `PublishError`; and `CaughtErrors` counts every
error it is told of and logs only the first, with its traceback."""

from __future__ import annotations

import ast
import importlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import edgemon
from edgemon.errors import CaughtErrors, EdgemonError, MqttError

if TYPE_CHECKING:
    import pytest

PACKAGE = Path(edgemon.__file__).parent
#: Modules that import vLLM at module load: not installed here (the vLLM tier has it).
NEEDS_VLLM = ("vllm", "_vllm", "plugin")


def defined_exceptions() -> dict[str, type[BaseException]]:
    """Every class derived from BaseException that a module of the package defines, by its
    qualified name (modules that need vLLM left out)."""
    found: dict[str, type[BaseException]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.stem.startswith(NEEDS_VLLM) and path.parent.name == "integrations":
            continue
        names = [node.name for node in ast.parse(path.read_text()).body
                 if isinstance(node, ast.ClassDef)]  # fmt: skip
        if not names:
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = importlib.import_module(".".join(p for p in parts if p != "__init__"))
        for name in names:
            value = getattr(module, name)
            if isinstance(value, type) and issubclass(value, BaseException):
                found[f"{module.__name__}.{name}"] = value
    return found


def test_every_exception_edgemon_defines_has_one_root() -> None:
    """Each exception class in the package derives from `EdgemonError`; those of the daemon's
    MQTT link (and the simulator's publisher, which raises the same `PublishError`) from
    `MqttError`; and no two classes share a name (there were two `PublishError`s)."""
    found = defined_exceptions()
    assert len(found) >= 15, sorted(found)
    strays = sorted(name for name, cls in found.items() if not issubclass(cls, EdgemonError))
    assert strays == []
    mqtt = {name for name, cls in found.items() if issubclass(cls, MqttError)}
    assert {
        "edgemon.errors.ConnectionLostError",
        "edgemon.errors.ProtocolError",
        "edgemon.errors.NotSendableError",
        "edgemon.errors.PublishError",
        "edgemon.daemon.mqtt_codec.PacketTooLargeError",
        "edgemon.daemon.mqtt_terms.BrokerUnsuitableError",
    } <= mqtt
    short = [name.rsplit(".", 1)[1] for name in found]
    assert sorted(n for n in set(short) if short.count(n) > 1) == []


def test_caught_errors_are_counted_and_the_first_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Three errors caught: the count says 3; one line in the log, an error, for the first,
    naming where it was caught, with its traceback; the next two are only counted."""
    log = logging.getLogger("edgemon.test_errors")
    errors = CaughtErrors(log, "edgemon part", "; went on (further errors are counted)")
    with caplog.at_level(logging.DEBUG, logger=log.name):
        for where in ("the first place", "the second", "the third"):
            try:
                raise RuntimeError(where)  # noqa: TRY301 - a real exception, caught as in use
            except RuntimeError:
                errors.caught(where)
    assert errors.count == 3
    (record,) = caplog.records
    assert record.levelno == logging.ERROR
    assert record.getMessage() == (
        "edgemon part: an error in the first place; went on (further errors are counted)"
    )
    assert record.exc_info is not None
    assert str(record.exc_info[1]) == "the first place"
