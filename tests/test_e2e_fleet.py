"""A fleet of three edge boxes and a central store, real programs only (docs/fleet.md).

Each box: its own Mosquitto, `edgemon run`, `edgemon simulate` (one device, two streams;
`box-b` overloaded at RTF 1.2, the others at 0.1) and Prometheus in agent mode with the shipped
deploy/fleet/box/prometheus.yml and the flags of box/prometheus.default. Central: VictoriaMetrics,
vmalert with deploy/fleet/central/edgemon-fleet.rules.yml, Alertmanager with the shipped
alertmanager.yml, each with the flags of its shipped /etc/default file. `box-a` writes to the
central store through a TCP relay the test can cut (its uplink); `box-b` also has a second
device whose engine object says its KV cache would preempt.

The test copies differ from the shipped files only where production values would not elapse
within a test (each substitution must match once, and `test_copies_change_only_timings` shows
what changes): 1 s scrapes and rule evaluation instead of 15 s and 30 s, `for:` 3 s, the stale
window 5 s instead of 5 minutes, a 1 s remote-write batch deadline and backoff ceiling, a 1 s
query latency offset, loopback ports and temporary directories.

Proven, in order on one running fleet: every query of the boxes dashboard returns data for all
three boxes (asked of VictoriaMetrics' Prometheus API as Grafana would); EdgemonUnderruns
reaches Alertmanager (API v2) for the overloaded box only, and only box-b's KV panel bar is
non-zero; cutting box-a's uplink for `CUT_S` raises EdgemonUplinkStale for it, and once the link
is back every series of box-a holds a sample at every scrape instant across the cut (none lost);
killing box-c's edgemon raises EdgemonDown for box-c only in Alertmanager.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import shlex
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiomqtt
import pytest

from ports import MosquittoServer, Servers, TcpProxy, free_port, get_json, reachable
from tools import require_tool, tool_path

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
FLEET = ROOT / "deploy" / "fleet"
BOXES_DASHBOARD = ROOT / "dashboards" / "edgemon-boxes.json"
PROGRAMS = {
    name: tool_path(name)
    for name in ("prometheus", "victoria-metrics", "vmalert", "prometheus-alertmanager")
}

BOXES = ("box-a", "box-b", "box-c")
CUT, OVERLOADED, KILLED = BOXES
RTF = {"box-a": "0.1", "box-b": "1.2", "box-c": "0.1"}
#: A device on the overloaded box whose engine would preempt (28 layers × 8 KV heads × 128,
#: 1 GiB of KV cache: 2 full 4096-token sequences fit, 64 are asked for).
UNSAFE_DEVICE = "gpu-unsafe"
UNSAFE_ENGINE = {
    "kv_cache_bytes": 2**30,
    "max_num_seqs": 64,
    "max_model_len": 4096,
    "geometry": {"num_layers": 28, "num_kv_heads": 8, "head_dim": 128},
}
SCRAPE_MS = 1000
CUT_S = 12.0
#: Run this long before judging the healthy boxes' silence (they must have had streams enough).
MIN_SCENARIO_S = 30.0
PHASE_TIMEOUT_S = 90.0
#: Grafana's variables as the test asks: every box, short rate windows, the last minute.
VARIABLES = {"$box": ".*", "$__rate_interval": "15s", "$__range": "60s"}
PANEL_RANGE_S = 30
#: Series that are absent while a device has no live stream (runbook.md): gaps there are not loss.
COME_AND_GO = {"edgemon_headroom_min_seconds", "edgemon_playback_slack_min_seconds"}


# ---------------------------------------------------------------------- the test copies
def substitute(text: str, pairs: list[tuple[str, str]]) -> str:
    """`text` with each (regex, replacement) applied; each must match exactly once."""
    for pattern, replacement in pairs:
        text, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
        assert count == 1, f"{pattern!r} matched {count} times"
    return text


def agent_config(edgemon_port: int, write_port: int) -> str:
    return substitute(
        (FLEET / "box" / "prometheus.yml").read_text(encoding="utf-8"),
        [
            (r"scrape_interval: 15s$", "scrape_interval: 1s"),
            (r"scrape_timeout: 10s$", "scrape_timeout: 900ms"),
            (r'"localhost:9857"', f'"127.0.0.1:{edgemon_port}"'),
            (r"url: https://metrics\.example\.net/", f"url: http://127.0.0.1:{write_port}/"),
            (r"batch_send_deadline: 5s$", "batch_send_deadline: 1s"),
            (r"max_backoff: 30s$", "max_backoff: 1s"),
        ],
    )


def fleet_rules() -> str:
    text = (FLEET / "central" / "edgemon-fleet.rules.yml").read_text(encoding="utf-8")
    text = re.sub(r"^(\s+)for: \d+[smh]$", r"\g<1>for: 3s", text, flags=re.MULTILINE)
    text = re.sub(r"^(\s+)interval: 30s$", r"\g<1>interval: 1s", text, flags=re.MULTILINE)
    stale = r'count_over_time\(up\{job="edgemon"\}\[5m\]\)'
    return substitute(text, [(stale, 'count_over_time(up{job="edgemon"}[5s])')])


def alertmanager_config(webhook_port: int) -> str:
    text = (FLEET / "central" / "alertmanager.yml").read_text(encoding="utf-8")
    return text.replace("127.0.0.1:9095", f"127.0.0.1:{webhook_port}")


def shipped_args(name: str, **overrides: str) -> list[str]:
    """The flags of a shipped /etc/default file's ARGS, with `overrides` (flag name without
    leading dashes, other dashes and dots as `_`, → value) replacing flags it has; each
    override must replace one."""
    text = (FLEET / name).read_text(encoding="utf-8")
    match = re.search(r'^ARGS="(.*)"$', text, flags=re.MULTILINE)
    assert match is not None
    args, used = [], set()
    for arg in shlex.split(match.group(1)):
        flag = arg.split("=", 1)[0]
        key = flag.lstrip("-").replace(".", "_").replace("-", "_")
        if key in overrides:
            used.add(key)
        args.append(f"{flag}={overrides[key]}" if key in overrides else arg)
    assert used == overrides.keys(), f"{name} has no {sorted(overrides.keys() - used)}"
    return args


def test_copies_change_only_timings() -> None:
    """The test's rules differ from the shipped ones only in `for:`, group intervals and the
    stale window; its agent config only in intervals, addresses and the retry ceiling."""
    shipped = (FLEET / "central" / "edgemon-fleet.rules.yml").read_text(encoding="utf-8")
    changed = [
        (before.strip(), after.strip())
        for before, after in zip(shipped.splitlines(), fleet_rules().splitlines(), strict=True)
        if before != after
    ]
    kinds = {re.sub(r"[\d.]+[smh]\b", "N", before) for before, _ in changed}
    assert kinds == {
        "for: N",
        "interval: N",
        'max by (box) (count_over_time(up{job="edgemon"}[N]))',
    }
    agent = agent_config(9857, 8428).splitlines()
    shipped_agent = (FLEET / "box" / "prometheus.yml").read_text(encoding="utf-8").splitlines()
    assert sum(a != b for a, b in zip(agent, shipped_agent, strict=True)) == 6


# ---------------------------------------------------------------------- the fleet
@dataclass(slots=True)
class Fleet:
    servers: Servers
    vm: str
    vmalert: str
    alertmanager: str
    uplink: TcpProxy
    started: float = field(default_factory=time.monotonic)


async def publish_retained(port: int, topic: str, payload: dict[str, Any]) -> None:
    async with aiomqtt.Client("127.0.0.1", port) as client:
        await client.publish(topic, json.dumps(payload).encode(), qos=1, retain=True)


def start_box(
    servers: Servers, brokers: list[MosquittoServer], directory: Path, box: str, write_port: int
) -> None:
    """One box: Mosquitto (added to `brokers` for the caller to stop), edgemon, the simulator
    and the agent writing to `write_port`."""
    directory.mkdir()
    broker = MosquittoServer(directory)
    brokers.append(broker)
    broker.start()
    edgemon_port, agent_port = free_port(), free_port()
    config = directory / "edgemon.toml"
    config.write_text(
        f'[mqtt]\nurl = "{broker.url}"\nclient_id = "edgemon-{box}"\n'
        f'[http]\nlisten = "127.0.0.1:{edgemon_port}"\n[limits]\nper_stream_series = 20\n'
        f'[log]\nformat = "json"\n[state]\ndir = "{directory}"\n',
        encoding="utf-8",
    )
    servers.spawn(f"edgemon-{box}", sys.executable, "-m", "edgemon", "run", "--config", str(config))
    servers.wait_until(
        f"edgemon-{box}", lambda: reachable(f"http://127.0.0.1:{edgemon_port}/readyz")
    )
    servers.spawn(
        f"simulate-{box}", sys.executable, "-m", "edgemon", "simulate", "--broker", broker.url,
        "--devices", "1", "--streams", "2", "--rtf", RTF[box], "--seed", "7",
    )  # fmt: skip
    if box == OVERLOADED:
        topic = f"edgemon/v1/{UNSAFE_DEVICE}/engine"
        asyncio.run(publish_retained(broker.port, topic, UNSAFE_ENGINE))
    agent_yml = directory / "prometheus.yml"
    agent_yml.write_text(agent_config(edgemon_port, write_port), encoding="utf-8")
    args = shipped_args(
        "box/prometheus.default",
        config_file=str(agent_yml),
        storage_agent_path=str(directory / "agent"),
        web_listen_address=f"127.0.0.1:{agent_port}",
    )
    servers.spawn(f"agent-{box}", PROGRAMS["prometheus"], *args, "--log.level=warn",
                  env={"EDGEMON_BOX": box})  # fmt: skip
    servers.wait_until(f"agent-{box}", lambda: reachable(f"http://127.0.0.1:{agent_port}/-/ready"))


@pytest.fixture
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """The three boxes and the central store, running; everything ended afterwards."""
    require_tool(*PROGRAMS, "mosquitto")
    root = tmp_path_factory.mktemp("fleet")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
    servers = Servers(root, env)
    brokers: list[MosquittoServer] = []
    uplink: TcpProxy | None = None
    try:
        vm_port, vmalert_port, am_port = free_port(), free_port(), free_port()
        vm, am = f"http://127.0.0.1:{vm_port}", f"http://127.0.0.1:{am_port}"
        args = shipped_args(
            "central/victoria-metrics.default",
            storageDataPath=str(root / "vm"),
            httpListenAddr=f"127.0.0.1:{vm_port}",
            search_latencyOffset="1s",
        )
        servers.spawn("victoria-metrics", PROGRAMS["victoria-metrics"], *args)
        servers.wait_until("victoria-metrics", lambda: reachable(f"{vm}/health"))
        (root / "alertmanager.yml").write_text(alertmanager_config(free_port()), encoding="utf-8")
        servers.spawn(
            "alertmanager", PROGRAMS["prometheus-alertmanager"],
            f"--config.file={root / 'alertmanager.yml'}", f"--storage.path={root / 'am'}",
            f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address=",
            "--log.level=warn",
        )  # fmt: skip
        servers.wait_until("alertmanager", lambda: reachable(f"{am}/-/ready"))
        (root / "rules.yml").write_text(fleet_rules(), encoding="utf-8")
        args = shipped_args(
            "central/vmalert.default",
            rule=str(root / "rules.yml"),
            datasource_url=vm,
            remoteWrite_url=vm,
            remoteRead_url=vm,
            notifier_url=am,
            evaluationInterval="1s",
            httpListenAddr=f"127.0.0.1:{vmalert_port}",
        )
        servers.spawn("vmalert", PROGRAMS["vmalert"], *args)
        vmalert = f"http://127.0.0.1:{vmalert_port}"
        servers.wait_until("vmalert", lambda: reachable(f"{vmalert}/health"))
        uplink = TcpProxy(vm_port)
        for box in BOXES:
            port = uplink.port if box == CUT else vm_port
            start_box(servers, brokers, root / box, box, port)
        yield Fleet(servers, vm, vmalert, am, uplink)
    finally:
        servers.stop_all()
        if uplink is not None:
            uplink.close()
        for broker in brokers:
            broker.stop()


# ---------------------------------------------------------------------- asking the store
def panel_queries() -> list[tuple[str, str, bool]]:
    """(title, expression, instant) of every target of the boxes dashboard, variables set."""
    dashboard = json.loads(BOXES_DASHBOARD.read_text(encoding="utf-8"))
    queries = []
    for item in dashboard["panels"]:
        for target in item.get("targets", []):
            expr = target["expr"]
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            assert "$" not in expr, expr
            queries.append(
                (f"{item['title']} / {target['refId']}", expr, bool(target.get("instant")))
            )
    return queries


def boxes_with_data(vm: str, expr: str, instant: bool) -> set[str]:
    """The boxes a panel's query returns data for, asked as Grafana would."""
    api = f"{vm}/api/v1"
    if instant:
        result = get_json(f"{api}/query", query=expr, nocache="1")["result"]
        return {series["metric"].get("box", "") for series in result}
    end = time.time()
    result = get_json(
        f"{api}/query_range", query=expr, start=str(end - PANEL_RANGE_S), end=str(end),
        step="1", nocache="1",
    )["result"]  # fmt: skip
    return {series["metric"].get("box", "") for series in result if series["values"]}


