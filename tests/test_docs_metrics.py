"""docs/metrics.md lists exactly the metric families edgemon exports: a daemon built in-process
(not run: nothing connects), fed a device's events, its engine object and its capacity object,
scraped as Prometheus would."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from edgemon.daemon import Daemon
from edgemon.settings import StateSettings

from brokers import Broker
from clients import settings_for

if TYPE_CHECKING:
    from edgemon.engine.outputs import Output

DOC = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"
T0 = 1_700_000_000_000.0


def documented() -> set[str]:
    """The names in the first column of docs/metrics.md's tables (`_total` kept as written)."""
    return set(
        re.findall(r"^\| `(edgemon_[a-z_]+)` \|", DOC.read_text(encoding="utf-8"), re.MULTILINE)
    )


def exported(tmp_path: Path) -> set[str]:
    """Every `edgemon_` family a daemon (state on) exports once a device has reported, counters
    named with `_total` as the exposition writes them."""
    daemon = Daemon(
        settings_for(Broker("127.0.0.1", 1), state=StateSettings(dir=tmp_path)),
        environ={},
        install_signal_handlers=False,
    )
    events = [
        {"type": "start", "stream": "s", "t_ms": T0},
        {"type": "chunk", "stream": "s", "t_ms": T0, "seq": 0, "audio_ms": 200},
    ]
    engine = {
        "kv_cache_bytes": 1 << 30,
        "max_num_seqs": 8,
        "max_model_len": 4096,
        "geometry": {"num_layers": 28, "num_kv_heads": 8, "head_dim": 128},
    }
    out: list[Output] = []
    daemon.monitor.handle("edgemon/v1/d/events", json.dumps(events).encode(), T0, out)
    daemon.monitor.handle("edgemon/v1/d/engine", json.dumps(engine).encode(), T0, out)
    capacity = {"realtime_streams": 8, "running": 3, "waiting": 0, "start_wait_ms": 200}
    daemon.monitor.handle("edgemon/v1/d/capacity", json.dumps(capacity).encode(), T0, out)
    text = generate_latest(daemon.registry).decode()
    return {
        f"{family.name}_total" if family.type == "counter" else family.name
        for family in text_string_to_metric_families(text)
        if family.name.startswith("edgemon_") and not family.name.endswith("_created")
    }  # (`_created`: prometheus_client's creation time of a histogram, not a family of ours)


def test_every_exported_family_is_documented_and_nothing_else(tmp_path: Path) -> None:
    """The families a daemon exports (engine, per stream, daemon, write-ahead log) are exactly
    those docs/metrics.md lists: none missing from the doc, none in the doc that edgemon does
    not export (`edgemon_build` is exported as `edgemon_build_info`)."""
    assert exported(tmp_path) == documented()
