"""deploy/fleet checked by the real tools: the box agent's config (`promtool check config`), the
fleet rules (`promtool check rules`, their unit tests, `vmalert -dryRun`), Alertmanager's config
(`amtool check-config`), the vmalert unit (`systemd-analyze verify`), the load balancer's
config (`haproxy -c`); and the fleet rules kept in step with the single-box ones: the same
rules, each aggregation keeping `box`, nothing else.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tools import require_tool

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
FLEET = ROOT / "deploy" / "fleet"
CENTRAL = FLEET / "central"
FLEET_RULES = CENTRAL / "edgemon-fleet.rules.yml"
BOX_RULES = ROOT / "deploy" / "prometheus" / "edgemon.rules.yml"
RUNBOOK = ROOT / "docs" / "runbook.md"
#: The alerts only a fleet has.
FLEET_ONLY = {"EdgemonUplinkStale"}


def tool(name: str) -> str:
    """The path of `name`; skips the test where it is not installed (`require_tool`)."""
    return require_tool(name)


def run(*argv: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run a checker; fail with its whole output unless it exits 0."""
    done = subprocess.run(  # noqa: PLW1510 - the return code is asserted below
        argv, cwd=cwd, capture_output=True, timeout=60, env=env
    )
    output = (done.stdout + done.stderr).decode()
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{output}"
    return output


def rules(path: Path) -> dict[str, str]:
    """Each rule's expression (whitespace folded), by alert or record name."""
    text = path.read_text(encoding="utf-8")
    found = re.findall(
        r"^\s+- (?:alert|record): (\S+)\n(?:\s+#.*\n)*\s+expr: (\|\n(?:\s{10,}.*\n)+|.*\n)",
        text,
        flags=re.MULTILINE,
    )
    return {name: " ".join(expr.removeprefix("|").split()) for name, expr in found}


def test_agent_config_is_valid() -> None:
    """`promtool check config` accepts box/prometheus.yml with EDGEMON_BOX set; it adds the
    `box` external label, drops the per-stream series (not the per-device histogram
    `edgemon_stream_longest_gap_seconds`) and remote-writes."""
    run(
        tool("promtool"), "check", "config", "prometheus.yml",
        cwd=FLEET / "box", env={**os.environ, "EDGEMON_BOX": "box-0001"},
    )  # fmt: skip
    text = (FLEET / "box" / "prometheus.yml").read_text(encoding="utf-8")
    assert "box: ${EDGEMON_BOX}" in text
    assert re.search(
        r"regex: edgemon_stream_\(playback_slack\|headroom\)_seconds\n\s+action: drop", text
    )
    assert "remote_write:" in text
    default = (FLEET / "box" / "prometheus.default").read_text(encoding="utf-8")
    assert "--enable-feature=agent,expand-external-labels" in default
    assert "--storage.agent.retention.max-time=" in default


def test_fleet_rules_pass_promtool_and_their_unit_tests() -> None:
    """`promtool check rules` and `promtool test rules` pass on the fleet rules: boxes kept
    apart, EdgemonDown per box, EdgemonUplinkStale for a silent box only, EdgemonAbsent."""
    promtool = tool("promtool")
    run(promtool, "check", "rules", FLEET_RULES.name, cwd=CENTRAL)
    run(promtool, "test", "rules", "edgemon-fleet.rules.test.yml", cwd=CENTRAL)


def test_vmalert_dry_run_accepts_the_rules_and_rejects_a_broken_copy(tmp_path: Path) -> None:
    """`vmalert -dryRun` (the evaluator the fleet runs) loads the rules and their templates;
    it rejects a copy with a single-box-only field (`keep_firing_for`, unknown to 1.79)."""
    vmalert = tool("vmalert")
    run(vmalert, "-dryRun", f"-rule={FLEET_RULES}", cwd=tmp_path)
    broken = tmp_path / "broken.yml"
    broken.write_text(
        FLEET_RULES.read_text(encoding="utf-8").replace(
            "        for: 5m\n", "        for: 5m\n        keep_firing_for: 2m\n", 1
        ),
        encoding="utf-8",
    )
    done = subprocess.run(
        [vmalert, "-dryRun", f"-rule={broken}"], capture_output=True, timeout=60, check=False
    )
    assert done.returncode != 0
    assert b"keep_firing_for" in done.stdout + done.stderr