def instant_by_box(vm: str, expr: str) -> dict[str, float]:
    result = get_json(f"{vm}/api/v1/query", query=expr, nocache="1")["result"]
    return {series["metric"]["box"]: float(series["value"][1]) for series in result}


def alertmanager_alerts(am: str, name: str) -> dict[str, str]:
    """Alertmanager's alerts named `name` now (API v2): box → state."""
    with urllib.request.urlopen(f"{am}/api/v2/alerts", timeout=10) as response:
        alerts = json.load(response)
    return {
        alert["labels"].get("box", ""): alert["status"]["state"]
        for alert in alerts
        if alert["labels"]["alertname"] == name
    }


def vmalert_alerts(vmalert: str, name: str) -> dict[str, str]:
    """vmalert's alerts named `name` now: box → state (pending or firing)."""
    alerts = get_json(f"{vmalert}/api/v1/alerts")["alerts"] or []
    return {a["labels"].get("box", ""): a["state"] for a in alerts if a["name"] == name}


def export(vm: str, match: str, start: float, end: float) -> dict[str, list[int]]:
    """Raw samples of every series matching `match` in [start, end]: series → sorted distinct
    timestamps (ms). A batch resent after a cut may store a sample twice; that is no loss."""
    query = urllib.parse.urlencode({"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"})
    series: dict[str, list[int]] = {}
    with urllib.request.urlopen(f"{vm}/api/v1/export?{query}", timeout=30) as response:
        for line in response:
            item = json.loads(line)
            key = json.dumps(item["metric"], sort_keys=True)
            series[key] = sorted(set(item["timestamps"]) | set(series.get(key, [])))
    return series


