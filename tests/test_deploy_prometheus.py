"""deploy/prometheus checked by the real `promtool`: the scrape config, the rules, the rules'
unit tests, the alerts' metadata against docs/runbook.md, and a real `/metrics` scrape of a
running edgemon (fed by the simulator through a real Mosquitto) against `promtool check metrics`.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import pytest

from edgemon.daemon import Daemon
from edgemon.settings import HttpSettings, LimitsSettings, MqttSettings, Settings
from edgemon.simulate import Simulation
from edgemon.simulate.publisher import publish_simulation, wall_ms

from daemons import running
from tools import require_tool

if TYPE_CHECKING:
    from brokers import Broker

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS_DIR / "edgemon.rules.yml"
RULES_TEST = PROMETHEUS_DIR / "edgemon.rules.test.yml"
RUNBOOK = ROOT / "docs" / "runbook.md"

#: The alerts the shipped rules must hold, by what they watch.
REQUIRED_ALERTS = {
    "EdgemonUnderrunRiskSustained",
    "EdgemonUnderruns",
    "EdgemonThrottleStuck",
    "EdgemonKvAdmissionUnsafe",
    "EdgemonDown",
    "EdgemonAbsent",
    "EdgemonBrokerDisconnected",
    "EdgemonInputRejected",
    "EdgemonSloFastBurn",
    "EdgemonSloSlowBurn",
}


@pytest.fixture
def promtool() -> str:
    """The path of `promtool`; skips the test where it is not installed (`require_tool`)."""
    return require_tool("promtool")


def run_promtool(promtool: str, *args: str, stdin: bytes | None = None) -> str:
    """Run promtool in deploy/prometheus; fail with its whole output unless it exits 0."""
    done = subprocess.run(  # noqa: PLW1510 - the return code is asserted below
        [promtool, *args], cwd=PROMETHEUS_DIR, input=stdin, capture_output=True, timeout=60
    )
    output = (done.stdout + done.stderr).decode()
    assert done.returncode == 0, f"promtool {' '.join(args)} exited {done.returncode}:\n{output}"
    return output


def alert_blocks() -> dict[str, str]:
    """Each alert rule's YAML text, by alert name (the rules file is plain, one rule a block)."""
    text = RULES.read_text(encoding="utf-8")
    parts = re.split(r"^\s+- alert: ", text, flags=re.MULTILINE)[1:]
    return {part.split("\n", 1)[0].strip(): part for part in parts}


def test_scrape_config_is_valid(promtool: str) -> None:
    """`promtool check config` accepts the shipped prometheus.yml, including the rules file it
    names (resolved next to it, as it will be in /etc/prometheus)."""
    run_promtool(promtool, "check", "config", "prometheus.yml")
    text = (PROMETHEUS_DIR / "prometheus.yml").read_text(encoding="utf-8")
    assert "job_name: edgemon" in text
    assert '"localhost:9857"' in text


def test_rules_are_valid(promtool: str) -> None:
    """`promtool check rules` accepts edgemon.rules.yml."""
    run_promtool(promtool, "check", "rules", RULES.name)


def test_rule_unit_tests_pass(promtool: str) -> None:
    """`promtool test rules` passes: each alert fires on its input and stays silent on
    healthy series and short blips; the recording rules compute the expected rates."""
    run_promtool(promtool, "test", "rules", RULES_TEST.name)


def test_every_alert_is_complete_documented_and_unit_tested() -> None:
    """Every required alert exists with `for:`, a severity, summary, description and a
    runbook_url whose anchor is a section of docs/runbook.md, and the promtool unit tests
    show it both firing and silent."""
    blocks = alert_blocks()
    assert blocks.keys() >= REQUIRED_ALERTS
    runbook = RUNBOOK.read_text(encoding="utf-8")
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")
        for heading in re.findall(r"^## (.+)$", runbook, flags=re.MULTILINE)
    }
    unit_tests = RULES_TEST.read_text(encoding="utf-8")
    for name, block in blocks.items():
        assert re.search(r"^\s+for: \d+[smh]$", block, flags=re.MULTILINE), name
        assert re.search(r"^\s+severity: (critical|warning)$", block, flags=re.MULTILINE), name
        assert "summary:" in block, name
        assert "description:" in block, name
        url = re.search(r"runbook_url: docs/runbook\.md#(\S+)", block)
        assert url is not None, name
        assert url.group(1) in anchors, f"{name}: no section #{url.group(1)} in the runbook"
        firing = rf"alertname: {name}\n\s+exp_alerts:( &\w+)?\n\s+- exp_labels"
        silent = rf"alertname: {name}\n\s+exp_alerts: \[\]"
        assert re.search(firing, unit_tests), f"{name} is never shown firing"
        assert re.search(silent, unit_tests), f"{name} is never shown silent"


