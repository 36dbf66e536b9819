"""The shipped Mosquitto (`deploy/mosquitto/mosquitto.conf` and `acl`) on a free port, written
once for the tests of the shipped files and for `benchmarks/hostile.py`.

`adapt` changes only what a test must (port, persistence directory, password file, ACL path,
log, pid file, user) and fails if one of them is missing from the shipped config;
`write_passwords` makes a password file with `mosquitto_passwd`; `launch_shipped` starts the
broker. It does not know pytest: a fixture turns `MosquittoStartError` into a failure.
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
    from collections.abc import Mapping

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