def scrape_gaps(vm: str, box: str, start: float, end: float) -> list[int]:
    """The gaps (ms) between box `box`'s consecutive scrapes in [start, end], as its `up`
    series holds them; the window's edges count as scrapes (a missing first or last one is a
    gap too)."""
    series = export(vm, f'{{box="{box}",job="edgemon",__name__="up"}}', start, end)
    scrapes = [round(start * 1000), *(ts for stamps in series.values() for ts in stamps)]
    scrapes.append(round(end * 1000))
    return [b - a for a, b in itertools.pairwise(sorted(scrapes))]


def losses(vm: str, box: str, start: float, end: float, longest_gap_ms: float) -> list[str]:
    """What box `box` lost in [start, end]: the `up` series must have one sample per scrape,
    no gap longer than `longest_gap_ms` (a late scrape is not a lost one), and every other
    scraped series present from the start must have a sample at each of those instants."""
    match = f'{{box="{box}",job="edgemon",__name__!~"ALERTS.*|.*:.*"}}'
    series = export(vm, match, start, end)
    up = [ts for key, ts in series.items() if json.loads(key)["__name__"] == "up"]
    if len(up) != 1 or not up[0]:
        return [f"no single up series for {box}: {len(up)}"]
    scrapes = up[0]
    problems = []
    gaps = [gap for gap in scrape_gaps(vm, box, start, end) if gap > longest_gap_ms]
    if gaps:
        problems.append(f"up has gaps {gaps} ms (> {longest_gap_ms:.0f}) over {len(scrapes)}")
    for key, stamps in series.items():
        name = json.loads(key)["__name__"]
        if name in COME_AND_GO or stamps[0] > scrapes[0]:
            continue  # absent without live streams, or created within the window
        missing = sorted(set(scrapes) - set(stamps))
        if missing:
            problems.append(f"{key}: {len(missing)} of {len(scrapes)} samples missing")
    return problems


