"""A throw-away PKI made by `openssl`, written once for the TLS tests (tests/test_security.py)
and the web player's wss:// listener (tests/test_browser_reporter.py): a CA, a server
certificate for 127.0.0.1 (and `localhost`), a client certificate signed by it, and an
unrelated CA that signed nothing. EC P-256 keys: fast to make."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tools import require_tool

if TYPE_CHECKING:
    from pathlib import Path


@dataclass(frozen=True)
class Pki:
    """A CA, a server certificate for 127.0.0.1 and a client certificate signed by it, and an
    unrelated CA that signed nothing here."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path


def _openssl(*args: str) -> None:
    openssl = require_tool("openssl")
    subprocess.run([openssl, *args], check=True, capture_output=True, timeout=30)


def _new_key_and_request(key: Path, request: Path, subject: str) -> None:
    _openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(key), "-out", str(request), "-subj", subject,
    )  # fmt: skip


def _self_signed_ca(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-days", "2", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert),
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return cert, key


def _signed(
    directory: Path, name: str, subject: str, extensions: str, ca: tuple[Path, Path]
) -> tuple[Path, Path]:
    key, request, cert = (directory / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
    ext_file = directory / f"{name}.ext"
    ext_file.write_text(extensions, encoding="utf-8")
    _new_key_and_request(key, request, subject)
    _openssl(
        "x509", "-req", "-in", str(request), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
        "-CAcreateserial", "-days", "2", "-out", str(cert), "-extfile", str(ext_file),
    )  # fmt: skip
    return cert, key


def make_pki(directory: Path) -> Pki:
    """A new PKI in `directory`."""
    ca = _self_signed_ca(directory, "edgemon-test-ca")
    other_ca, _ = _self_signed_ca(directory, "someone-else-ca")
    server = _signed(
        directory, "server", "/CN=127.0.0.1",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n", ca,
    )  # fmt: skip
    client = _signed(directory, "client", "/CN=edgemon-client", "extendedKeyUsage=clientAuth\n", ca)
    return Pki(ca[0], server[0], server[1], client[0], client[1], other_ca)