def test_fleet_rules_are_the_single_box_rules_grouped_by_box() -> None:
    """Every single-box rule is in the fleet file, its expression the single-box one with
    `box` added to each `by (...)` and `on (...)` and nothing else changed; the only extra is
    the fleet's own alert, and no `keep_firing_for:` (which Debian's vmalert rejects) is
    left."""
    box, fleet = rules(BOX_RULES), rules(FLEET_RULES)
    assert len(box) == 20
    assert fleet.keys() == box.keys() | FLEET_ONLY
    for name, expr in box.items():
        grouped = expr.replace("by (", "by (box, ").replace("on (", "on (box, ")
        assert fleet[name] == grouped, name
    for name in FLEET_ONLY:
        assert "max by (box)" in fleet[name]
    text = FLEET_RULES.read_text(encoding="utf-8")
    assert not re.search(r"^\s+keep_firing_for:", text, flags=re.MULTILINE)


def test_fleet_alerts_have_runbook_sections() -> None:
    """Each fleet alert's runbook_url names a section of docs/runbook.md."""
    runbook = RUNBOOK.read_text(encoding="utf-8")
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")
        for heading in re.findall(r"^## (.+)$", runbook, flags=re.MULTILINE)
    }
    urls = re.findall(r"runbook_url: docs/runbook\.md#(\S+)", FLEET_RULES.read_text("utf-8"))
    assert len(urls) == 11
    assert set(urls) <= anchors, set(urls) - anchors


def test_alertmanager_config_is_valid() -> None:
    """`amtool check-config` accepts alertmanager.yml; alerts are grouped per box."""
    output = run(tool("amtool"), "check-config", "alertmanager.yml", cwd=CENTRAL)
    assert "SUCCESS" in output
    assert "group_by: [alertname, box]" in (CENTRAL / "alertmanager.yml").read_text("utf-8")


def test_vmalert_unit_is_valid(tmp_path: Path) -> None:
    """`systemd-analyze verify` loads vmalert.service without a complaint about it."""
    analyze = tool("systemd-analyze")
    unit = tmp_path / "vmalert.service"
    unit.write_text((CENTRAL / "vmalert.service").read_text(encoding="utf-8"), encoding="utf-8")
    done = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, timeout=60, check=False
    )
    complaints = [
        line
        for line in (done.stdout + done.stderr).decode().splitlines()
        if "vmalert.service" in line
    ]
    assert not complaints, complaints


def test_haproxy_config_is_valid_and_routes_around_a_full_box(tmp_path: Path) -> None:
    """`haproxy -c` accepts deploy/fleet/haproxy.cfg, and rejects a copy with a misspelt
    retry condition; the config retries a refused request on another box at every retry
    (503, connection failures), weighs each box by its edgemon's agent check every second
    and checks the engine's health."""
    haproxy = tool("haproxy")
    config = FLEET / "haproxy.cfg"
    run(haproxy, "-c", "-f", str(config), cwd=tmp_path)
    text = config.read_text(encoding="utf-8")
    for line in (
        "retry-on 503 conn-failure empty-response",
        "option redispatch 1",
        "option http-buffer-request",
        "balance leastconn",
        "option httpchk GET /health",
        "http-error status 503 content-type application/json hdr Retry-After 1 string",
    ):
        assert re.search(rf"^\s+{re.escape(line)}( .*)?$", text, flags=re.MULTILINE), line
    assert re.search(r"^\s+retries [1-9]$", text, flags=re.MULTILINE)
    servers = re.findall(r"^\s+server (\S+) \S+$", text, flags=re.MULTILINE)
    assert len(servers) >= 2
    default = re.search(r"^\s+default-server (.*)$", text, flags=re.MULTILINE)
    assert default is not None
    words = f" {default.group(1)} "
    for option in ("check", "agent-check", "agent-port 9858", "agent-inter 1s"):
        assert f" {option} " in words, option
    broken = tmp_path / "broken.cfg"
    broken.write_text(text.replace("retry-on 503", "retry-on 599"), encoding="utf-8")
    done = subprocess.run(
        [haproxy, "-c", "-f", str(broken)], capture_output=True, timeout=60, check=False
    )
    assert done.returncode != 0