# ---------------------------------------------------------------------- the test, in phases
def test_fleet_in_three_phases(fleet: Fleet) -> None:
    """One fleet, three phases in this order, each changing it for the next (so they are one
    test, not three that would depend on their order): the panels and the underrun alert on
    the healthy fleet; box-a's uplink cut and restored; box-c's edgemon killed."""
    phase_panels_have_every_box_and_underruns_alert_the_overloaded_box_only(fleet)
    phase_cut_uplink_goes_stale_and_loses_no_samples(fleet)
    phase_killed_edgemon_raises_box_down(fleet)


def phase_panels_have_every_box_and_underruns_alert_the_overloaded_box_only(fleet: Fleet) -> None:
    """Every boxes-dashboard query returns data for box-a, box-b and box-c; EdgemonUnderruns
    reaches Alertmanager for box-b and for no other box (whose devices had no underrun); the
    KV panel counts one preempting device on box-b and none elsewhere; no per-stream series
    reached the store (edgemon exposes them; the agents drop them); no rule errs."""
    queries = panel_queries()
    lacking = {title: set(BOXES) for title, _, _ in queries}
    underruns: dict[str, str] = {}
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while time.monotonic() < deadline:
        fleet.servers.assert_running()
        for title, expr, instant in queries:
            if lacking[title]:
                lacking[title] -= boxes_with_data(fleet.vm, expr, instant)
        underruns = alertmanager_alerts(fleet.alertmanager, "EdgemonUnderruns")
        ran = time.monotonic() - fleet.started
        if ran >= MIN_SCENARIO_S and not any(lacking.values()) and OVERLOADED in underruns:
            break
        time.sleep(1)
    print(f"phase 1 after {time.monotonic() - fleet.started:.1f} s: underruns alert {underruns}")
    assert not any(lacking.values()), {t: sorted(b) for t, b in lacking.items() if b}
    assert underruns.get(OVERLOADED) == "active", underruns
    assert set(underruns) == {OVERLOADED}, underruns
    totals = instant_by_box(fleet.vm, "sum by (box) (edgemon_underruns_total)")
    assert totals[OVERLOADED] > 0, totals
    assert totals[CUT] == totals[KILLED] == 0, totals
    per_stream = 'count by (box) ({__name__=~"edgemon_stream_(playback_slack|headroom)_seconds"})'
    assert instant_by_box(fleet.vm, per_stream) == {}, "per-stream series reached the store"
    preempting = instant_by_box(fleet.vm, "sum by (box) (1 - edgemon_kv_admission_ok)")
    assert preempting == {CUT: 0, OVERLOADED: 1, KILLED: 0}, preempting
    health = {
        rule["name"]: (rule["health"], rule["lastError"])
        for group in get_json(f"{fleet.vmalert}/api/v1/rules")["groups"]
        for rule in group["rules"]
    }
    shipped = (FLEET / "central" / "edgemon-fleet.rules.yml").read_text(encoding="utf-8")
    names = set(re.findall(r"^\s*- (?:alert|record): (\S+)", shipped, flags=re.MULTILINE))
    assert set(health) == names, health
    assert all(state == ("ok", "") for state in health.values()), health


