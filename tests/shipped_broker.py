"""The shipped Mosquitto (`deploy/mosquitto/mosquitto.conf` and `acl`) on a free port, written
once for the tests of the shipped files and for `benchmarks/hostile.py`.

`adapt` changes only what a test must (port, persistence directory, password file, ACL path,
log, pid file, user) and fails if one of them is missing from the shipped config;
`with_websockets` uncomments the web players' wss:// listener on a port of the test's with its
certificate; `write_passwords` makes a password file with `mosquitto_passwd`; `launch_shipped`
starts the broker, `launch_shipped_with_websockets` with that listener too. It does not know
pytest: a fixture turns `MosquittoStartError` into a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from brokers import launch_mosquitto

if TYPE_CHECKING:
    import subprocess as sp
    from collections.abc import Mapping, Sequence

DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "mosquitto"
CONF = DEPLOY / "mosquitto.conf"
ACL = DEPLOY / "acl"
MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"


def adapt(text: str, *, port: int, directory: Path, acl: Path = ACL) -> str:
    """The shipped config with what a test must change; AssertionError if one is missing."""
    replacements = {
        "listener": f"listener {port} 127.0.0.1",
        "persistence_location": f"persistence_location {directory}/",
        "password_file": f"password_file {directory / 'passwd'}",
        "acl_file": f"acl_file {acl}",
        "log_dest": "log_dest stderr",
        "pid_file": "",
        # As root mosquitto switches to "mosquitto", which cannot write into the directory.
        "user": "user root" if os.geteuid() == 0 else "",
    }
    seen: set[str] = set()
    lines = []
    for line in text.splitlines():
        name = line.strip().partition(" ")[0]
        if name in replacements:
            if name in seen:
                raise AssertionError(f"{name} appears twice in mosquitto.conf: adapt the test")
            seen.add(name)
            line = replacements[name]  # noqa: PLW2901
        lines.append(line)
    if seen != set(replacements):
        raise AssertionError(f"missing in mosquitto.conf: {set(replacements) - seen}")
    return "\n".join(lines) + "\n"


#: The commented wss:// listener of the shipped config: its lines, from `listener` on.
WEBSOCKET_BLOCK = (
    "#listener 8884 0.0.0.0",
    "#protocol websockets",
    "#certfile",
    "#keyfile",
    "#tls_version",
)


def with_websockets(text: str, *, port: int, cert: Path, key: Path) -> str:
    """The config with its commented web players' listener uncommented, on 127.0.0.1:`port`
    with this certificate and key; AssertionError if the block is not as shipped."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(WEBSOCKET_BLOCK[0])]
    if len(starts) != 1:
        raise AssertionError(
            f"mosquitto.conf has not one {WEBSOCKET_BLOCK[0]!r} line: adapt the test"
        )
    at = starts[0]
    block = lines[at : at + len(WEBSOCKET_BLOCK)]
    if not all(line.startswith(head) for line, head in zip(block, WEBSOCKET_BLOCK, strict=True)):
        raise AssertionError(f"the wss:// listener of mosquitto.conf is not {WEBSOCKET_BLOCK}")
    active = [line[1:] for line in block]
    active[0] = f"listener {port} 127.0.0.1"
    active[2] = f"certfile {cert}"
    active[3] = f"keyfile {key}"
    return "\n".join([*lines[:at], *active, *lines[at + len(block) :]]) + "\n"


def write_passwords(path: Path, passwords: Mapping[str, str]) -> Path:
    """A Mosquitto password file at `path` holding these users (`mosquitto_passwd -b`)."""
    for index, (user, password) in enumerate(passwords.items()):
        create = ["-c"] if index == 0 else []
        subprocess.run(
            [MOSQUITTO_PASSWD, "-b", *create, str(path), user, password],
            check=True,
            capture_output=True,
        )
    return path


def launch_shipped(
    directory: Path, passwords: Mapping[str, str], *, acl: Path = ACL
) -> tuple[sp.Popen[bytes], int]:
    """The shipped config and `acl` (the shipped ACL unless given) on a free port, with these
    users: (process, port). Persistence and the log are in `directory`."""
    write_passwords(directory / "passwd", passwords)
    process, (port,) = launch_mosquitto(
        directory,
        lambda ports: adapt(CONF.read_text(), port=ports[0], directory=directory, acl=acl),
    )
    return process, port


def launch_shipped_with_websockets(
    directory: Path, passwords: Mapping[str, str], *, cert: Path, key: Path
) -> tuple[sp.Popen[bytes], int, int]:
    """`launch_shipped` with the web players' wss:// listener uncommented too:
    (process, MQTT port, wss:// port)."""
    write_passwords(directory / "passwd", passwords)

    def config(ports: Sequence[int]) -> str:
        text = adapt(CONF.read_text(), port=ports[0], directory=directory)
        return with_websockets(text, port=ports[1], cert=cert, key=key)

    process, (port, wss_port) = launch_mosquitto(directory, config, listeners=2)
    return process, port, wss_port
