"""HAProxy routes new requests around a full box (docs/fleet.md, "Routing new requests").

Two boxes, real programs only: each its own Mosquitto, `edgemon run` answering HAProxy's
agent check (`[http] agent_listen`, `agent_device`) and a simulated TTS engine behind an HTTP
server (`tests/engine_box.py`: edgemon's simulated engine in real time, real-time capacity
measured as edgemon's schedulers do, a request it cannot start within the start SLO refused
with 503 and Retry-After, its capacity object published for edgemon). In front: HAProxy with
the shipped deploy/fleet/haproxy.cfg, changed only where a test must (loopback addresses,
one agent port per box, no privileges: `test_copy_changes_only_addresses`).

Box A decodes 2 streams in real time, box B 12. Two long requests sent to A directly fill
it. Then, in order:
1. retries: with the agent checks paused (HAProxy's runtime API) and both boxes at full
   weight, HAProxy sends some new requests to A; A refuses each at once (503), HAProxy sends
   it to B: every request is served by B, none lost, each started within the start SLO;
2. weights: with the agents back, A's edgemon answers `up 0%` from A's capacity object and
   B's a positive weight; new requests go to B alone, and A refuses none (HAProxy sends it
   nothing);
3. A's edgemon counts A's refusals (`edgemon_engine_shed_total`) and shows it full
   (`/api/v1/capacity`: no spare stream);
4. with box B filled too, a new request gets 503 with Retry-After (the last box's refusal,
   or HAProxy's own answer once both weights are 0), never a dropped connection (HAProxy's
   retry finding no box left; the shipped config's `no_room` backup answers it).
Every assertion is a count; each wait is for a condition, with a generous deadline.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re
import socket
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest

from ports import MosquittoServer, Servers, free_port, reachable
from scrapes import sample
from tools import require_tool

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
HAPROXY_CFG = ROOT / "deploy" / "fleet" / "haproxy.cfg"
ENGINE_BOX = Path(__file__).resolve().parent / "engine_box.py"
#: Each box's added step time per decoding stream: A decodes 2 streams in real time, B 12.
PER_STREAM_MS = {"box-a": 20.0, "box-b": 4.0}
REALTIME = {"box-a": 2, "box-b": 12}
BACKEND = "engines"
#: Codec frames of a long request (160 s of audio: it runs past the end of the test) and of
#: a short one (2.4 s).
LONG, SHORT = 2000, 30
#: New requests sent through HAProxy in each phase, at once (B has room for all of them).
BURST = 6
START_SLO_MS = 3000.0
WAIT_S = 60.0


# ---------------------------------------------------------------------- the test's copy
def substitute(text: str, pairs: list[tuple[str, str]]) -> str:
    """`text` with each (regex, replacement) applied; each must match exactly once."""
    for pattern, replacement in pairs:
        text, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
        assert count == 1, f"{pattern!r} matched {count} times"
    return text


def haproxy_config(
    directory: Path,
    front: int,
    stats: int,
    servers: dict[str, tuple[int, int]],
    no_room: int,
) -> str:
    """The shipped config on loopback ports: the front end, the stats page, each box's engine
    and agent port (`servers`: box → (engine port, agent port)), HAProxy's own refusal
    (`no_room`); the runtime API's socket in `directory`; no syslog, user switch or daemon
    mode (the test runs it in the foreground)."""
    pairs = [
        (r"^    log /dev/log local0\n", ""),
        (r"^    user haproxy\n", ""),
        (r"^    group haproxy\n", ""),
        (r"^    daemon\n", ""),
        (r"socket /run/haproxy/admin\.sock mode 660", f"socket {directory}/admin.sock mode 600"),
        (r"bind :8080$", f"bind 127.0.0.1:{front}"),
        (r"bind 127\.0\.0\.1:8404$", f"bind 127.0.0.1:{stats}"),
        (r"127\.0\.0\.1:8081 backup", f"127.0.0.1:{no_room} backup"),
        (r"bind 127\.0\.0\.1:8081$", f"bind 127.0.0.1:{no_room}"),
    ]  # fmt: skip
    for box, (engine, agent) in servers.items():
        line = f"    server {box} 127.0.0.1:{engine} agent-port {agent}"
        pairs.append((rf"^    server {box} \S+$", line))
    return substitute(HAPROXY_CFG.read_text(encoding="utf-8"), pairs)


def test_copy_changes_only_addresses(tmp_path: Path) -> None:
    """The test's HAProxy config differs from the shipped one only in addresses and ports,
    the runtime API's socket and the lines a foreground, unprivileged run cannot keep; every
    routing line (retries, redispatch, balance, checks, agent interval) is the shipped one."""
    shipped = HAPROXY_CFG.read_text(encoding="utf-8").splitlines()
    copy = haproxy_config(tmp_path, 1, 2, {"box-a": (3, 4), "box-b": (5, 6)}, 7).splitlines()
    assert [line for line in shipped if line not in copy] == [
        "    log /dev/log local0",
        "    stats socket /run/haproxy/admin.sock mode 660 level admin",
        "    user haproxy",
        "    group haproxy",
        "    daemon",
        "    bind :8080",
        "    server box-a 192.0.2.11:8000",
        "    server box-b 192.0.2.12:8000",
        "    server no-room 127.0.0.1:8081 backup no-check no-agent-check",
        "    bind 127.0.0.1:8081",
        "    bind 127.0.0.1:8404",
    ]


# ---------------------------------------------------------------------- the fleet
@dataclass(slots=True)
class Box:
    engine: str
    edgemon: str


@dataclass(slots=True)
class Fleet:
    servers: Servers
    front: str
    socket: Path
    boxes: dict[str, Box]


def start_box(
    servers: Servers, brokers: list[MosquittoServer], directory: Path, box: str
) -> tuple[Box, int, int]:
    """One box: Mosquitto (added to `brokers` for the caller to stop), edgemon answering the
    agent check for the box's device, the engine server. (The box, its engine port, its
    agent port.)"""
    directory.mkdir()
    broker = MosquittoServer(directory)
    brokers.append(broker)
    broker.start()
    http, agent, engine = free_port(), free_port(), free_port()
    config = directory / "edgemon.toml"
    config.write_text(
        f'[mqtt]\nurl = "{broker.url}"\nclient_id = "edgemon-{box}"\n'
        f'[http]\nlisten = "127.0.0.1:{http}"\nagent_listen = "127.0.0.1:{agent}"\n'
        f'agent_device = "{box}"\n[log]\nformat = "json"\n',
        encoding="utf-8",
    )
    servers.spawn(f"edgemon-{box}", sys.executable, "-m", "edgemon", "run", "--config", str(config))
    edgemon = f"http://127.0.0.1:{http}"
    servers.wait_until(f"edgemon-{box}", lambda: reachable(f"{edgemon}/readyz"))
    servers.spawn(
        f"engine-{box}", sys.executable, str(ENGINE_BOX), "--port", str(engine),
        "--broker", broker.url, "--device", box, "--per-stream-ms", str(PER_STREAM_MS[box]),
    )  # fmt: skip
    url = f"http://127.0.0.1:{engine}"
    servers.wait_until(f"engine-{box}", lambda: reachable(f"{url}/health"))
    return Box(url, edgemon), engine, agent


@pytest.fixture
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Two boxes and HAProxy in front, running; everything ended afterwards."""
    haproxy = require_tool("haproxy")
    require_tool("mosquitto")
    root = tmp_path_factory.mktemp("haproxy-fleet")
    servers = Servers(root)
    brokers: list[MosquittoServer] = []
    try:
        boxes, ports = {}, {}
        for name in PER_STREAM_MS:
            boxes[name], engine, agent = start_box(servers, brokers, root / name, name)
            ports[name] = (engine, agent)
        front, stats, no_room = free_port(), free_port(), free_port()
        config = root / "haproxy.cfg"
        config.write_text(haproxy_config(root, front, stats, ports, no_room), encoding="utf-8")
        servers.spawn("haproxy", haproxy, "-db", "-f", str(config))
        servers.wait_until("haproxy", lambda: reachable(f"http://127.0.0.1:{stats}/stats"))
        yield Fleet(servers, f"http://127.0.0.1:{front}", root / "admin.sock", boxes)
    finally:
        servers.stop_all()
        for broker in brokers:
            broker.stop()