def phase_cut_uplink_goes_stale_and_loses_no_samples(fleet: Fleet) -> None:
    """Cutting box-a's uplink for CUT_S raises EdgemonUplinkStale for box-a; once the link is
    back the agent replays its WAL, the alert resolves, and every series of box-a has a sample
    at every scrape instant across the cut (compared sample by sample over the window).

    A scrape that was late is not lost, so box-a's scrapes may be as far apart as those of
    box-c, whose uplink is never cut, over the same window (what this machine made of a 1 s
    interval, measured outside box-a's path), and 2.5 intervals in any case."""
    start = time.time() - 5
    fleet.uplink.cut()
    cut_at = time.monotonic()
    stale: dict[str, str] = {}
    while time.monotonic() - cut_at < max(CUT_S, PHASE_TIMEOUT_S / 3):
        stale = vmalert_alerts(fleet.vmalert, "EdgemonUplinkStale")
        if stale.get(CUT) == "firing" and time.monotonic() - cut_at >= CUT_S:
            break
        time.sleep(0.5)
    fleet.uplink.restore()
    cut_s = time.monotonic() - cut_at
    end = time.time() + 5
    assert stale.get(CUT) == "firing", stale
    problems: list[str] = ["not checked yet"]
    reference: list[str] = []
    longest_gap_ms = 2.5 * SCRAPE_MS
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while time.monotonic() < deadline:
        time.sleep(1)
        if time.time() < end + 2:
            continue
        longest_gap_ms = max(2.5 * SCRAPE_MS, *scrape_gaps(fleet.vm, KILLED, start, end))
        reference = losses(fleet.vm, KILLED, start, end, longest_gap_ms)
        problems = losses(fleet.vm, CUT, start, end, longest_gap_ms)
        stale = vmalert_alerts(fleet.vmalert, "EdgemonUplinkStale")
        if not problems and CUT not in stale:
            break
    print(
        f"phase 2: uplink cut {cut_s:.1f} s; scrapes up to {longest_gap_ms:.0f} ms apart "
        f"allowed; box-a problems {problems}; box-c {reference}"
    )
    assert CUT not in stale, stale
    assert not problems, problems
    assert not reference, reference


def phase_killed_edgemon_raises_box_down(fleet: Fleet) -> None:
    """SIGKILL of box-c's edgemon: its agent's scrapes fail (`up` 0 over a working uplink) and
    EdgemonDown reaches Alertmanager for box-c, and for no other box."""
    fleet.servers.kill(f"edgemon-{KILLED}")
    down: dict[str, str] = {}
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while time.monotonic() < deadline and KILLED not in down:
        time.sleep(1)
        down = alertmanager_alerts(fleet.alertmanager, "EdgemonDown")
    print(f"phase 3 after {time.monotonic() - fleet.started:.1f} s: EdgemonDown {down}")
    assert down == {KILLED: "active"}, down
