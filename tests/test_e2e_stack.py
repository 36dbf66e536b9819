"""The whole stack, real programs only: Mosquitto (fixture), `edgemon run` as a process, `edgemon
simulate` as a process with one healthy device (RTF 0.1) and one overloaded (RTF 1.2) whose
engine's capacity object says it is full, and a real Prometheus server scraping edgemon every
second with the shipped rules.

Prometheus gets a copy of deploy/prometheus/edgemon.rules.yml in which every `for:` is cut to
`FOR_IN_TEST` (a regex substitution on the `for:` lines, nothing else changed; `keep_firing_for:`
and the expressions stay as shipped): the shipped durations (1 to 5 minutes) are for
production and would not elapse within the test. The scrape config is written here with the
job name the rules expect (`edgemon`) and 1 s scrape and evaluation intervals.

Checked through Prometheus' HTTP API: every dashboard panel's expression returns data (as
Grafana would ask: a range query over the last `PANEL_RANGE_S` seconds, or an instant query
for instant targets; `$device` is the overloaded device, `$__rate_interval` is
`RATE_INTERVAL`), every rule evaluates with health `ok`, and EdgemonUnderruns is firing for
the overloaded device and not for the healthy one.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiomqtt
import pytest

from ports import Servers, free_port, get_json, reachable
from tools import require_tool, tool_path

if TYPE_CHECKING:
    from brokers import Broker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "edgemon.rules.yml"
DASHBOARDS = [ROOT / "dashboards" / name for name in ("edgemon-fleet.json", "edgemon-device.json")]
PROMETHEUS = tool_path("prometheus")

HEALTHY, OVERLOADED = "sim-0", "sim-1"
FOR_IN_TEST = "5s"
RATE_INTERVAL = "15s"
PANEL_RANGE_S = 30
DEADLINE_S = 90.0
#: Run the scenario at least this long, so the healthy device has had streams enough to show
#: that it does not underrun (and its alert stays silent) rather than that it was not asked.
MIN_SCENARIO_S = 30.0
#: How long edgemon waits for a late chunk before its own clock confirms an underrun: longer
#: than any stall of a loaded machine, shorter than a stream's idle timeout (30 s).
LATENESS_MS = 20_000


#: The overloaded device's capacity object (docs/protocol.md): full, refusing new requests.
FULL = {"realtime_streams": 2, "running": 2, "waiting": 0, "start_wait_ms": 0, "shed_total": 3}


async def publish_retained(port: int, topic: str, payload: dict[str, Any]) -> None:
    async with aiomqtt.Client("127.0.0.1", port) as client:
        await client.publish(topic, json.dumps(payload).encode(), qos=1, retain=True)


def test_rules_copy_only_shortens_for() -> None:
    """The test copy of the rules differs from the shipped file only in `for:` values."""
    shipped = RULES.read_text(encoding="utf-8")
    copy = shortened_rules(shipped)
    assert copy != shipped
    shipped_lines, copy_lines = shipped.splitlines(), copy.splitlines()
    assert len(shipped_lines) == len(copy_lines)
    for before, after in zip(shipped_lines, copy_lines, strict=True):
        if before != after:
            assert re.fullmatch(r"\s+for: \d+[smh]", before), before
            assert after == re.sub(r"for: .*", f"for: {FOR_IN_TEST}", before)


def shortened_rules(text: str) -> str:
    """The shipped rules with every `for:` set to FOR_IN_TEST."""
    return re.sub(r"^(\s+)for: \S+$", rf"\g<1>for: {FOR_IN_TEST}", text, flags=re.MULTILINE)


def panel_queries() -> list[tuple[str, str, bool]]:
    """(where, expression, instant) of every target of every dashboard panel, with the
    dashboard variables substituted as Grafana would."""
    queries = []
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        items = [p for item in dashboard["panels"] for p in [item, *item.get("panels", [])]]
        for item in items:
            for target in item.get("targets", []):
                expr = target["expr"].replace("$device", OVERLOADED)
                expr = expr.replace("$__rate_interval", RATE_INTERVAL)
                assert "$" not in expr, expr
                where = f"{path.stem} / {item['title']} / {target['refId']}"
                queries.append((where, expr, bool(target.get("instant"))))
    return queries


def returns_data(api: str, expr: str, instant: bool) -> bool:
    """Whether a panel's query has at least one series, as Grafana would ask for it."""
    if instant:
        return bool(get_json(f"{api}/query", query=expr)["result"])
    end = time.time()
    data = get_json(
        f"{api}/query_range", query=expr, start=str(end - PANEL_RANGE_S), end=str(end), step="1"
    )
    return any(series["values"] for series in data["result"])


def underrun_alerts(api: str) -> dict[str, str]:
    """EdgemonUnderruns' alerts now: device → state (pending or firing)."""
    states: dict[str, str] = {}
    for group in get_json(f"{api}/rules", type="alert")["groups"]:
        for rule in group["rules"]:
            if rule["name"] == "EdgemonUnderruns":
                for alert in rule["alerts"]:
                    states[alert["labels"]["device"]] = alert["state"]
    return states


def rule_health(api: str) -> dict[str, str]:
    """Every rule's name → health (`ok`, `err` or `unknown` before its first evaluation)."""
    return {
        rule["name"]: rule["health"]
        for group in get_json(f"{api}/rules")["groups"]
        for rule in group["rules"]
    }