def test_flapping_prone_alerts_keep_firing() -> None:
    """The alerts on values that oscillate (headroom, throttle, connection, rejection ratio)
    have `keep_firing_for:`, so a recovering device does not resolve and re-fire."""
    blocks = alert_blocks()
    for name in (
        "EdgemonUnderrunRiskSustained",
        "EdgemonThrottleStuck",
        "EdgemonBrokerDisconnected",
        "EdgemonInputRejected",
    ):
        assert re.search(r"^\s+keep_firing_for: \d+[smh]$", blocks[name], re.MULTILINE), name


# ---------------------------------------------------------------------- a real scrape
async def scrape_when_complete(url: str, wanted: tuple[str, ...], within_s: float) -> bytes:
    """GET `url` until the exposition holds every name in `wanted`; the last body."""
    body = b""
    async with aiohttp.ClientSession() as session, asyncio.timeout(within_s):
        while True:
            async with session.get(url) as response:
                assert response.status == 200
                body = await response.read()
            if all(name.encode() in body for name in wanted):
                return body
            await asyncio.sleep(0.1)


async def scrape_running_edgemon(broker: Broker) -> bytes:
    """Run edgemon in-process on `broker` (under its prefix), let the simulator feed it one
    healthy and one overloaded device, and return a `/metrics` body once every kind of series
    is in it."""
    settings = Settings(
        mqtt=MqttSettings(
            url=broker.url,
            client_id=broker.client_id("edgemon-check-metrics"),
            topic_prefix=broker.prefix,
        ),
        http=HttpSettings(listen="127.0.0.1:0"),
        limits=LimitsSettings(per_stream_series=20),
    )
    daemon = Daemon(settings, environ={}, install_signal_handlers=False)
    stop = asyncio.Event()
    publisher = None
    async with running(daemon):
        try:
            simulation = Simulation(
                devices=2, streams=2, rtf=[0.1, 1.2], stall_rate=0.0, seed=3, start_ms=wall_ms()
            )
            publisher = asyncio.create_task(
                publish_simulation(
                    simulation,
                    hostname=broker.host,
                    port=broker.port,
                    duration_s=None,
                    stop=stop,
                    topic_prefix=broker.prefix,
                )
            )
            wanted = (
                "edgemon_chunk_gap_seconds_bucket",
                "edgemon_time_to_first_audio_seconds_bucket",
                "edgemon_slack_at_arrival_seconds_bucket",
                "edgemon_stream_headroom_seconds{",
                "edgemon_headroom_min_seconds{",
                "edgemon_kv_admission_ok{",
                "edgemon_streams_slo_total{",
                "edgemon_stream_longest_gap_seconds_bucket{",
                "edgemon_slo_objective ",
            )
            body = await scrape_when_complete(
                f"http://127.0.0.1:{daemon.http_port}/metrics", wanted, within_s=10
            )
        finally:
            stop.set()
            if publisher is not None:  # it ends its run cleanly on `stop`, else the test fails
                await asyncio.wait_for(publisher, 5)
    return body


def test_real_scrape_passes_promtool_check_metrics(promtool: str, mosquitto_broker: Broker) -> None:
    """A running edgemon, fed by the simulator (one healthy, one overloaded device, engine
    objects included) over a real Mosquitto, serves a `/metrics` in which `promtool check
    metrics` finds no naming or type problem, with the per-device families, the histograms,
    the KV gauges and the per-stream series present."""
    body = asyncio.run(scrape_running_edgemon(mosquitto_broker))
    output = run_promtool(promtool, "check", "metrics", stdin=body)
    assert output.strip() == "", f"promtool check metrics:\n{output}\n--- scrape:\n{body.decode()}"