# ---------------------------------------------------------------------- asking
def runtime_api(path: Path, command: str) -> str:
    """One command to HAProxy's runtime API (its stats socket); the answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(10)
        client.connect(str(path))
        client.sendall(command.encode() + b"\n")
        chunks = []
        while data := client.recv(65536):
            chunks.append(data)
    return b"".join(chunks).decode()


def weights(path: Path) -> dict[str, int]:
    """Each box's weight in HAProxy now (`show stat`)."""
    text = runtime_api(path, "show stat").removeprefix("# ")
    rows = csv.DictReader(io.StringIO(text))
    return {
        row["svname"]: int(row["weight"])
        for row in rows
        if row["pxname"] == BACKEND and row["svname"] in PER_STREAM_MS
    }


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def stats(box: Box) -> dict[str, Any]:
    """The engine server's own tally (`/stats`)."""
    result: dict[str, Any] = get_json(f"{box.engine}/stats")
    return result


async def wait_until(check: Callable[[], bool], what: str) -> None:
    """Poll `check` until it holds, within `WAIT_S`."""
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        await asyncio.sleep(0.1)


@dataclass(slots=True)
class Answer:
    status: int
    box: str
    chunks: int
    done: bool
    start_wait_ms: float | None
    retry_after: str | None


async def ask(session: aiohttp.ClientSession, url: str, frames: int) -> Answer:
    """One streamed request, read to its end."""
    body = {"model": "tts", "prompt": "hello there", "max_tokens": frames, "stream": True}
    async with session.post(f"{url}/v1/completions", json=body) as response:
        chunks, done, wait = 0, False, None
        async for raw in response.content:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                event = json.loads(line.removeprefix("data: "))
                chunks += 1
                wait = event["start_wait_ms"]
        return Answer(
            response.status,
            response.headers.get("X-Box", ""),
            chunks,
            done,
            wait,
            response.headers.get("Retry-After"),
        )