def test_stack_dashboards_rules_and_underrun_alert(
    private_broker: Broker, tmp_path: Path, servers: Servers
) -> None:
    """With real Mosquitto, edgemon, simulator and Prometheus: every dashboard expression
    returns data, every rule has health `ok`, EdgemonUnderruns fires for the overloaded
    device and not for the healthy one, which has had no underrun. The underruns are counted
    on the devices' own times (`t_ms`), whenever the messages arrive: `allowed_lateness_ms`
    (`LATENESS_MS`) outlasts any stall of this machine, so a device's next message, not
    edgemon's clock, confirms an underrun."""
    require_tool("prometheus")
    broker_port = private_broker.port  # the stack as deployed: edgemon's default prefix
    edgemon_port, prometheus_port = free_port(), free_port()
    config = tmp_path / "edgemon.toml"
    config.write_text(
        f'[mqtt]\nurl = "mqtt://127.0.0.1:{broker_port}"\nclient_id = "edgemon-e2e"\n'
        f'[http]\nlisten = "127.0.0.1:{edgemon_port}"\n[limits]\nper_stream_series = 20\n'
        f'[log]\nformat = "json"\n[state]\ndir = "{tmp_path}"\n'
        f"[slack]\nallowed_lateness_ms = {LATENESS_MS}\n",
        encoding="utf-8",
    )
    rules = tmp_path / "edgemon.rules.yml"
    rules.write_text(shortened_rules(RULES.read_text(encoding="utf-8")), encoding="utf-8")
    prometheus_config = tmp_path / "prometheus.yml"
    prometheus_config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files:\n  - {rules}\n"
        "scrape_configs:\n  - job_name: edgemon\n    scrape_timeout: 900ms\n"
        f'    static_configs:\n      - targets: ["127.0.0.1:{edgemon_port}"]\n',
        encoding="utf-8",
    )
    api = f"http://127.0.0.1:{prometheus_port}/api/v1"
    started = time.monotonic()
    try:
        servers.spawn("edgemon", sys.executable, "-m", "edgemon", "run", "--config", str(config))
        servers.wait_until("edgemon", lambda: reachable(f"http://127.0.0.1:{edgemon_port}/readyz"))
        # The simulator publishes no capacity object: the overloaded device's engine says it
        # is full, as its scheduler would (docs/protocol.md).
        asyncio.run(publish_retained(broker_port, f"edgemon/v1/{OVERLOADED}/capacity", FULL))
        servers.spawn(
            "simulate", sys.executable, "-m", "edgemon", "simulate",
            "--broker", f"mqtt://127.0.0.1:{broker_port}", "--devices", "2", "--streams", "2",
            "--rtf", "0.1,1.2", "--duration", str(DEADLINE_S + 30), "--seed", "1",
        )  # fmt: skip
        servers.spawn(
            "prometheus", PROMETHEUS, f"--config.file={prometheus_config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prometheus_port}", "--log.level=warn",
        )  # fmt: skip
        servers.wait_until(
            "prometheus", lambda: reachable(f"http://127.0.0.1:{prometheus_port}/-/ready")
        )

        queries = panel_queries()
        without_data = {where for where, _, _ in queries}
        health: dict[str, str] = {}
        alerts: dict[str, str] = {}
        deadline = time.monotonic() + DEADLINE_S
        first: dict[str, float] = {}  # when each condition first held, for the report line
        while time.monotonic() < deadline:
            for where, expr, instant in queries:
                if where in without_data and returns_data(api, expr, instant):
                    without_data.discard(where)
            health = rule_health(api)
            alerts = underrun_alerts(api)
            now = time.monotonic() - started
            if not without_data:
                first.setdefault("all panels have data", round(now, 1))
            if health and all(state == "ok" for state in health.values()):
                first.setdefault("all rules ok", round(now, 1))
            if alerts.get(OVERLOADED) == "firing":
                first.setdefault("underrun alert firing", round(now, 1))
            done = (
                time.monotonic() - started >= MIN_SCENARIO_S
                and not without_data
                and health
                and all(state == "ok" for state in health.values())
                and alerts.get(OVERLOADED) == "firing"
            )
            if done:
                break
            servers.assert_running()
            time.sleep(1)
        elapsed = time.monotonic() - started
        underruns = {
            sample["metric"]["device"]: float(sample["value"][1])
            for sample in get_json(f"{api}/query", query="edgemon_underruns_total")["result"]
        }
        alerts = underrun_alerts(api)
        firing = sorted(
            f"{alert['labels']['alertname']}{{device={alert['labels'].get('device', '')}}}"
            for alert in get_json(f"{api}/alerts")["alerts"]
            if alert["state"] == "firing"
        )
        print(f"after {elapsed:.1f} s: underruns {underruns}; firing {firing}; first {first}")
    finally:
        servers.stop_all()
    assert not without_data, "panels without data:\n" + "\n".join(
        f"{where}: {expr}" for where, expr, _ in queries if where in without_data
    )
    shipped = RULES.read_text(encoding="utf-8")
    assert len(health) == len(re.findall(r"^\s+- (?:alert|record): ", shipped, re.MULTILINE))
    assert all(state == "ok" for state in health.values()), health
    assert alerts.get(OVERLOADED) == "firing", (alerts, underruns)
    assert underruns[OVERLOADED] > 0
    assert HEALTHY not in alerts, (alerts, underruns)
    assert underruns[HEALTHY] == 0