async def hold(session: aiohttp.ClientSession, url: str) -> None:
    """A long request, read until cancelled."""
    await ask(session, url, LONG)


async def burst(session: aiohttp.ClientSession, url: str) -> list[Answer]:
    return list(await asyncio.gather(*(ask(session, url, SHORT) for _ in range(BURST))))


def assert_served_by_b(answers: list[Answer]) -> None:
    """Every request answered 200 by box B, streamed to its end, started within the SLO."""
    assert [(a.status, a.box, a.done) for a in answers] == [(200, "box-b", True)] * BURST
    assert all(a.chunks >= 2 for a in answers)
    waits = [a.start_wait_ms for a in answers]
    assert all(w is not None and w <= START_SLO_MS for w in waits), waits


# ---------------------------------------------------------------------- the test
@pytest.mark.asyncio
async def test_a_full_box_is_routed_around(fleet: Fleet) -> None:
    """A full box refuses at once and HAProxy retries elsewhere; with the agent's weights it
    is not even asked; edgemon counts the refusals and shows the box full (module doc)."""
    a, b = fleet.boxes["box-a"], fleet.boxes["box-b"]
    api = fleet.socket
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as session:
        holders = [asyncio.create_task(hold(session, a.engine)) for _ in range(REALTIME["box-a"])]
        try:
            await wait_until(lambda: stats(a)["capacity"]["running"] == 2, "box A full")
            direct = await ask(session, a.engine, SHORT)
            assert (direct.status, direct.retry_after) == (503, "1")

            # 1. Retries: agents paused, both boxes at full weight.
            for box in PER_STREAM_MS:
                runtime_api(api, f"disable agent {BACKEND}/{box}")

            def full_weights() -> bool:  # again if a check under way when paused set one
                for box in PER_STREAM_MS:
                    runtime_api(api, f"set weight {BACKEND}/{box} 100")
                return weights(api) == {"box-a": 100, "box-b": 100}

            await wait_until(full_weights, "both boxes at full weight")
            refused = stats(a)["refused"]
            assert_served_by_b(await burst(session, fleet.front))
            retried = stats(a)["refused"] - refused
            assert retried >= 1  # HAProxy asked A first for some, and B served them
            assert stats(b)["late"] == 0

            # 2. Weights from the agents: A at 0 %, B above.
            for box in PER_STREAM_MS:
                runtime_api(api, f"enable agent {BACKEND}/{box}")
            await wait_until(
                lambda: (w := weights(api))["box-a"] == 0 and w["box-b"] > 0, "agent weights"
            )
            refused = stats(a)["refused"]
            assert_served_by_b(await burst(session, fleet.front))
            assert stats(a)["refused"] == refused  # HAProxy sent A nothing
            assert weights(api)["box-a"] == 0

            # 3. A's edgemon: every refusal counted, no spare stream.
            total = int(stats(a)["refused"])
            assert total == 1 + retried

            def counted() -> bool:
                text = get_text(f"{a.edgemon}/metrics")
                shed = sample(text, "edgemon_engine_shed_total", {"device": "box-a"})
                return shed == total

            await wait_until(counted, "A's refusals in edgemon_engine_shed_total")
            (entry,) = get_json(f"{a.edgemon}/api/v1/capacity?device=box-a")["devices"]
            assert (entry["spare_streams"], entry["capacity"]["running"]) == (0.0, 2)
            (entry,) = get_json(f"{b.edgemon}/api/v1/capacity?device=box-b")["devices"]
            assert entry["spare_streams"] is not None
            assert entry["spare_streams"] > 0

            # 4. Both boxes full: the client is asked to come back.
            holders += [
                asyncio.create_task(hold(session, b.engine)) for _ in range(REALTIME["box-b"])
            ]
            await wait_until(
                lambda: stats(b)["capacity"]["running"] == REALTIME["box-b"], "box B full"
            )
            refused = await ask(session, fleet.front, SHORT)
            assert (refused.status, refused.retry_after, refused.chunks) == (503, "1", 0)
            await wait_until(lambda: weights(api) == {"box-a": 0, "box-b": 0}, "no weight left")
            refused = await ask(session, fleet.front, SHORT)  # HAProxy's own answer now
            assert (refused.status, refused.retry_after, refused.box) == (503, "1", "")
        finally:
            for task in holders:
                task.cancel()
            await asyncio.gather(*holders, return_exceptions=True)
    fleet.servers.assert_running()
